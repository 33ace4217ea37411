"""Peak RSS of compiling a Llama decoder with ~380 MB of fp16 external data (int4 pipeline; the ORT
load check and verify skipped by PASSCTL_RUN_MAX_WEIGHT_BYTES, so import, passes and emit are
measured): ru_maxrss of the compile subprocess against the data's size.

The bound: the data once plus 250 MB (the interpreter, onnx / numpy / onnxruntime imports are about
120 MB). A compile that holds the fp16 weights twice (a float copy beside the external data, or all
int4 codes beside their float source) exceeds it; main before the streaming change peaked at 3.6x
the data (4.81 GB for 1.33 GB, 2-layer 7B width). Measured 434 MB for 388 MB, 400 MB after the
codes-view fix (7e0bf0a); at this size the fixed cost dominates: the full LLaMA-7B shape peaks at
0.61 GB for 13.48 GB (benchmarks/results/compile_7b_memory-2026-12-02b.md, issue 18)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from compile_7b_memory import LlamaShape, passctl_command, run_measured, write_model  # noqa: E402


@pytest.mark.slow
def test_peak_rss_holds_the_weights_at_most_once(tmp_path):
    src = str(tmp_path / "model.onnx")
    data = write_model(src, LlamaShape(layers=10, hidden=1024, heads=16, ffn=2816, vocab=32000))
    env = dict(os.environ, PASSCTL_RUN_MAX_WEIGHT_BYTES="1000000")
    r = run_measured("passctl", passctl_command(src, str(tmp_path / "out")), 600,
                     str(tmp_path / "log"), env=env)
    assert r.rc == 0, (tmp_path / "log").read_text()[-2000:]
    print(f"data {data / 1e6:.0f} MB, peak RSS {r.peak_rss_bytes / 1e6:.0f} MB")
    assert r.peak_rss_bytes < data + 250e6


def test_peak_rss_is_the_commands_own_not_the_callers(tmp_path):
    """ru_maxrss of a child spawned straight from a large process starts at the caller's size
    (Linux keeps the forked image's high-water mark at exec); run_measured must not report it.
    The caller holds 600 MB; an empty interpreter must measure under 150 MB, and a child that
    touches 300 MB must measure at least that (numpy on the caller's and the child's side)."""
    held = np.ones(600 * 2**20 // 8)  # 600 MiB resident in this process
    try:
        small = run_measured("empty", [sys.executable, "-c", "pass"], 60, str(tmp_path / "a.log"))
        big = run_measured("300MB", [sys.executable, "-c",
                                     "import numpy as np; a = np.ones(300 * 2**20 // 8); print(a[-1])"],
                           60, str(tmp_path / "b.log"))
    finally:
        del held
    assert small.rc == 0 and big.rc == 0, (small.note, big.note)
    assert small.peak_rss_bytes < 150e6, small.peak_rss_bytes
    assert 300 * 2**20 <= big.peak_rss_bytes < 600 * 2**20, big.peak_rss_bytes
