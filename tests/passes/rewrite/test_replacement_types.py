"""A rewrite never changes the element type or static shape of a value it replaces (issue 15, bug 3).

Case 11-fusion-drops-broadcast-rank: a GELU / HardSwish / LayerNorm whose "scalar" constant has
shape [1,1,8] / [1,1,1] broadcasts a [2,8] input up to [1,2,8]; the fused op would return [2,8].
The rule engine infers the replacement's types from its inputs and refuses it (reason in explain);
the hand-written fusions go through the same guard (``checked_replace``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from helpers import assert_same_outputs

from passctl.ir import DataType, Node, Shape, TensorType, Value, from_onnx, to_onnx
from passctl.passes.manager import PassManager
from passctl.passes.pipeline_text import build_pipeline
from passctl.passes.rewrite import RewriteRule, explain
from passctl.passes.rewrite.types import (ReplacementError, checked_replace, infer_nodes,
                                          replacement_conflict, type_conflict)
from passctl.support.check import run_onnxruntime
from passctl.support.inputs import make_inputs

CASE = Path(__file__).resolve().parents[2] / "cases" / "11-fusion-drops-broadcast-rank"
F = onnx.TensorProto.FLOAT


def _compile(proto: onnx.ModelProto, pipeline: str = "cleanup,fuse"):
    model = from_onnx(proto)
    result = PassManager(build_pipeline(pipeline)).run(model)
    stats = {}
    for r in result.records:
        for k, v in r.stats.items():
            if isinstance(v, int):
                stats[k] = stats.get(k, 0) + v
    return model, stats, to_onnx(model)


def _same_run(original: onnx.ModelProto, artifact: onnx.ModelProto) -> None:
    """Same output shapes and values (1e-5 relative) as ONNX Runtime on the original."""
    feeds = make_inputs(original, seed=0)
    ref = run_onnxruntime(original, feeds)
    got = run_onnxruntime(artifact, feeds)
    for name, want in ref.items():
        assert got[name].shape == want.shape, (name, got[name].shape, want.shape)
    assert_same_outputs(original, artifact, rtol=1e-5)


# The family each case model's fusion counts under, and its rule (for explain).
_CASES = {"gelu": ("gelu", "gelu-erf"), "hardswish": ("hardswish", "hardswish-relu6"),
          "layernorm": ("layernorm", "layernorm-decomposed")}


@pytest.mark.parametrize("name", sorted(_CASES))
def test_case_11_broadcast_rank_is_kept(name):
    proto = onnx.load(CASE / f"{name}.onnx")
    family, rule = _CASES[name]
    _, stats, artifact = _compile(proto)
    assert stats.get(family, 0) == 0
    _same_run(proto, artifact)
    text = explain(rule, from_onnx(proto))
    # The matcher refuses a "scalar" constant that broadcasts its operand up a rank.
    assert "it broadcasts" in text and "(rank 2) up to rank 3" in text, text


def _build(name: str, const_shape):
    """The case's graph with its broadcasting constant given ``const_shape`` (() : a true scalar)."""
    up = lambda v: np.full(const_shape, v, np.float32)  # noqa: E731
    n = oh.make_node
    if name == "gelu":
        nodes = [n("Div", ["x", "s2"], ["d"]), n("Erf", ["d"], ["e"]), n("Add", ["e", "one"], ["a"]),
                 n("Mul", ["x", "a"], ["m"]), n("Mul", ["m", "half"], ["y"])]
        inits = {"s2": np.float32(np.sqrt(2)), "one": np.float32(1), "half": up(0.5)}
    elif name == "hardswish":
        nodes = [n("Add", ["x", "three"], ["a"]), n("Clip", ["a", "lo", "hi"], ["c"]),
                 n("Mul", ["x", "c"], ["m"]), n("Div", ["m", "six"], ["y"])]
        inits = {"three": up(3.0), "lo": np.float32(0), "hi": np.float32(6), "six": np.float32(6)}
    else:
        nodes = [n("ReduceMean", ["x"], ["m"], axes=[-1]), n("Sub", ["x", "m"], ["d"]),
                 n("Pow", ["d", "two"], ["p"]), n("ReduceMean", ["p"], ["v"], axes=[-1]),
                 n("Add", ["v", "eps"], ["ve"]), n("Sqrt", ["ve"], ["sd"]), n("Div", ["d", "sd"], ["y"])]
        inits = {"two": up(2.0), "eps": np.float32(1e-5)}
    out = [1, 2, 8] if len(const_shape) == 3 else [2, 8]
    g = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", F, [2, 8])],
                      [oh.make_tensor_value_info("y", F, out)],
                      [onh.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.mark.parametrize("name", sorted(_CASES))
def test_same_rank_constant_still_fuses(name):
    """Control: a [1, 8] (same rank as x, so no rank added) or scalar constant fuses, with the
    same numerics; the guard refuses only what changes a shape."""
    family = _CASES[name][0]
    for shape in ((), (1, 8) if name != "layernorm" else (1, 1)):
        proto = _build(name, shape)
        _, stats, artifact = _compile(proto)
        assert stats.get(family, 0) == 1, (shape, stats)
        _same_run(proto, artifact)


@pytest.mark.parametrize("name", sorted(_CASES))
def test_rank_unknown_until_inferred(name):
    """The guard infers, it does not trust declarations: with no declared output shape (and no
    infer-shapes before the fusion) the rewrite is still refused."""
    proto = _build(name, (1, 1, 8) if name != "layernorm" else (1, 1, 1))
    proto.graph.output[0].type.tensor_type.ClearField("shape")
    pass_name = {"gelu": "fuse-gelu", "hardswish": "fuse-activations", "layernorm": "fuse-layernorm"}[name]
    _, stats, artifact = _compile(proto, pass_name)
    assert stats.get(_CASES[name][0], 0) == 0
    _same_run(proto, artifact)


class _DropBias(RewriteRule):
    """A wrong rule for the test: Add(x, b) -> Identity(x), whatever b's shape."""

    name = "test-drop-bias"

    def pattern(self, op, x, b):
        return op.Add(x, b)

    def rewrite(self, op, x, b):
        return op.Identity(x)


def test_guard_refuses_what_a_rule_gets_wrong_and_explain_says_why():
    """Any rule, not only the built-in ones: a replacement that changes the replaced value's
    inferred shape is refused at apply time, and explain gives the reason."""
    proto = onnx.parser.parse_model('<ir_version: 8, opset_import: ["" : 17]>\n'
                                    "g (float[2,8] x, float[3,1,8] b) => (float[3,2,8] y) {\n"
                                    " y = Add(x, b)\n}")
    model = from_onnx(proto)
    rule = _DropBias()
    assert rule.apply(next(iter(model.graph)), model) is None
    assert [n.op_type for n in model.graph] == ["Add"]
    text = explain(rule, model)
    assert "full pattern matched, replacement refused: the replacement of 'y' would change its " \
           "type: shape [3, 2, 8] (rank 3) becomes [2, 8] (rank 2)" in text, text
    # The same rule where b does not broadcast x: it fires.
    proto2 = onnx.parser.parse_model('<ir_version: 8, opset_import: ["" : 17]>\n'
                                     "g (float[2,8] x, float[8] b) => (float[2,8] y) {\n"
                                     " y = Add(x, b)\n}")
    model2 = from_onnx(proto2)
    assert rule.apply(next(iter(model2.graph)), model2) is not None
    assert [n.op_type for n in model2.graph] == ["Identity"]


def test_explain_does_not_change_the_model():
    """explain builds the replacement to check it and drops it: no node, initializer or use left."""
    proto = _build("layernorm", ())
    model = from_onnx(proto)
    before = (len(model.graph), sorted(model.graph.initializers),
              [len(v.uses()) for v in model.graph.inputs])
    text = explain("layernorm-decomposed", model)
    assert "would fire at 1" in text
    after = (len(model.graph), sorted(model.graph.initializers),
             [len(v.uses()) for v in model.graph.inputs])
    assert before == after


def _value(name, dtype, dims):
    return Value(name, TensorType(dtype, Shape(tuple(dims))))


def test_checked_replace_refuses_and_leaves_the_graph_as_it_was():
    """A hand-written replacement of ``Add(x[2,8], c[1,1,8])`` by ``Relu(x)`` is refused before
    anything changes; one of the same shape goes through."""
    proto = onnx.parser.parse_model('<ir_version: 8, opset_import: ["" : 17]>\n'
                                    "g (float[2,8] x) => (float[1,2,8] y) {\n y = Add(x, c)\n}")
    proto.graph.initializer.append(onh.from_array(np.zeros((1, 1, 8), np.float32), "c"))
    model = from_onnx(proto)
    graph = model.graph
    add = next(iter(graph))
    x = graph.inputs[0]
    relu = Node("", "Relu", [x], {}, [Value("r")])
    with pytest.raises(ReplacementError, match=r"'y'.*\[1, 2, 8\] \(rank 3\) becomes \[2, 8\]"):
        checked_replace(graph, [add], [relu], [add.outputs[0]], [relu.outputs[0]], 17)
    assert [n.op_type for n in graph] == ["Add"]
    relu.set_inputs(())
    assert [u.op_type for u in x.consumers()] == ["Add"]
    # Same shape: Add(x, c) with c of shape [1, 1, 8] replaced by Add(Unsqueeze(x, 0), c).
    axes = graph.add_constant(np.array([0], np.int64), "axes")
    unsq = Node("", "Unsqueeze", [x, axes], {}, [Value("u")])
    add2 = Node("", "Add", [unsq.outputs[0], add.inputs[1]], {}, [Value("y2")])
    checked_replace(graph, [add], [unsq, add2], [add.outputs[0]], [add2.outputs[0]], 17)
    assert [n.op_type for n in graph] == ["Unsqueeze", "Add"]
    assert tuple(add2.outputs[0].shape.dims) == (1, 2, 8)
    _same_run(proto, to_onnx(model))


def test_element_type_change_is_refused():
    x = _value("x", DataType.FLOAT, [2, 8])
    cast = Node("", "Cast", [x], {"to": int(DataType.FLOAT16)}, [Value("h")])
    relu = Node("", "Relu", [x], {}, [Value("r")])
    why = replacement_conflict([relu], [cast], [relu.outputs[0]], [cast.outputs[0]], 17)
    assert why is not None and "element type f32 becomes f16" in why


def test_inference_of_standard_and_canonical_ops():
    """Per-node inference: broadcasting, Reshape from a constant shape, canonical ops as input 0."""
    x = _value("x", DataType.FLOAT, [2, 3])
    c = Value("c", TensorType(DataType.FLOAT, Shape((4, 1, 3))))
    add = Node("", "Add", [x, c], {}, [Value("a")])
    shape = Value("s", None)
    from passctl.ir import Tensor

    shape.const = Tensor(np.array([3, -1], np.int64))
    reshape = Node("", "Reshape", [add.outputs[0], shape], {}, [Value("r")])
    gelu = Node("passctl", "Gelu", [reshape.outputs[0]], {"approximate": "none"}, [Value("g")])
    env = infer_nodes([add, reshape, gelu], 17)
    assert env[id(add.outputs[0])].shape.dims == (4, 2, 3)
    assert env[id(reshape.outputs[0])].shape.dims == (3, 8)
    assert env[id(gelu.outputs[0])].shape.dims == (3, 8)
    assert type_conflict(env[id(add.outputs[0])], x.type) is not None
    assert type_conflict(TensorType(DataType.FLOAT, Shape(("n", 3))), x.type) is None


def test_lowering_form_that_changes_a_shape_is_refused_and_the_next_form_used():
    """The lowering table's common replacement point has the guard too: a form that would change
    the canonical op's output shape is refused (stat ``refused``) and the next one is used."""
    from passctl.passes.lowering import lower_standard
    from passctl.passes.lowering.table import Lowering, register_lowering

    def bad(ctx, node):  # HardSwish as Unsqueeze(x, 0): rank 2 becomes rank 3
        ctx.form = "HardSwish->wrong"
        return ctx.b.op("Unsqueeze", node.inputs[0], ctx.const(np.array([0], np.int64), "axes"))

    register_lowering("test-guard", "HardSwish", bad)
    register_lowering("test-guard", "HardSwish", lower_standard.lower_hardswish)

    class LowerTest(Lowering):
        name = "lower-test-guard"
        TARGET = "test-guard"

    proto = _build("hardswish", ())
    model = from_onnx(proto)
    PassManager(build_pipeline("infer-shapes,fuse-activations")).run(model)
    assert [n.op_type for n in model.graph] == ["HardSwish"]
    result = LowerTest()(model)
    assert result.stats["refused"] == 1 and result.stats["lowered"] == 1
    assert "HardSwish->wrong" not in result.stats
    _same_run(proto, to_onnx(model))


def test_a_replacement_reading_a_removed_nodes_output_is_refused(tmp_path):
    """Add(conv, conv) + Relu (the fuzzer's quantize:1855): the residual rule would make
    FusedConv(x, w, b, Z=conv) read the Conv it removes; the rewrite is refused, the model compiles
    and matches ONNX Runtime on the original."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from passctl.support.check import run_onnxruntime
    from passctl.tools.cli import main

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
         helper.make_node("Add", ["c", "c"], ["a"], name="double"),
         helper.make_node("Relu", ["a"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
        [numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")])
    path = str(tmp_path / "m.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert main([path, "-p", "cleanup,fuse", "-o", str(tmp_path / "out"), "-q"]) == 0
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    want = run_onnxruntime(path, {"x": x})["y"]
    got = run_onnxruntime(str(tmp_path / "out" / "model.onnx"), {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
