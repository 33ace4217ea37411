"""quantize on PP-OCR (real weights, synthetic text images) through the passctl CLI with --check."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from ocr_images import cls_input, det_input, write_feeds
from passctl.tools.cli import main

DET = "rapidocr_onnxruntime:models/ch_PP-OCRv4_det_infer.onnx"
CLS = "rapidocr_onnxruntime:models/ch_ppocr_mobile_v2.0_cls_infer.onnx"


def _cli(capsys, *argv):
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


def _stats(out):
    report = json.loads((out / "report.json").read_text())
    return report, next(p["stats"] for p in report["passes"] if p["name"] == "quantize-int8")


def _symmetric_zero_points(path, unsigned: bool) -> int:
    """Number of Q/DQ nodes; asserts every zero point is int8 0 (TensorRT's form) or, for
    ``unsigned`` (the cpu form), int8 0 on weights and on activations uint8 128, or uint8 0 for
    tensors calibrated >= 0 (tests/passes/quantize/test_quantize_int8.py checks which)."""
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    qdq = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    for n in qdq:
        zero = inits[n.input[2]]
        weight = n.op_type == "DequantizeLinear" and n.input[0] in inits
        if unsigned and not weight:
            assert zero.dtype == np.uint8 and zero.size == 1 and int(zero) in (0, 128), n.name
        else:
            assert zero.dtype == np.int8 and not zero.any(), n.name
    return len(qdq)


_TRT_SHAPES = ('tensorrt{shapes="p2o.DynamicDimension.0=1,p2o.DynamicDimension.1=128,'
               'p2o.DynamicDimension.2=128"}')


@pytest.mark.parametrize("target,emit", [("cpu", "onnxruntime"), ("a10", _TRT_SHAPES)])
def test_ppocr_det_cleanup_fuse_quantize_checks(tmp_path, capsys, target, emit):
    calib = write_feeds(tmp_path / "calib", [det_input(128, 128, seed) for seed in range(3)])
    # the budget holds on the calibration feeds (what the pass measures); unseen images can differ
    # more (benchmarks/quantize.py measures that), so the check runs on a calibration image
    np.savez(tmp_path / "check.npz", **det_input(128, 128, seed=1))
    out = tmp_path / "out"
    rc, text = _cli(capsys, DET, "--pipeline",
                    f"cleanup,fuse,quantize{{calib={calib},metric=max-rel}}", "--target", target,
                    "--emit", emit, "--check", "--inputs", tmp_path / "check.npz", "-o", out)
    assert rc == 0, text
    assert "the quantize pass's budget" in text
    report, stats = _stats(out)
    assert report["check"]["ok"] and report["check"]["rtol"] == 0.02
    assert stats["error"] <= stats["budget"] == 0.02 and stats["metric"] == "max-rel"
    assert stats["quantized_layers"] >= 1 and stats["calibration_feeds"] == 3
    assert stats["opset_raised"] == [12, 13]
    count = _symmetric_zero_points(out / "model.onnx", unsigned=target == "cpu")
    if target == "a10":  # input-side Q/DQ only (TensorRT's placement), one per layer
        assert count == 3 * stats["quantized_layers"] and not stats["outputs_quantized"]
        precision = json.loads((out / "precision.json").read_text())
        assert precision["summary"].get("int8", 0) >= stats["quantized_layers"]


def test_ppocr_cls_quantize_meets_budget_and_falls_back(tmp_path, capsys):
    calib = write_feeds(tmp_path / "calib", [cls_input(seed) for seed in range(3)])
    np.savez(tmp_path / "check.npz", **cls_input(seed=2))
    out = tmp_path / "out"
    rc, text = _cli(capsys, CLS, "--pipeline",
                    f"quantize{{calib={calib},metric=max-rel,budget=1e-2}}",
                    "--target", "cpu", "--check", "--inputs", tmp_path / "check.npz", "-o", out)
    assert rc == 0, text
    report, stats = _stats(out)
    assert report["check"]["ok"] and report["check"]["max_rel"] <= 1e-2
    assert stats["error"] <= 1e-2 and stats["within_budget"]
    kept = [l for l in stats["layers"] if l["precision"] == "fp32"]
    # the all-int8 cls misses 1e-2: layers fall back
    assert kept and all("measured sensitivity" in l["why"] for l in kept)
    assert stats["search"]["history"][0][0] == 0 and stats["search"]["history"][0][1] > 1e-2


def test_minilm_matmuls_meet_the_budget(tmp_path):
    # all-MiniLM-L6-v2 (real weights, cached export from tests/corpus.py): the 2-D weight MatMuls
    from corpus import CORPUS

    from passctl.ir import load, save
    from passctl.passes import PassManager, build_pipeline
    from passctl.support.check import cpu_session
    from passctl.support.inputs import make_inputs

    path = CORPUS["minilm_legacy"].path
    model = load(path)
    pipeline = build_pipeline("quantize{dims=batch=1;sequence=16,sensitivity=local}")
    result = PassManager(pipeline).run(model)
    stats = next(r.stats for r in result.records if r.name == "quantize-int8")
    save(model, str(tmp_path / "q.onnx"))
    assert stats["quantized_layers"] >= 1 and stats["error"] <= 2e-2
    assert {l["op"] for l in stats["layers"] if l["precision"] == "int8"} == {"MatMul"}
    original, quantized = cpu_session(path), cpu_session(str(tmp_path / "q.onnx"))  # unoptimized
    worst = 0.0
    for seed in (0, 1):  # the pass's random feeds: samples=2, seed=0
        feed = make_inputs(path, seed=seed, dim_values={"batch": 1, "sequence": 16})
        ref, got = original.run(None, feed), quantized.run(None, feed)
        for r, c in zip(ref, got):
            r, c = r.astype(np.float64), c.astype(np.float64)
            worst = max(worst, np.abs(r - c).sum() / np.abs(r).sum())
    assert worst == pytest.approx(stats["error"], rel=1e-3)
