"""Every corpus model through ``passctl MODEL --pipeline cleanup,fuse-conv-bn --check``."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from cli_helpers import sha256, unused_initializers  # tests/cli/cli_helpers.py

PIPELINE = "cleanup,fuse-conv-bn"
RTOL = 1e-5
# Absolute floor: two float32 ulps at 1.0. ONNX Runtime's Sigmoid returns values near 0 in steps of
# 2**-23 (measured on ppocr_det, whose random-input probabilities are all < 1e-5: logits that agree
# to 7.6e-7 relative give sigmoid outputs 0.0 vs 1.19e-7, a "relative" error of 1.4e-2).
ATOL = 2 * float(np.finfo(np.float32).eps)
CLS_SPEC = "rapidocr_onnxruntime:models/ch_ppocr_mobile_v2.0_cls_infer.onnx"


def _check_args(model, tmp_path):
    """--dim / --inputs options carrying the corpus model's input sizes and fixed arrays."""
    args = []
    for name, size in model.dim_values.items():
        args += ["--dim", f"{name}={size}"]
    if model.input_overrides:
        path = tmp_path / "inputs.npz"
        np.savez(path, **{k: np.asarray(v) for k, v in model.input_overrides.items()})
        args += ["--inputs", str(path)]
    return args


def _ort_outputs(path, inputs):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, inputs)))


def test_corpus_model_compiles_and_matches_original(corpus_model, cli, tmp_path):
    src = corpus_model.path
    digest = sha256(src)
    out = tmp_path / "out"
    r = cli(src, "--pipeline", PIPELINE, "--target", "cpu", "--check", "-o", out, "-q",
            *_check_args(corpus_model, tmp_path))
    assert r.rc == 0, r.err
    assert sha256(src) == digest, "the input model file was modified"
    assert (out / "model.onnx").is_file() and (out / "session.json").is_file()

    # Recomputed here, independently of passctl's --check: ORT on the original vs on the artifact.
    inputs = corpus_model.inputs(seed=0)
    ref, got = _ort_outputs(src, inputs), _ort_outputs(out / "model.onnx", inputs)
    assert list(got) == list(ref)
    for name, a in ref.items():
        b = got[name]
        assert b.shape == a.shape and b.dtype == a.dtype, name
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        scale = max(float(np.max(np.abs(a64))), 1e-30) if a.size else 1.0
        err = float(np.max(np.abs(a64 - b64))) if a.size else 0.0
        assert err <= RTOL * scale + ATOL, (
            f"{corpus_model.id} output {name}: max abs error {err:.3g}, relative {err / scale:.3g}")

    report = json.loads((out / "report.json").read_text())
    assert report["check"]["ok"] is True
    assert report["check"]["seed"] == 0
    assert [(i["name"], tuple(i["shape"]), i["dtype"]) for i in report["check"]["inputs"]] == [
        (k, v.shape, str(v.dtype)) for k, v in inputs.items()]
    assert report["pipeline"]["passes"][-2:] == ["fuse-conv-bn", "dce"]  # compile's final dce
    assert unused_initializers(out / "model.onnx") == []
    assert sum(report["op_histogram"]["after"].values()) == report["nodes"]["after"]


def _folded(report):
    (bn_pass,) = [p for p in report["passes"] if p["name"] == "fuse-conv-bn"]
    return bn_pass


def test_ppocr_cls_folds_all_35_batchnorms(cli, tmp_path):
    out = tmp_path / "cls"
    r = cli(CLS_SPEC, "--pipeline", PIPELINE, "--target", "cpu", "--check", "-o", out,
            "--dim", "x[2]=48", "--dim", "x[3]=192")
    assert r.rc == 0, r.err
    report = json.loads((out / "report.json").read_text())
    assert report["op_histogram"]["before"]["BatchNormalization"] == 35
    assert "BatchNormalization" not in report["op_histogram"]["after"]
    bn_pass = _folded(report)
    assert bn_pass["modified"] is True and bn_pass["stats"]["fused"] == 35
    assert report["check"]["ok"] and float(report["check"]["max_rel"]) <= 1e-5
    # The terminal summary names the pass that fired, the node counts and the artifact.
    assert "fuse-conv-bn" in r.out and "fused=35" in r.out
    assert f"nodes: {report['nodes']['before']} -> {report['nodes']['after']}" in r.out
    assert str(out) in r.out.replace("\n", "")


def test_readme_command_as_subprocess(tmp_path):
    """The README's command, run as a real console script in a fresh process."""
    passctl = Path(sys.executable).parent / "passctl"
    proc = subprocess.run([str(passctl), CLS_SPEC, "--pipeline", PIPELINE, "--target", "cpu",
                           "--check", "-o", "out/cls"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, COLUMNS="200"))
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out" / "cls"
    report = json.loads((out / "report.json").read_text())
    assert report["artifact"]["path"] == str(out)
    assert report["artifact"]["load_check"]["ok"] is True
    assert _folded(report)["stats"]["fused"] == 35
    assert "check: max abs error" in proc.stdout


def test_ppocr_det_near_zero_output_passes_with_the_atol_floor(cli, tmp_path):
    """PP-OCRv4 det's probabilities are all < 1e-5 on random inputs; ORT's Sigmoid steps of 2**-23
    make a correct BN fold look 1.4e-2 "relative" off. --check and --check-each both accept it
    through --atol (default 2.4e-7) and both reject it with --atol 0."""
    det = "rapidocr_onnxruntime:models/ch_PP-OCRv4_det_infer.onnx"
    dims = ["--dim", "x[0]=1", "--dim", "x[2]=64", "--dim", "x[3]=64"]
    out = tmp_path / "det"
    r = cli(det, "--pipeline", PIPELINE, "--check", "--check-each", "-o", out, "-q", *dims)
    assert r.rc == 0, r.err
    report = json.loads((out / "report.json").read_text())
    (output,) = report["check"]["outputs"]
    assert output["max_rel"] > 1e-4 and output["max_abs"] <= 2.4e-7 and output["ok"]
    assert all(e["ok"] for e in report["check_each"])
    assert "FAILED" not in r.out
    r = cli(det, "--pipeline", PIPELINE, "--check", "--check-each", "--atol", "0", "-q",
            "-o", tmp_path / "det0", "--reproducer-dir", tmp_path / "crash", *dims)
    assert r.rc == 3 and "numeric check failed: output sigmoid_0.tmp_0" in r.err
    assert re.search(r"^check after \d{3} fuse-conv-bn: .*\(FAILED: sigmoid_0", r.out, re.M)
    assert not (tmp_path / "det0").exists()
