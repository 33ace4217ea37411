"""Peak RSS of compiling a Llama decoder with ~380 MB of fp16 external data (int4 pipeline; the ORT
load check and verify skipped by PASSCTL_RUN_MAX_WEIGHT_BYTES, so import, passes and emit are
measured): ru_maxrss of the compile subprocess against the data's size.

The bound: the data once plus 250 MB (the interpreter, onnx / numpy / onnxruntime imports are about
120 MB). A compile that holds the fp16 weights twice (a float copy beside the external data, or all
int4 codes beside their float source) exceeds it; main before the streaming change peaked at 3.6x
the data (4.81 GB for 1.33 GB, 2-layer 7B width). The issue's goal, well below the data size, is not
reached yet: measured 434 MB for 388 MB (issue 18)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

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
