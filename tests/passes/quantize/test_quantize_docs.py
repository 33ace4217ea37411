"""docs/quantize.md's headline commands, run as written (out/ replaced by a temporary folder)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]


def _headline_commands():
    text = (REPO / "docs" / "quantize.md").read_text()
    block = text.split("<!-- headline:", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


@pytest.mark.slow
def test_headline_commands_run_as_written(tmp_path):
    commands = _headline_commands()
    assert len(commands) == 3
    bindir = Path(sys.executable).parent
    for line in commands:
        argv = shlex.split(line.replace("out/", f"{tmp_path}/out/"))
        # .venv/bin/X as written, from this test's own environment (a clone's .venv or CI's)
        argv[0] = str(bindir / Path(argv[0]).name) if argv[0].startswith(".venv/bin/") else argv[0]
        r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"{line}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    for name, form in (("det-int8", "ORT_DISABLE_ALL"), ("det-int8-cpu", "ORT_ENABLE_ALL")):
        report = json.loads((tmp_path / "out" / name / "report.json").read_text())
        stats = next(p["stats"] for p in report["passes"] if p["name"] == "quantize-int8")
        check = report["check"]
        assert stats["quantized_layers"] > 0 and stats["measured_with"] == form
        # the check ran on the first calibration feed and met the pass's budget there
        feed = np.load(tmp_path / "out" / "calib" / "feed_000.npz")["x"]
        assert check["ok"] and check["overridden"] == ["x"]
        assert check["inputs"] == [{"name": "x", "shape": list(feed.shape), "dtype": "float32"}]
        assert check["metric_error"] <= stats["budget"]
        assert check["metric"] == "mean-rel"
