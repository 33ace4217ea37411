"""Peak RSS of compiling a Llama decoder with ~380 MB of fp16 external data (int4 pipeline; the ORT
load check and verify skipped by PASSCTL_RUN_MAX_WEIGHT_BYTES, so import, passes and emit are
measured): ru_maxrss of the compile subprocess against the data's size."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from compile_7b_memory import LlamaShape, passctl_command, run_measured, write_model  # noqa: E402


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="measured 2026-12-02: 434 MB peak RSS for 388 MB of data "
                   "(~120 MB is the interpreter and imports); the rest is not yet traced (issue 18)")
def test_peak_rss_below_weight_bytes(tmp_path):
    src = str(tmp_path / "model.onnx")
    data = write_model(src, LlamaShape(layers=10, hidden=1024, heads=16, ffn=2816, vocab=32000))
    env = dict(os.environ, PASSCTL_RUN_MAX_WEIGHT_BYTES="1000000")
    r = run_measured("passctl", passctl_command(src, str(tmp_path / "out")), 600,
                     str(tmp_path / "log"), env=env)
    assert r.rc == 0, (tmp_path / "log").read_text()[-2000:]
    print(f"data {data / 1e6:.0f} MB, peak RSS {r.peak_rss_bytes / 1e6:.0f} MB")
    assert r.peak_rss_bytes < 0.9 * data
