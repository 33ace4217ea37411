"""benchmarks/compile_speed.py runs end to end (passctl only, on PP-OCRv4 rec) and prints its table."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import onnx

from corpus import CORPUS

REPO = Path(__file__).resolve().parents[2]


def test_passctl_row_printed_with_measurements():
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "compile_speed.py"),
                           "--models", "ppocr_rec", "--tools", "passctl"],
                          capture_output=True, text=True, timeout=300, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("ppocr_rec"))
    m = re.match(r"ppocr_rec\s+passctl\s+(\d+)->(\d+)\s+([\d.]+)\s+(\d+)\s+1\.00\s+1\.00$", row)
    assert m, row
    before = len(onnx.load(CORPUS["ppocr_rec"].path, load_external_data=False).graph.node)
    assert int(m.group(1)) == before and int(m.group(2)) < before
    assert float(m.group(3)) > 0 and int(m.group(4)) > 20  # seconds; MiB of a Python process
