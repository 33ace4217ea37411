"""docs/python-api.md's examples run as written: each ```python block in a fresh folder, and the
factory-file shell example through the CLI."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "python-api.md"


def _blocks(kind: str):
    return re.findall(rf"```{kind}\n(.*?)```", DOC.read_text(), re.S)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_python_example_runs(tmp_path, index):
    script = tmp_path / "example.py"
    script.write_text(_blocks("python")[index])
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]


@pytest.mark.slow
def test_cli_factory_example_runs(tmp_path):
    (shell,) = _blocks("bash")
    passctl = str(Path(sys.executable).with_name("passctl"))
    shell = re.sub(r"^passctl ", passctl + " ", shell, flags=re.M)
    run = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, cwd=tmp_path,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "resnet18-cli.passctl" / "report.json").is_file()
