"""report.json check.dims: the size used for every unknown input dimension and where it came from
(break-it 12); --dim sizes too large for memory are a user error (break-it 6)."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import onnx
from onnx import TensorProto, helper

CLS = os.path.join(os.path.dirname(importlib.util.find_spec("rapidocr_onnxruntime").origin),
                   "models", "ch_ppocr_mobile_v2.0_cls_infer.onnx")


def _dyn_model(tmp_path) -> str:
    """y = Relu(x), x and y declared float32 [batch, seq] (the break-it dyn.onnx)."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])])
    path = tmp_path / "dyn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def _check(out):
    with open(os.path.join(out, "report.json")) as f:
        return json.load(f)["check"]


def test_defaults_are_reported_and_said(cli, tmp_path):
    r = cli(_dyn_model(tmp_path), "--check", "-o", tmp_path / "o")
    assert r.rc == 0, r.err
    check = _check(tmp_path / "o")
    assert check["inputs"] == [{"name": "x", "shape": [1, 16], "dtype": "float32"}]
    assert check["dims"] == {"batch": 1, "seq": 16}
    assert check["dims_source"] == {"batch": "default", "seq": "default"}
    line = next(l for l in r.out.splitlines() if l.startswith("check:"))
    assert "default sizes batch=1, seq=16" in line and "--dim" in line, r.out


def test_given_and_default_dims(cli, tmp_path):
    r = cli(_dyn_model(tmp_path), "--check", "--dim", "seq=5", "-o", tmp_path / "o")
    assert r.rc == 0, r.err
    check = _check(tmp_path / "o")
    assert check["inputs"][0]["shape"] == [1, 5]
    assert check["dims"] == {"batch": 1, "seq": 5}
    assert check["dims_source"] == {"batch": "default", "seq": "given"}
    line = next(l for l in r.out.splitlines() if l.startswith("check:"))
    assert "default sizes batch=1" in line and "seq=" not in line, r.out


def test_dims_from_inputs_file(cli, tmp_path):
    feeds = tmp_path / "x.npz"
    np.savez(feeds, x=np.linspace(-1, 1, 14, dtype=np.float32).reshape(2, 7))
    r = cli(_dyn_model(tmp_path), "--check", "--inputs", feeds, "-o", tmp_path / "o", "-q")
    assert r.rc == 0, r.err
    check = _check(tmp_path / "o")
    assert check["dims"] == {"batch": 2, "seq": 7}
    assert check["dims_source"] == {"batch": "inputs", "seq": "inputs"}


def test_real_model_static_dims_are_not_listed(cli, tmp_path):
    """PP-OCR cls declares x [-1, 3, ?, ?]: three unknown dims (unnamed), axis 1 is fixed."""
    r = cli(CLS, "--check", "--dim", "x[3]=96", "-o", tmp_path / "o", "-q")
    assert r.rc == 0, r.err
    check = _check(tmp_path / "o")
    declared = onnx.load(CLS, load_external_data=False).graph.input[0].type.tensor_type.shape.dim
    unknown = [f"x[{axis}]" for axis, d in enumerate(declared) if d.dim_value <= 0]
    assert unknown == ["x[0]", "x[2]", "x[3]"]
    assert sorted(check["dims"]) == unknown
    shape = check["inputs"][0]["shape"]
    assert check["dims"] == {k: shape[int(k[2])] for k in unknown}
    assert shape[3] == 96 and shape[1] == 3
    assert check["dims_source"] == {"x[0]": "default", "x[2]": "default", "x[3]": "given"}


def test_dims_too_large_for_memory(cli, tmp_path):
    model = _dyn_model(tmp_path)
    huge = ["--dim", "batch=100000000", "--dim", "seq=100000"]
    r = cli(model, "--check", *huge, "-o", tmp_path / "o", "-q")
    assert r.rc == 2, r.err
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("passctl: error: "), r.err
    # 1e8 * 1e5 float32 values = 4e13 bytes = 36.4 TiB
    assert "36.4 TiB" in lines[0] and "x float32 [100000000, 100000]" in lines[0]
    assert "--dim" in lines[0]
    assert not (tmp_path / "o").exists()
    assert cli(model, "-o", tmp_path / "art", "-q").rc == 0
    r = cli("run", tmp_path / "art", *huge, "--runs", "1")
    assert r.rc == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert "36.4 TiB" in r.err and "Traceback" not in r.err


def test_string_input_compiles_without_check(cli, tmp_path):
    """A string input has no random data; compiling without --check must not need any."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"], name="id0"),
         helper.make_node("Identity", ["s"], ["t"], name="id1")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("s", TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("t", TensorProto.STRING, [2])])
    path = tmp_path / "str.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    r = cli(path, "-o", tmp_path / "o", "-q")
    assert r.rc == 0, r.err
    r = cli(path, "--check", "-o", tmp_path / "o2", "-q")
    assert r.rc == 2 and "'s' is a string tensor" in r.err


def test_sizes_a_pass_fixed_are_the_checks(cli, tmp_path):
    """lower-tvm{dims=...} fixes the artifact's input sizes: the check runs at those (its only
    ones), said as coming from the artifact; the candidate's model.onnx declares them."""
    r = cli(_dyn_model(tmp_path), "-p", 'cleanup,lower-tvm{dims="batch=2,seq=3"}', "--check",
            "-o", tmp_path / "o")
    assert r.rc == 0, r.err
    declared = onnx.load(str(tmp_path / "o" / "model.onnx")).graph.input[0]
    assert [d.dim_value for d in declared.type.tensor_type.shape.dim] == [2, 3]
    check = _check(tmp_path / "o")
    assert check["inputs"] == [{"name": "x", "shape": [2, 3], "dtype": "float32"}]
    assert check["dims"] == {"x[0]": 2, "x[1]": 3}
    assert check["dims_source"] == {"x[0]": "artifact", "x[1]": "artifact"}
