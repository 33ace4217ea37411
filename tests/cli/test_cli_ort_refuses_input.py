"""Input models ONNX Runtime itself refuses are the user's problem (rc 2, one line naming the node,
op and what to do), not passctl's crash; an emitted model that fails while the input loads stays an
internal error (break-it 4)."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from passctl.tools.cli import main


def _save(tmp_path, name, nodes, opsets, inits=(), x_shape=(1, 4), outputs=("y",), ir_version=None):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    if ir_version is not None:
        model.ir_version = ir_version
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return str(path)


def _ort_refuses(path) -> str:
    """ONNX Runtime's own error for ``path`` (the test's independent evidence)."""
    so = ort.SessionOptions()
    so.log_severity_level = 4
    with pytest.raises(Exception) as info:
        ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return str(info.value)


def _run(capfd, *argv):
    """``passctl`` in-process; stderr captured at the file-descriptor level (ORT's C++ log too)."""
    capfd.readouterr()
    rc = main([str(a) for a in argv])
    captured = capfd.readouterr()
    return rc, captured.err


def _assert_user_error(rc, err, path, *words):
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"passctl: error: {path}: ONNX Runtime cannot load this model "
                               "either: "), err
    assert "\x1b" not in err and "Traceback" not in err and "onnxruntime_src" not in err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def test_custom_op(capfd, tmp_path):
    path = _save(tmp_path, "custom", [helper.make_node("MyOp", ["x"], ["y"], name="custom0",
                                                       domain="my.custom")],
                 [("", 17), ("my.custom", 1)])
    assert "my.custom:MyOp" in _ort_refuses(path)
    rc, err = _run(capfd, path, "-o", tmp_path / "o", "-q")
    _assert_user_error(rc, err, path, "node 'custom0'", "my.custom::MyOp", "custom op",
                       "standard ONNX ops", "--load")
    assert not (tmp_path / "o").exists()


def test_custom_op_with_check_each(capfd, tmp_path):
    # --check-each runs the original in ONNX Runtime before any pass: the same user error, not an
    # internal error with a reproducer
    path = _save(tmp_path, "custom", [helper.make_node("MyOp", ["x"], ["y"], name="custom0",
                                                       domain="my.custom")],
                 [("", 17), ("my.custom", 1)])
    assert "my.custom:MyOp" in _ort_refuses(path)
    rc, err = _run(capfd, path, "--check-each", "-o", tmp_path / "o", "-q",
                   "--reproducer-dir", tmp_path / "crash")
    _assert_user_error(rc, err, path, "node 'custom0'", "my.custom::MyOp", "custom op")
    assert not (tmp_path / "o").exists() and not (tmp_path / "crash").exists()

def test_opset_too_old(capfd, tmp_path):
    path = _save(tmp_path, "opset1", [helper.make_node("Relu", ["x"], ["y"], name="r")],
                 [("", 1)], ir_version=3)
    assert "Could not find an implementation for Relu(1)" in _ort_refuses(path)
    rc, err = _run(capfd, path, "-o", tmp_path / "o", "-q")
    _assert_user_error(rc, err, path, "node 'r' (op Relu)", "opset 1",
                       "onnx.version_converter.convert_version(model, 17)")
    # the advice works: the converted model loads and computes Relu
    converted = onnx.version_converter.convert_version(onnx.load(path), 17)
    x = np.array([[-1.0, 0.5, -2.0, 3.0]], np.float32)
    got = ort.InferenceSession(converted.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, np.maximum(x, 0))
    assert not (tmp_path / "o").exists()


def test_opset_too_new(capfd, tmp_path):
    path = _save(tmp_path, "opset99", [helper.make_node("Relu", ["x"], ["y"], name="r")],
                 [("", 99)], ir_version=10)
    newest = int(re.search(r"domain ai.onnx is till opset (\d+)", _ort_refuses(path)).group(1))
    rc, err = _run(capfd, path, "-o", tmp_path / "o", "-q")
    line = _assert_user_error(rc, err, path, "opset 99", f"opset {newest} this ONNX Runtime",
                              f"opset <= {newest}")
    assert len(line) < 400, line  # ORT's own text is a 600-character C++ signature and disclaimer
    assert not (tmp_path / "o").exists()


def test_shape_inference_error(capfd, tmp_path):
    c = numpy_helper.from_array(np.ones((1, 3), np.float32), "c")
    path = _save(tmp_path, "badshape", [helper.make_node("Add", ["x", "c"], ["y"], name="badadd")],
                 [("", 17)], inits=[c])
    assert "ShapeInferenceError" in _ort_refuses(path)
    rc, err = _run(capfd, path, "-o", tmp_path / "o", "-q")
    _assert_user_error(rc, err, path, "node 'badadd' (op Add)", "Incompatible dimensions",
                       "fix the model")
    assert not (tmp_path / "o").exists()


def test_graph_without_outputs(capfd, tmp_path):
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    path = _save(tmp_path, "no_outputs", [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                 [("", 17)], inits=[w], outputs=())
    rc, err = _run(capfd, path, "-o", tmp_path / "o", "-q")
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "\x1b" not in err, err
    assert lines[0].startswith(f"passctl: error: {path}: the graph declares no outputs"), err
    assert "graph.output" in lines[0]
    assert not (tmp_path / "o").exists()


PLUGIN = '''
from passctl.passes.base import Pass, PassResult
from passctl.passes.registry import register_pass


@register_pass
class BreakRelu(Pass):
    """Test pass: moves Relu into a domain no runtime knows (a passctl bug, not the user's)."""

    name = "break-relu"
    summary = "move Relu into an unknown domain"

    def run(self, model):
        for node in model.graph:
            if node.op_type == "Relu":
                node.domain = "test.broken"
        model.opset_imports["test.broken"] = 1
        return PassResult(True)
'''


def test_emitted_model_refused_but_input_loads_stays_internal(capfd, tmp_path):
    path = _save(tmp_path, "relu", [helper.make_node("Relu", ["x"], ["y"], name="r")], [("", 17)])
    plugin = tmp_path / "break_relu.py"
    plugin.write_text(PLUGIN)
    rc, err = _run(capfd, path, "--load", plugin, "-p", "break-relu", "-o", tmp_path / "o", "-q",
                   "--reproducer-dir", tmp_path / "crash")
    assert rc == 3, err
    assert "passctl: internal error: " in err and "cannot load the emitted model" in err
    assert "ONNX Runtime cannot load this model either" not in err
    assert not (tmp_path / "o").exists()
