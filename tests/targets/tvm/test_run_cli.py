"""``passctl run ARTIFACT`` on an ONNX Runtime and a TVM artifact: outputs, summaries, latency."""

import numpy as np
import onnx
import pytest
from tvm_helpers import rel_err, run_cli, run_ort
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(5)


def _model(path):
    w = numpy_helper.from_array(RNG.standard_normal((24, 10)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
         helper.make_node("Tanh", ["m"], ["y"], name="tanh")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 24])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])], [w])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(proto, path)
    return proto


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    proto = _model(tmp / "m.onnx")
    r = run_cli(tmp / "m.onnx", "-o", tmp / "ort", "-q")
    assert r.returncode == 0, r.stderr
    r = run_cli(tmp / "m.onnx", "-p", 'cleanup,lower-tvm{dims="batch=3"}', "--emit", "tvm",
                "-o", tmp / "tvm", "-q")
    assert r.returncode == 0, r.stderr
    x = RNG.uniform(-1, 1, (3, 24)).astype(np.float32)
    np.savez(tmp / "in.npz", x=x)
    return tmp, proto, x


@pytest.mark.parametrize("kind", ["ort", "tvm"])
def test_run_given_inputs(artifacts, kind):
    tmp, proto, x = artifacts
    out = tmp / f"out_{kind}.npz"
    r = run_cli("run", tmp / kind, "--inputs", tmp / "in.npz", "--runs", 3,
                "--save-outputs", out)
    assert r.returncode == 0, r.stderr
    label = "onnxruntime" if kind == "ort" else "tvm"
    assert f"{label} artifact" in r.stdout
    want = run_ort(proto, {"x": x})["y"]
    with np.load(out) as data:
        got = data["y"]
    assert rel_err(got, want) < 1e-5
    assert f"y: [3, 10] float32  min {want.min():.6g}  max {want.max():.6g}" in r.stdout
    assert "latency: median" in r.stdout and "over 3 runs" in r.stdout


def test_run_seeded_inputs_agree_across_artifacts(artifacts):
    tmp, _, _ = artifacts
    a = run_cli("run", tmp / "ort", "--dim", "batch=3", "--runs", 1, "--save-outputs", tmp / "a.npz")
    b = run_cli("run", tmp / "tvm", "--runs", 1, "--save-outputs", tmp / "b.npz")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    with np.load(tmp / "a.npz") as da, np.load(tmp / "b.npz") as db:
        assert rel_err(db["y"], da["y"]) < 1e-5  # same seed, same make_inputs rules


def test_run_errors_are_one_line(artifacts, tmp_path):
    tmp, _, _ = artifacts
    r = run_cli("run", tmp_path)
    assert r.returncode == 2 and "neither session.json" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    np.savez(tmp_path / "bad.npz", x=np.zeros((2, 24), np.float32))
    r = run_cli("run", tmp / "tvm", "--inputs", tmp_path / "bad.npz")
    assert r.returncode == 2 and "does not fit graph input 'x' (float32 [3, 24])" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_compile_check_runs_the_tvm_artifact(artifacts, tmp_path):
    """--check with --emit tvm runs the TVM library (on its static input shapes) against the original."""
    import json

    tmp, _, _ = artifacts
    out = tmp_path / "checked"
    r = run_cli(tmp / "m.onnx", "-p", 'cleanup,lower-tvm{dims="batch=3"}', "--emit", "tvm",
                "--check", "-o", out, "-q")
    assert r.returncode == 0, r.stderr
    check = json.loads((out / "report.json").read_text())["check"]
    assert check["ok"] is True
    assert check["inputs"] == [{"name": "x", "shape": [3, 24], "dtype": "float32"}]
    assert check["max_rel"] < 1e-5
