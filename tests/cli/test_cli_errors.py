"""Exit codes: 2 and one line for user errors, 3 and a reproducer for crashes; no OUT then."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from cli_helpers import conv_bn_proto, sha256  # tests/cli/cli_helpers.py

from passctl.targets import get_target

RAISING_PLUGIN = '''
from passctl.passes.base import Pass
from passctl.passes.registry import register_pass


@register_pass(replace=True)
class ExplodePass(Pass):
    name = "explode"
    summary = "a pass that always raises (tests the crash reproducer)"

    def run(self, model):
        raise RuntimeError("boom in explode")
'''


def _assert_user_error(r, *fragments):
    assert r.rc == 2, (r.out, r.err)
    lines = r.err.strip().splitlines()
    assert len(lines) == 1, r.err
    assert lines[0].startswith("passctl: error: ")
    assert "Traceback" not in r.err
    for f in fragments:
        assert f in lines[0], lines[0]


def test_missing_file(cli, tmp_path):
    r = cli(tmp_path / "nope.onnx", "-o", tmp_path / "out")
    _assert_user_error(r, "nope.onnx", "not found")
    assert not (tmp_path / "out").exists()


def test_not_an_onnx_file(cli, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\x01 this is not a protobuf \xff\xfe" * 10)
    r = cli(bad, "-o", tmp_path / "out")
    _assert_user_error(r, "bad.onnx")
    assert not (tmp_path / "out").exists()


def test_unknown_package(cli, tmp_path):
    r = cli("no_such_pkg_xyz:models/a.onnx", "-o", tmp_path / "out")
    _assert_user_error(r, "package 'no_such_pkg_xyz' is not installed")


def test_unknown_pass_suggests(cli, conv_bn_model, tmp_path):
    r = cli(conv_bn_model, "--pipeline", "cleanup,fuse-conv-bm", "-o", tmp_path / "out")
    _assert_user_error(r, "fuse-conv-bm", "did you mean 'fuse-conv-bn'")
    assert not (tmp_path / "out").exists()


def test_unknown_target_suggests(cli, conv_bn_model, tmp_path):
    r = cli("--pipeline", "cleanup", "--target", "a01", conv_bn_model, "-o", tmp_path / "out")
    _assert_user_error(r, "unknown target 'a01'", "'a10'")
    assert not (tmp_path / "out").exists()


def test_alias_without_passes_says_so(cli, conv_bn_model, tmp_path, monkeypatch):
    # A group reserved for a later feature (as `quantize` was) fails with the reason it has none.
    from passctl.passes import pipelines

    monkeypatch.setitem(pipelines.ALIASES, "future-group", {"cpu": []})
    monkeypatch.setitem(pipelines.NOT_YET, "future-group", "time travel is not implemented yet")
    r = cli("--pipeline", "fuse-conv-bn,future-group", "--target", "a10", conv_bn_model,
            "-o", tmp_path / "out")
    _assert_user_error(r, "future-group", "time travel is not implemented yet")
    assert not (tmp_path / "out").exists()


def test_options_before_the_model(cli, conv_bn_model, tmp_path):
    # The card's form: `passctl --pipeline P --target T model.onnx`.
    out = tmp_path / "out"
    r = cli("--pipeline", "cleanup,fuse-conv-bn", "--target", "a10", conv_bn_model, "-o", out)
    assert r.rc == 0, r.err
    report = json.loads((out / "report.json").read_text())
    assert report["target"]["name"] == "a10" and report["target"]["compute_capability"] == "sm_86"
    session = json.loads((out / "session.json").read_text())
    assert session["execution_providers"][0][0] == "CUDAExecutionProvider"


def test_tensorrt_emitter_refuses_the_cpu_target(cli, conv_bn_model, tmp_path):
    r = cli(conv_bn_model, "--emit", "tensorrt", "-o", tmp_path / "out")
    _assert_user_error(r, "target 'cpu': TensorRT runs on NVIDIA GPUs; give a GPU target")
    assert not (tmp_path / "out").exists()


def test_tensorrt_emitter_end_to_end(cli, conv_bn_model, tmp_path):
    """--emit tensorrt for a10 with --check: the check runs the artifact's model.onnx against the
    original (ONNX Runtime on both), and the manifest says why no engine was built here."""
    out = tmp_path / "out"
    r = cli("--pipeline", "cleanup,fuse", "--target", "a10", "--emit", "tensorrt", "--check",
            conv_bn_model, "-o", out)
    assert r.rc == 0, r.err
    report = json.loads((out / "report.json").read_text())
    assert report["check"]["ok"] and report["check"]["max_rel"] <= 1e-5
    manifest = json.loads((out / "manifest.json").read_text())
    from passctl.targets.tensorrt.engine import engine_unavailable

    why = engine_unavailable(get_target("a10"))
    assert (manifest["engine"] is None) == (why is not None)


def test_bad_option_is_one_line(cli, conv_bn_model):
    r = cli(conv_bn_model, "--no-such-option")
    _assert_user_error(r, "--no-such-option")


def test_plugin_pass_that_raises_exits_3_with_reproducer(cli, conv_bn_model, tmp_path):
    plugin = tmp_path / "explode.py"
    plugin.write_text(RAISING_PLUGIN)
    digest = sha256(conv_bn_model)
    out, repro_root = tmp_path / "out", tmp_path / "crashes"
    r = cli(conv_bn_model, "--load", plugin, "--pipeline", "eliminate-identity,explode",
            "-o", out, "--reproducer-dir", repro_root)
    assert r.rc == 3, (r.out, r.err)
    assert "Traceback" not in r.err
    assert "pass 'explode' failed after passes [eliminate-identity]" in r.err
    assert "boom in explode" in r.err
    (repro_line,) = [ln for ln in r.err.splitlines() if ln.startswith("passctl: reproducer: ")]
    folder = Path(repro_line.split(": ", 2)[2])
    assert folder.parent == repro_root and folder.name == "002_explode"
    assert {"error.txt", "input.onnx", "input.pir", "pipeline.txt", "plugins",
            "reproduce.sh"} <= set(os.listdir(folder))
    assert os.listdir(folder / "plugins") == ["explode.py"]
    assert (folder / "pipeline.txt").read_text().strip() == "explode"
    assert "boom in explode" in (folder / "error.txt").read_text()
    # The reproducer's input is the IR the failing pass got: Identity already removed, same math.
    sess = ort.InferenceSession(str(folder / "input.onnx"), providers=["CPUExecutionProvider"])
    assert "Identity" not in [n.op_type for n in onnx.load(str(folder / "input.onnx")).graph.node]
    ref = ort.InferenceSession(conv_bn_proto().SerializeToString(),
                               providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0],
                               rtol=1e-6, atol=1e-6)
    assert not out.exists()
    assert sha256(conv_bn_model) == digest
    # Running the reproducer fails the same way, with the same exit code.
    venv_bin = Path(sys.executable).parent
    assert venv_bin.is_dir()  # reproduce.sh runs this interpreter: no passctl on PATH needed
    proc = subprocess.run(["sh", str(folder / "reproduce.sh")], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, OUT=str(tmp_path / "rerun"),
                                                PATH="/usr/bin:/bin"))
    assert proc.returncode == 3, proc.stderr
    assert "boom in explode" in proc.stderr
    assert f"reproducer: {tmp_path / 'reproducers'}" in proc.stderr  # not under /tmp


def test_success_replaces_existing_output_and_leaves_input(cli, conv_bn_model, tmp_path):
    out = tmp_path / "out"
    assert cli(conv_bn_model, "--pipeline", "fuse-conv-bn", "-o", out, "-q").rc == 0
    (out / "model.onnx.data").write_text("stale weights of an older artifact")
    digest = sha256(conv_bn_model)
    r = cli(conv_bn_model, "--pipeline", "cleanup", "-o", out, "-q")
    assert r.rc == 0, r.err
    assert sorted(os.listdir(out)) == ["model.onnx", "report.json", "session.json"]
    assert sha256(conv_bn_model) == digest
    assert sorted(os.listdir(tmp_path)) == ["conv_bn.onnx", "out"]


def test_bug_outside_passes_exits_3_with_traceback_in_reproducer(cli, conv_bn_model, tmp_path,
                                                                 monkeypatch):
    import passctl.tools.compile as compile_module

    def broken_histogram(model):
        raise KeyError("simulated bug in op_histogram")

    monkeypatch.setattr(compile_module, "op_histogram", broken_histogram)
    out = tmp_path / "out"
    r = cli(conv_bn_model, "-o", out, "--reproducer-dir", tmp_path / "crash")
    assert r.rc == 3
    assert "Traceback" not in r.err
    assert "passctl: internal error: KeyError: 'simulated bug in op_histogram'" in r.err
    folder = Path(r.err.split("passctl: reproducer: ")[1].strip())
    assert "simulated bug in op_histogram" in (folder / "traceback.txt").read_text()
    command = (folder / "command.sh").read_text()
    assert str(conv_bn_model) in command
    assert f"{shlex.quote(sys.executable)} -m passctl.tools.cli compile " in command or \
        f"{shlex.quote(sys.executable)} -m passctl.tools.cli {shlex.quote(str(conv_bn_model))}" in command
    assert not out.exists()


def test_output_folder_holding_the_input_is_refused(cli, conv_bn_model, tmp_path):
    digest = sha256(conv_bn_model)
    r = cli(conv_bn_model, "-o", tmp_path)
    _assert_user_error(r, "contains the input model", "choose another -o")
    assert sha256(conv_bn_model) == digest
    assert sorted(os.listdir(tmp_path)) == ["conv_bn.onnx"]


def test_ir_text_parse_error_names_file_line_column(cli, tmp_path):
    pir = tmp_path / "broken.pir"
    pir.write_text("model ir_version 8 opset {\"\": 17} {\n  graph @g(%x: f32[2]) -> (f32[2]) {\n"
                   "    %y = Relu(%x\n    return %y\n  }\n}\n")
    r = cli(pir, "-o", tmp_path / "out")
    _assert_user_error(r, f"{pir}:4:5: expected ',' or ')'")
    assert not (tmp_path / "out").exists()


def test_output_that_is_a_file_is_refused(cli, conv_bn_model, tmp_path):
    target = tmp_path / "taken"
    target.write_text("keep me")
    r = cli(conv_bn_model, "-o", target)
    _assert_user_error(r, "is a file; give a folder path with -o")
    assert target.read_text() == "keep me"


def test_bad_inputs_file_and_dim(cli, conv_bn_model, tmp_path):
    import numpy as np

    npy = tmp_path / "x.npy"
    np.save(npy, np.zeros((1, 3, 8, 8), np.float32))
    r = cli(conv_bn_model, "--check", "--inputs", npy, "-o", tmp_path / "out")
    _assert_user_error(r, "not an .npz archive")
    r = cli(conv_bn_model, "--check", "--dim", "batch=zero", "-o", tmp_path / "out")
    _assert_user_error(r, "--dim 'batch=zero': expected NAME=SIZE")
    npz = tmp_path / "x.npz"
    np.savez(npz, not_an_input=np.zeros(2, np.float32))
    r = cli(conv_bn_model, "--check", "--inputs", npz, "-o", tmp_path / "out")
    _assert_user_error(r, "not_an_input")
    assert not (tmp_path / "out").exists()


SILERO = "silero_vad:data/silero_vad_16k_op15.onnx"  # reflect-pads its input by 64: needs >= 65 samples
CLS_SPEC = "rapidocr_onnxruntime:models/ch_ppocr_mobile_v2.0_cls_infer.onnx"


def test_check_inputs_the_original_cannot_run_are_a_user_error(cli, tmp_path):
    """The default sequence size (16) is too short for Silero VAD's STFT padding: ONNX Runtime fails
    on the original model itself, which is the user's --dim to give, not an internal error."""
    r = cli(SILERO, "--pipeline", "cleanup", "--check", "-o", tmp_path / "out")
    _assert_user_error(r, "--check: the original model fails on the seeded inputs (input [1, 16]",
                       "Pad reflect", "give sizes that fit with --dim NAME=SIZE")
    assert not (tmp_path / "out").exists()
    r = cli(SILERO, "--pipeline", "cleanup", "--check", "--dim", "sequence=512", "-o", tmp_path / "out")
    assert r.rc == 0, r.err


def test_tensorrt_check_runs_at_the_profile_opt_sizes(cli, tmp_path):
    out = tmp_path / "out"
    r = cli(SILERO, "--pipeline", "cleanup,fuse", "--target", "a10", "--check", "--emit",
            'tensorrt{shapes="batch=1,sequence=256:512:1024"}', "-o", out)
    assert r.rc == 0, r.err
    check = json.loads((out / "report.json").read_text())["check"]
    assert check["ok"] and check["inputs"][0] == {"name": "input", "shape": [1, 512], "dtype": "float32"}


def test_tensorrt_missing_shapes_fail_before_any_pass(cli, tmp_path):
    """A dynamic dim without a tensorrt{shapes} range is refused on the loaded model, before the
    pipeline runs (the 'explode' pass would crash if it ran)."""
    plugin = tmp_path / "explode_plugin.py"
    plugin.write_text(RAISING_PLUGIN)
    r = cli(CLS_SPEC, "--load", plugin, "--pipeline", "explode", "--target", "a10", "--emit",
            "tensorrt", "-o", tmp_path / "out")
    _assert_user_error(r, "TensorRT needs a size range for every dynamic input dim; missing: x[0], "
                          "x[2], x[3]", "x[0]=MIN:OPT:MAX")
    assert not (tmp_path / "out").exists()


def test_quantize_for_tensorrt_calibrates_at_the_profile_opt_sizes(cli, tmp_path):
    """quantize with neither calib= nor dims= measures its budget at the sizes the engine is tuned
    for, which is where --check runs: the headline command passes at the default budget."""
    out = tmp_path / "out"
    r = cli(CLS_SPEC, "--pipeline", "cleanup,fuse,quantize", "--target", "a10", "--check", "--emit",
            'tensorrt{shapes="x[0]=1:4:16,x[2]=48,x[3]=192:192:320"}', "-o", out)
    assert r.rc == 0, r.err
    assert ("note: quantize-int8 calibrates at the emitter's input sizes x[0]=4, x[2]=48, x[3]=192"
            in r.out)
    report = json.loads((out / "report.json").read_text())
    check = report["check"]
    assert check["ok"] and check["metric"] == "mean-rel" and check["metric_error"] <= 0.02
    assert check["inputs"][0]["shape"] == [4, 3, 48, 192]
    stats = next(p["stats"] for p in report["passes"] if p["name"] == "quantize-int8")
    assert stats["quantized_layers"] >= 1


def test_check_of_a_bf16_gpu_artifact_says_the_cpu_cannot_run_it(cli, tmp_path):
    """amp{dtype=bf16} for a100 is valid ONNX that ONNX Runtime's CPU provider has no bf16 MatMul
    for: --check is a one-line user error with the way out (emulate=true), and that way works."""
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 16])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 16])], [w])
    path = tmp_path / "mm.onnx"
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]),
              str(path))
    r = cli(path, "--pipeline", "amp{dtype=bf16,measure=false}", "--target", "a100", "--check",
            "-o", tmp_path / "out")
    _assert_user_error(r, "--check runs the artifact on ONNX Runtime's CPU provider, which cannot "
                          "run it", "amp{emulate=true}")
    assert not (tmp_path / "out").exists()
    r = cli(path, "--pipeline", "amp{dtype=bf16,measure=false}", "--target", "a100", "-o",
            tmp_path / "out")
    assert r.rc == 0, r.err  # without --check the artifact is written (validated by onnx.checker)
    r = cli(path, "--pipeline", "amp{dtype=bf16,measure=false,emulate=true}", "--target", "a100",
            "--check", "-o", tmp_path / "emulated")
    assert r.rc == 0, r.err
