"""--check says when it compared (almost) nothing and how it passed (break-it 5)."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

DET = os.path.join(os.path.dirname(importlib.util.find_spec("rapidocr_onnxruntime").origin),
                   "models", "ch_PP-OCRv4_det_infer.onnx")
ATOL = 2.4e-7  # passctl's default --atol


def _report(out):
    with open(os.path.join(out, "report.json")) as f:
        return json.load(f)


def _check_line(stdout):
    return next(line for line in stdout.splitlines() if line.startswith("check:"))


def test_det_at_default_size_warns_and_says_atol(cli, tmp_path):
    """PP-OCRv4 det at the default 32x32 input: its probability map has no value above atol."""
    from passctl.support.check import make_inputs

    feeds = make_inputs(DET, seed=0)
    assert list(feeds["x"].shape) == [1, 3, 32, 32]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(DET, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert 0 < np.abs(ref).max() <= ATOL  # the premise, measured independently

    r = cli(DET, "-p", "cleanup,fuse-conv-bn", "--check", "-o", tmp_path / "det")
    assert r.rc == 0, r.err
    warnings = [line for line in r.err.splitlines() if line.startswith("passctl: warning: ")]
    assert len(warnings) == 1, r.err
    text = warnings[0][len("passctl: warning: "):]
    assert "'sigmoid_0.tmp_0'" in text and "no value above atol" in text
    assert "--dim" in text and "--inputs" in text and "p2o.DynamicDimension.1=32" in text
    report = _report(tmp_path / "det")
    assert report["check"]["warnings"] == [text]
    assert text in report["warnings"]
    check = report["check"]
    # the fold changes the one nonzero 6e-8 value by a few ulps: max_rel ~1 > rtol, max_abs <= atol
    assert float(check["max_rel"]) > check["rtol"] and check["max_abs"] <= ATOL
    assert check["passed_on_atol"] == ["sigmoid_0.tmp_0"]
    assert "passed on atol" in _check_line(r.out), r.out
    # at a realistic size the map has real values: no warning
    r = cli(DET, "-p", "cleanup,fuse-conv-bn", "--check", "--dim", "p2o.DynamicDimension.1=64",
            "--dim", "p2o.DynamicDimension.2=64", "-o", tmp_path / "det64", "-q")
    assert r.rc == 0, r.err
    assert "warning" not in r.err and _report(tmp_path / "det64")["check"]["warnings"] == []


def _matmul_model(tmp_path) -> str:
    """y[1,4] = x[1,4] @ w[4,4]: a NaN anywhere in x makes every output NaN."""
    w = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4) / 7, "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    path = tmp_path / "mm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def test_nan_outputs_warn_and_inputs_are_given_not_seeded(cli, tmp_path):
    model = _matmul_model(tmp_path)
    x = np.array([[0.5, np.nan, -1.0, 2.0]], np.float32)
    np.savez(tmp_path / "nan.npz", x=x)
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.isnan(ref).all()  # the premise, measured independently
    r = cli(model, "--check", "--inputs", tmp_path / "nan.npz", "-o", tmp_path / "o")
    assert r.rc == 0, r.err
    text = r.err.strip().splitlines()[0]
    assert text.startswith("passctl: warning: ") and "'y'" in text and "NaN/inf" in text
    assert "4 of 4" in text
    line = _check_line(r.out)
    assert "seeded" not in line and "given" in line and "--inputs" in line, line
    assert _report(tmp_path / "o")["check"]["warnings"] == [text[len("passctl: warning: "):]]


def test_constant_output_warns(cli, tmp_path):
    """y = Relu(x) - Relu(x) + 3 is 3 everywhere: a constant output says nothing of the passes."""
    three = numpy_helper.from_array(np.array(3.0, np.float32), "three")
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Sub", ["r", "r"], ["z"], name="sub"),
             helper.make_node("Add", ["z", "three"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 6])],
                              [three])
    path = tmp_path / "const.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    r = cli(path, "--check", "-o", tmp_path / "o", "-q")
    assert r.rc == 0, r.err
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and "'y'" in lines[0], r.err
    assert "constant (every value is 3)" in lines[0], r.err
    assert "batch=1" in lines[0]  # the defaulted size is named


def test_informative_check_has_no_warning_and_says_seeded(cli, conv_bn_model, tmp_path):
    r = cli(conv_bn_model, "-p", "cleanup,fuse-conv-bn", "--check", "-o", tmp_path / "o")
    assert r.rc == 0, r.err
    assert r.err == ""
    line = _check_line(r.out)
    assert "on 1 seeded input(s), seed 0" in line and "passed on atol" not in line
    assert _report(tmp_path / "o")["check"]["warnings"] == []
