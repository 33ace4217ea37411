"""fold-constants: lift, fold (reference evaluator and static Shape), size limit, kept ops; ORT numerics."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
from helpers import apply, assert_same_outputs, op_types, parse

from corpus import CORPUS
from passctl.ir import load, to_onnx
from passctl.passes.common.fold_constants import FoldConstants
from passctl.support.check import check_models


def _inits(proto):
    """Initializers of a ModelProto's main graph, or of a GraphProto."""
    graph = proto.graph if isinstance(proto, onnx.ModelProto) else proto
    return {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}


def test_lift_and_fold_chain():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x) => (float[2,3] y) {
            a = Constant <value = float[3] {1.0, 2.0, 3.0}> ()
            two = Constant <value_float = 2.0> ()
            b = Mul (a, two)
            c = Sqrt (b)
            y = Add (x, c)
        }""")
    model, result, out = apply(proto, FoldConstants())
    assert result.stats == {"lifted": 2, "folded": 2, "too_large": 0, "low_bit_kept": 0, "failed": 0}
    assert op_types(out) == ["Add"]
    inits = _inits(out)
    # Independent value: sqrt([1, 2, 3] * 2) in float32; the folded value keeps its name "c".
    np.testing.assert_allclose(inits["c"], np.sqrt(np.array([2, 4, 6], np.float32)), rtol=1e-7)
    assert inits["c"].dtype == np.float32
    assert_same_outputs(proto, out)


def test_shape_of_static_value_and_reshape_folded():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3,4] x) => (float[6,4] y) {
            s = Shape <start = 1> (x)
            p = ReduceProd <keepdims = 1> (s)
            m1 = Constant <value = int64[1] {-1}> ()
            t = Concat <axis = 0> (m1, p)
            y = Reshape (x, t)
        }""")
    _, result, out = apply(proto, FoldConstants())
    assert result.stats["folded"] == 3 and result.stats["lifted"] == 1
    assert op_types(out) == ["Reshape"]
    np.testing.assert_array_equal(_inits(out)[out.graph.node[0].input[1]], [-1, 12])
    assert_same_outputs(proto, out)


def test_size_limit_and_kept_ops():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1000] x) => (float[1000] y, float[4] r, float[4] d) {
            shape = Constant <value = int64[1] {1000}> ()
            big = ConstantOfShape <value = float[1] {1.0}> (shape)
            y = Add (x, big)
            r = RandomNormal <shape = [4], seed = 1.0> ()
            q = Constant <value = int8[4] {1, 2, 3, 4}> ()
            sc = Constant <value_float = 0.5> ()
            d = DequantizeLinear (q, sc)
        }""")
    # 1000 float32 = 4000 bytes > 1000: ConstantOfShape is counted, not folded.
    _, result, out = apply(proto, FoldConstants(size_limit=1000))
    assert result.stats == {"lifted": 3, "folded": 0, "too_large": 1, "low_bit_kept": 0, "failed": 0}
    assert op_types(out) == ["ConstantOfShape", "Add", "RandomNormal", "DequantizeLinear"]
    _, result, out = apply(proto, FoldConstants(fold_dequantize=True))
    assert result.stats["folded"] == 2  # ConstantOfShape and DequantizeLinear
    np.testing.assert_array_equal(_inits(out)["d"], np.array([0.5, 1, 1.5, 2], np.float32))
    assert "RandomNormal" in op_types(out)


def test_custom_domain_and_graph_input_initializer_not_folded():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17, "custom.domain" : 1]>
        g (float[2] x, float[2] w) => (float[2] y, float[2] z) {
            one = Constant <value = float[2] {1.0, 1.0}> ()
            y = custom.domain.Foo (one)
            z = Add (w, one)
        }""", check=False)
    # "w" is both a graph input and an initializer: a default the caller may override.
    proto.graph.initializer.append(onnx.numpy_helper.from_array(np.ones(2, np.float32), "w"))
    _, result, out = apply(proto, FoldConstants())
    assert result.stats == {"lifted": 1, "folded": 0, "too_large": 0, "low_bit_kept": 0, "failed": 0}
    assert op_types(out) == ["Foo", "Add"]


def test_graph_output_name_kept():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2] x) => (float[2] y, int64[1] n) {
            y = Relu (x)
            k = Constant <value = int64[1] {3}> ()
            n = Neg (k)
        }""")
    _, result, out = apply(proto, FoldConstants())
    assert result.stats["folded"] == 1
    assert [o.name for o in out.graph.output] == ["y", "n"]
    np.testing.assert_array_equal(_inits(out)["n"], [-3])
    assert_same_outputs(proto, out)


def test_ppocr_det_weights_lifted():
    entry = CORPUS["ppocr_det"]
    model = load(entry.path)
    constants = sum(n.op_type == "Constant" for n in model.graph)
    result = FoldConstants()(model)
    assert result.stats["lifted"] == constants
    assert not any(n.op_type == "Constant" for n in model.graph)
    check = check_models(entry.path, to_onnx(model), inputs=entry.inputs(seed=0))
    assert check.ok(1e-5), str(check)


def test_static_part_of_dynamic_shape_folded():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N,S,8,32] x) => (float[N,S,256] y) {
            s = Shape (x)
            head = Constant <value = int64[2] {2, 3}> ()
            hd = Gather <axis = 0> (s, head)
            last = Slice (s, m1, big)
            seq = Slice (s, zero, two)
            p = ReduceProd <keepdims = 1> (hd)
            t = Concat <axis = 0> (seq, p)
            y = Reshape (x, t)
            unused = Identity (last)
        }""", check=False)
    for name, v in (("m1", [-1]), ("big", [2**63 - 1]), ("zero", [0]), ("two", [2])):
        proto.graph.initializer.append(onnx.numpy_helper.from_array(np.array(v, np.int64), name))
    _, result, out = apply(proto, FoldConstants())
    # Gather picks dims 2, 3 (8, 32) and Slice [-1:] picks 32: both static; Slice [0:2] is
    # [N, S] (dynamic) and stays. ReduceProd then folds to 256, and the unused Identity of a
    # constant is folded away (its output has no consumer, so no initializer is made).
    inits = _inits(out)
    np.testing.assert_array_equal(inits["hd"], [8, 32])
    np.testing.assert_array_equal(inits["last"], [32])
    np.testing.assert_array_equal(inits["p"], [256])
    assert "unused" not in inits
    assert result.stats["folded"] == 4
    assert op_types(out) == ["Shape", "Slice", "Concat", "Reshape"]
    x = np.random.default_rng(0).normal(size=(2, 5, 8, 32)).astype(np.float32)
    assert_same_outputs(proto, out, inputs={"x": x})


def test_folding_inside_if_branches():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (bool c, float[2] x) => (float[2] y) {
            y = If (c) <
                then_branch = t () => (float[2] ty) {
                    k = Constant <value = float[2] {1.0, 2.0}> ()
                    k2 = Mul (k, k)
                    ty = Add (x, k2)
                },
                else_branch = e () => (float[2] ey) {
                    ey = Constant <value = float[2] {5.0, 6.0}> ()
                }
            >
        }""")
    _, result, out = apply(proto, FoldConstants())
    # then: k lifted, k2 folded into the branch's initializers; else: its output stays a node.
    assert result.stats == {"lifted": 1, "folded": 1, "too_large": 0, "low_bit_kept": 0, "failed": 0}
    then = next(a.g for a in out.graph.node[0].attribute if a.name == "then_branch")
    assert [n.op_type for n in then.node] == ["Add"]
    np.testing.assert_array_equal(_inits(then)["k2"], [1.0, 4.0])
    for flag in (True, False):
        assert_same_outputs(proto, out, inputs={"c": np.array(flag),
                                                "x": np.array([0.5, -1.0], np.float32)})
