"""quantize's error and --check measure the artifact as it ships (session.json's ORT_ENABLE_ALL)."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

from ocr_images import det_input, write_feeds
from passctl.support.check import cpu_session
from passctl.tools.cli import main

_MODELS = os.path.join(os.path.dirname(importlib.util.find_spec("rapidocr_onnxruntime").origin),
                       "models")
DET = os.path.join(_MODELS, "ch_PP-OCRv4_det_infer.onnx")


def _session(path, level: str):
    """A CPU session of ``path`` at ONNX Runtime graph optimization ``level`` (e.g.
    ``"ORT_ENABLE_ALL"``, :func:`passctl.support.check.cpu_session`)."""
    return cpu_session(str(path), optimize=level)


def _mean_rel(reference, candidate, feeds) -> float:
    """Worst sum |r - c| / sum |r| over outputs and feeds (numpy, float64)."""
    worst = 0.0
    for feed in feeds:
        for r, c in zip(reference.run(None, feed), candidate.run(None, feed)):
            r, c = r.astype(np.float64), c.astype(np.float64)
            worst = max(worst, float(np.abs(r - c).sum() / np.abs(r).sum()))
    return worst


def test_ppocr_det_cpu_error_and_check_are_the_shipped_sessions(tmp_path, capsys):
    feeds = [det_input(128, 128, seed) for seed in range(3)]
    calib = write_feeds(tmp_path / "calib", feeds)
    check = det_input(128, 128, seed=7)  # not a calibration image
    np.savez(tmp_path / "check.npz", **check)
    out = tmp_path / "out"
    rc = main([DET, "--pipeline", f"quantize{{calib={calib},metric=mean-rel,budget=3e-2}}",
               "--target", "cpu", "--check", "--inputs", str(tmp_path / "check.npz"),
               "-o", str(out), "-q"])
    assert rc == 0, capsys.readouterr()
    report = json.loads((out / "report.json").read_text())
    stats = next(p["stats"] for p in report["passes"] if p["name"] == "quantize-int8")
    assert json.loads((out / "session.json").read_text())["graph_optimization_level"] == \
        "ORT_ENABLE_ALL"
    original = _session(DET, "ORT_DISABLE_ALL")
    shipped = _session(out / "model.onnx", "ORT_ENABLE_ALL")
    unfused = _session(out / "model.onnx", "ORT_DISABLE_ALL")
    as_shipped = _mean_rel(original, shipped, feeds)
    as_written = _mean_rel(original, unfused, feeds)
    # the QLinearConv kernels' fixed-point requantization changes the error measurably
    assert abs(as_shipped - as_written) > 0.05 * as_shipped
    assert stats["measured_with"] == "ORT_ENABLE_ALL"
    assert stats["error"] == pytest.approx(as_shipped, rel=1e-3)  # 4 significant digits
    assert stats["error"] <= stats["budget"] and stats["within_budget"]
    entry = report["check"]
    assert entry["optimization"] == "ORT_ENABLE_ALL" and entry["metric"] == "mean-rel"
    assert entry["metric_error"] == pytest.approx(_mean_rel(original, shipped, [check]), rel=1e-6)
    assert entry["metric_error"] != pytest.approx(_mean_rel(original, unfused, [check]), rel=1e-3)


def _conv_model(path) -> str:
    """x [1, 8, 16, 16] -> Conv(16, 3x3) -> Relu -> Conv(8, 3x3) -> y."""
    from small_graphs import conv_relu_conv  # tests/small_graphs.py

    return conv_relu_conv(path)


@pytest.mark.parametrize("target,emit,level", [
    ("cpu", "onnxruntime", "ORT_ENABLE_ALL"), ("a10", "tensorrt", "ORT_DISABLE_ALL")])
def test_check_runs_onnxruntime_artifacts_as_session_json_and_tensorrt_as_written(
        tmp_path, capsys, target, emit, level):
    model = _conv_model(tmp_path / "convs.onnx")
    out = tmp_path / "out"
    rc = main([model, "--pipeline", "quantize{metric=mean-rel,budget=0.5}", "--target", target,
               "--emit", emit, "--check", "--seed", "3", "-o", str(out), "-q"])
    assert rc == 0, capsys.readouterr()
    report = json.loads((out / "report.json").read_text())
    stats = next(p["stats"] for p in report["passes"] if p["name"] == "quantize-int8")
    assert stats["measured_with"] == level and stats["quantized_layers"] == 2
    entry = report["check"]
    assert entry["optimization"] == level
    from passctl.support.inputs import make_inputs

    feed = make_inputs(model, seed=3)
    original = _session(model, "ORT_DISABLE_ALL")
    candidate = _session(out / "model.onnx", level)
    assert entry["metric_error"] == pytest.approx(_mean_rel(original, candidate, [feed]), rel=1e-9)


def test_quantize_measures_at_the_level_the_emitter_is_told(tmp_path, capsys):
    # --emit 'onnxruntime{optimization_level=basic}' ships ORT_ENABLE_BASIC (no QLinearConv
    # fusion): the pass measures there too, and its error is the shipped session's
    feeds = [det_input(96, 96, seed) for seed in range(2)]
    calib = write_feeds(tmp_path / "calib", feeds)
    out = tmp_path / "out"
    rc = main([DET, "--pipeline", f"quantize{{calib={calib},metric=mean-rel,budget=1}}",
               "--emit", "onnxruntime{optimization_level=basic}", "-o", str(out), "-q"])
    assert rc == 0, capsys.readouterr()
    report = json.loads((out / "report.json").read_text())
    stats = next(p["stats"] for p in report["passes"] if p["name"] == "quantize-int8")
    assert json.loads((out / "session.json").read_text())["graph_optimization_level"] == \
        "ORT_ENABLE_BASIC"
    assert stats["measured_with"] == "ORT_ENABLE_BASIC"
    shipped = _mean_rel(_session(DET, "ORT_DISABLE_ALL"),
                        _session(out / "model.onnx", "ORT_ENABLE_BASIC"), feeds)
    assert stats["error"] == pytest.approx(shipped, rel=1e-3)
