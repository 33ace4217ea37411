"""The install story as a new user follows it: a fresh venv, `pip install -e .` (no torch), then the
README's main job, and `import passctl` pulling in no framework."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _readme_main_job() -> list:
    """The README's main-job command line (the `passctl rapidocr_onnxruntime:...` line)."""
    text = (REPO / "README.md").read_text()
    line = next(l for l in text.splitlines() if re.match(r"^\.venv/bin/passctl rapidocr", l))
    return line.split()[1:]


@pytest.mark.slow
def test_fresh_venv_core_install_runs_the_readme_main_job(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run(pip + ["-e", str(REPO)], check=True, timeout=900)
    subprocess.run(pip + ["--no-deps", "rapidocr-onnxruntime==1.4.4"], check=True, timeout=600)
    listed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list"],
                            capture_output=True, text=True, check=True).stdout.lower()
    assert not re.search(r"^(torch|apache-tvm|transformers) ", listed, re.M)
    args = _readme_main_job()
    out_index = args.index("-o") + 1
    args[out_index] = str(tmp_path / "cls")
    run = subprocess.run([str(venv / "bin" / "passctl")] + args, capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""}, timeout=600)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "cls" / "report.json").is_file() and "check: max abs error" in run.stdout
    code = "import sys, passctl; print([m for m in ('torch', 'tvm', 'transformers') if m in sys.modules])"
    imported = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True,
                              text=True, check=True, cwd=tmp_path)
    assert imported.stdout.strip() == "[]"
