"""benchmarks/reparam.py runs end to end (RepVGG-A0 at 64x64) and prints its latency row."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_repvgg_row_printed_with_measurements():
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "reparam.py"), "--models", "repvgg_a0",
                           "--size", "64", "--runs", "30", "--warmup", "2", "--ort-levels", "all"],
                          capture_output=True, text=True, timeout=300, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("repvgg_a0"))
    m = re.match(r"repvgg_a0\s+ort-all\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x\s+44->22\s+([\d.]+)->([\d.]+)"
                 r"\s+max_rel (\S+)$", row)
    assert m, row
    before, after, ratio = float(m.group(1)), float(m.group(2)), float(m.group(3))
    assert before > 0 and after > 0 and abs(ratio - before / after) < 0.01 * ratio + 0.006
    assert float(m.group(5)) < float(m.group(4))  # the 1x1 branches' multiply-accumulates are gone
    assert float(m.group(6)) <= 1e-4
    assert "tvm-cuda: n/a" in proc.stdout
