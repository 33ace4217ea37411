"""Fixtures for the CLI tests: an in-process ``passctl`` runner and a small Conv+BN model file."""

from __future__ import annotations

from dataclasses import dataclass

import onnx
import pytest
from cli_helpers import conv_bn_proto  # tests/cli/cli_helpers.py

from passctl.tools.cli import main


@dataclass
class CliResult:
    rc: int
    out: str
    err: str


@pytest.fixture
def cli(capsys):
    """``cli(*argv)`` runs ``passctl`` in-process and returns its exit code, stdout and stderr."""

    def run(*argv) -> CliResult:
        capsys.readouterr()
        rc = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return CliResult(rc, captured.out, captured.err)

    return run


@pytest.fixture
def conv_bn_model(tmp_path) -> str:
    """Path of :func:`conv_bn_proto` saved as ``tmp_path/conv_bn.onnx``."""
    path = tmp_path / "conv_bn.onnx"
    onnx.save(conv_bn_proto(), str(path))
    return str(path)
