"""`reparam` on the real-model corpus (PP-OCR, silero-vad, ddddocr...): outputs unchanged in ONNX Runtime."""

from __future__ import annotations

import numpy as np
from reparam_helpers import reparam_stats, run_reparam

from passctl.support.check import run_onnxruntime

RTOL = 1e-5
# Two float32 ulps at 1.0: ppocr_det's random-input sigmoid outputs are all < 1e-5 and move in steps of
# 2**-23 (tests/cli/test_cli_corpus.py measured the same for fuse-conv-bn).
ATOL = 2 * float(np.finfo(np.float32).eps)


def test_corpus_model_outputs_unchanged(corpus_model):
    out, result = run_reparam(corpus_model.path)
    inputs = corpus_model.inputs(seed=0)
    ref, got = run_onnxruntime(corpus_model.path, inputs), run_onnxruntime(out, inputs)
    assert list(got) == list(ref)
    for name, a in ref.items():
        a64, b64 = np.asarray(a, np.float64), np.asarray(got[name], np.float64)
        assert a64.shape == b64.shape, name
        scale = max(float(np.max(np.abs(a64))) if a64.size else 0.0, 1e-12)
        assert float(np.max(np.abs(a64 - b64), initial=0.0)) <= max(RTOL * scale, ATOL), name
    # Each fold or merge replaced at least two nodes by one Conv.
    stats = reparam_stats(result)
    _, cleaned = run_reparam(corpus_model.path, "cleanup")
    nodes_after_cleanup = len(list(cleaned.model.graph))
    assert len(out.graph.node) <= nodes_after_cleanup - stats["folded"] - stats["merged"]
