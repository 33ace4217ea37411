"""passctl.compile / load / save / run: the CLI's code path from Python, typed errors, lazy import.

Every numeric assertion compares with a value computed independently: ONNX Runtime on the original
file, or the PyTorch module's own eager output (test_torch_frontend.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import passctl
from passctl.tools.cli import main


def _gemm_relu(path) -> str:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(b, "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def _ort(path, feeds):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_compile_runs_the_pipeline_and_the_artifact_matches_ort_on_the_original(tmp_path):
    src = _gemm_relu(tmp_path / "m.onnx")
    before = (tmp_path / "m.onnx").read_bytes()
    result = passctl.compile(src, pipeline="cleanup,fuse", output=str(tmp_path / "out"), check=True)
    assert result.artifact == str(tmp_path / "out")
    assert [n.op_type for n in result.model.graph] != ["MatMul", "Add", "Relu"]  # fused
    assert result.check["ok"] and set(result.check_errors) == {"y"}
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    got = passctl.run(result.artifact, {"x": x})["y"]
    want = _ort(src, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert (tmp_path / "m.onnx").read_bytes() == before  # the input file is never changed


def test_api_report_equals_the_clis_report_for_the_same_run(tmp_path):
    src = _gemm_relu(tmp_path / "m.onnx")
    api = passctl.compile(src, pipeline="cleanup,fuse", output=str(tmp_path / "api"), check=True)
    assert main([src, "-p", "cleanup,fuse", "-o", str(tmp_path / "cli"), "--check", "-q"]) == 0
    cli = json.loads((tmp_path / "cli" / "report.json").read_text())
    on_disk = json.loads((tmp_path / "api" / "report.json").read_text())
    assert on_disk == json.loads(json.dumps(api.report))  # result.report is report.json

    def comparable(report):  # what differs by nature: times, the output folder, the command line
        report = json.loads(json.dumps(report))
        report.pop("timing"), report.pop("command")
        report["artifact"].pop("path")
        report["artifact"].get("load_check", {}).pop("seconds", None)
        for record in report["passes"]:
            record.pop("time_ms")
        if report.get("verify"):
            report["verify"].pop("ms", None)
        return report
    assert comparable(api.report) == comparable(cli)


def test_in_memory_model_is_compiled_from_a_copy(tmp_path):
    from passctl.ir import print_model

    model = passctl.load(_gemm_relu(tmp_path / "m.onnx"))
    before = print_model(model)
    result = passctl.compile(model, pipeline="cleanup,fuse", output=str(tmp_path / "out"))
    assert print_model(model) == before  # the caller's model is unchanged
    assert len(list(result.model.graph)) < 3


def test_save_and_load_round_trip_onnx_and_ir_text(tmp_path):
    src = _gemm_relu(tmp_path / "m.onnx")
    model = passctl.load(src)
    passctl.save(model, tmp_path / "copy.onnx")
    passctl.save(model, tmp_path / "copy.pir")
    x = np.random.default_rng(2).standard_normal((2, 8)).astype(np.float32)
    want = _ort(src, {"x": x})[0]
    np.testing.assert_array_equal(_ort(tmp_path / "copy.onnx", {"x": x})[0], want)
    again = passctl.load(tmp_path / "copy.pir")
    passctl.save(again, tmp_path / "again.onnx")
    np.testing.assert_array_equal(_ort(tmp_path / "again.onnx", {"x": x})[0], want)


@pytest.mark.parametrize("call, needle", [
    (lambda d: passctl.compile(str(d / "missing.onnx")), "missing.onnx' not found"),
    (lambda d: passctl.compile(_gemm_relu(d / "m.onnx"), pipeline="no-such-pass",
                               output=str(d / "o")), "no-such-pass"),
    (lambda d: passctl.compile(_gemm_relu(d / "m.onnx"), target="no-such-target",
                               output=str(d / "o")), "no-such-target"),
    (lambda d: passctl.compile(_gemm_relu(d / "m.onnx"), output=str(d / "o"), colour=True),
     "unknown option 'colour'"),
    (lambda d: passctl.compile(12345), "cannot compile a int"),
    (lambda d: passctl.run(str(d)), str("")),
    (lambda d: passctl.save(passctl.load(_gemm_relu(d / "m.onnx")), d / "nope" / "x.onnx"),
     "does not exist"),
])
def test_api_errors_are_typed_user_errors_with_one_line_messages(tmp_path, call, needle):
    with pytest.raises(passctl.UserError) as info:
        call(tmp_path)
    message = str(info.value)
    assert needle in message and "\n" not in message


def test_a_failed_check_raises_check_failed_not_system_exit(tmp_path):
    src = _gemm_relu(tmp_path / "m.onnx")
    with pytest.raises(passctl.CheckFailed) as info:  # fp16 everywhere cannot meet rtol 1e-9
        passctl.compile(src, pipeline="amp{dtype=fp16,budget=1}", target="a10",
                        output=str(tmp_path / "o"), check=True, rtol=1e-9)
    assert isinstance(info.value, passctl.InternalError) and info.value.reproducer


def test_import_passctl_imports_no_framework_and_help_no_onnx():
    code = ("import sys, passctl; passctl.__version__; "
            "print(sorted(m for m in ('torch', 'tvm', 'transformers', 'onnx', 'numpy') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    code = ("import sys\nfrom passctl.tools.cli import main\ntry:\n    main(['--help'])\n"
            "finally:\n    print('LOADED', sorted(m for m in ('onnx', 'ml_dtypes', 'torch') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "exit codes:" in out.stdout and "examples:" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "LOADED []"


def test_pass_and_rule_api_are_re_exported_where_users_look():
    from passctl.passes import register, register_pass
    from passctl.passes.rewrite import RewriteRule, register_rule

    assert register is register_pass
    assert passctl.passes.RewriteRule is RewriteRule and passctl.passes.register_rule is register_rule


def test_wheel_metadata_publishes_no_test_pins():
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    extras = project["project"].get("optional-dependencies", {})
    assert "test" not in extras  # test pins live in [dependency-groups], not in the wheel
    assert set(extras) >= {"torch", "tvm", "tensorrt"}
    pinned = [d for deps in extras.values() for d in deps if "torch==" in d]
    assert pinned == []
    assert "test" in project["dependency-groups"]
