"""Import of ONNX graphs whose nodes are out of topological order (sorted) or form a cycle (refused)."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from passctl.ir import from_onnx, load, to_onnx
from passctl.ir.errors import ModelLoadError
from passctl.ir.verifier import verify

F = TensorProto.FLOAT


def _run_ort(proto: onnx.ModelProto, feeds: dict) -> list:
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _unsorted_model() -> onnx.ModelProto:
    """y = Relu(x) * w - Neg(Relu(x)); z = If(c, then: y + x2, else: x2) where x2 = Exp(x).

    Listed consumers-first, and the If's branch reads ``x2``, whose producer comes after the If.
    """
    then_g = helper.make_graph([helper.make_node("Add", ["y", "x2"], ["t"], name="then_add")],
                               "then", [], [helper.make_tensor_value_info("t", F, [2, 3])])
    else_g = helper.make_graph([helper.make_node("Identity", ["x2"], ["e"], name="else_id")],
                               "else", [], [helper.make_tensor_value_info("e", F, [2, 3])])
    nodes = [
        helper.make_node("If", ["c"], ["z"], name="if", then_branch=then_g, else_branch=else_g),
        helper.make_node("Sub", ["m", "n"], ["y"], name="sub"),
        helper.make_node("Mul", ["r", "w"], ["m"], name="mul"),
        helper.make_node("Neg", ["r"], ["n"], name="neg"),
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Exp", ["x"], ["x2"], name="exp"),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", F, [2, 3]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", F, [2, 3]), helper.make_tensor_value_info("z", F, [2, 3])],
        initializer=[helper.make_tensor("w", F, [3], [0.5, -2.0, 3.0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_unsorted_graph_is_sorted_and_runs_like_onnxruntime_on_the_original(tmp_path, caplog):
    proto = _unsorted_model()
    with pytest.raises(onnx.checker.ValidationError):  # ONNX itself calls it unsorted
        onnx.checker.check_model(proto)
    path = tmp_path / "unsorted.onnx"
    onnx.save(proto, str(path))
    with caplog.at_level(logging.INFO, logger="passctl.ir.onnx_import"):
        model = load(path)
    assert any("not in topological order" in r.getMessage() and r.levelno == logging.INFO
               for r in caplog.records)
    assert verify(model) == []
    order = [n.name for n in model.graph]
    for before, after in (("relu", "mul"), ("relu", "neg"), ("mul", "sub"), ("neg", "sub"),
                          ("sub", "if"), ("exp", "if")):
        assert order.index(before) < order.index(after), order

    exported = to_onnx(model)
    onnx.checker.check_model(exported)  # now in topological order
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    for c in (True, False):
        feeds = {"x": x, "c": np.array(c)}
        want = _run_ort(proto, feeds)  # ONNX Runtime sorts the original itself
        got = _run_ort(exported, feeds)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g, w)
        relu = np.maximum(x, 0)
        y = relu * np.array([0.5, -2.0, 3.0], np.float32) + relu
        np.testing.assert_allclose(want[0], y, rtol=1e-6)


def test_sorted_graph_keeps_its_order():
    proto = _unsorted_model()
    sorted_proto = to_onnx(from_onnx(proto))
    again = to_onnx(from_onnx(sorted_proto))
    assert [n.name for n in again.graph.node] == [n.name for n in sorted_proto.graph.node]


def test_cycle_is_one_line_naming_the_nodes(tmp_path):
    nodes = [helper.make_node("Add", ["x", "c"], ["a"], name="na"),
             helper.make_node("Relu", ["a"], ["b"], name="nb"),
             helper.make_node("Neg", ["b"], ["c"], name="nc"),
             helper.make_node("Identity", ["a"], ["y"], name="out")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 4])],
                              [helper.make_tensor_value_info("y", F, [1, 4])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "cycle.onnx"
    onnx.save(proto, str(path))
    with pytest.raises(Exception):  # ONNX Runtime refuses it as well
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with pytest.raises(ModelLoadError) as info:
        load(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    assert "cycle through nodes na -> nb -> nc -> na" in message, message
    assert "break the cycle" in message


def test_self_loop_is_a_cycle():
    node = helper.make_node("Relu", ["a"], ["a"])  # nameless: named by op and index
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["i"], name="id"), node], "g",
                              [helper.make_tensor_value_info("x", F, [2])],
                              [helper.make_tensor_value_info("a", F, [2])])
    with pytest.raises(ModelLoadError, match="cycle through nodes Relu@1 -> Relu@1"):
        from_onnx(helper.make_model(graph))
