"""Fixtures of the compare / bisect / diff tests: an in-process ``passctl`` runner."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

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
