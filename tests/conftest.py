"""Shared pytest setup: the tests folder on sys.path (for ``corpus``), the ``corpus_model`` fixture and
the in-process ``cli`` runner."""

from __future__ import annotations

import itertools
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from corpus import CORPUS, CorpusModel  # noqa: E402  (needs the sys.path entry above)


@pytest.fixture(params=[pytest.param(model_id, id=model_id,
                                     marks=[pytest.mark.slow] if model.slow else [])
                        for model_id, model in CORPUS.items()])
def corpus_model(request) -> CorpusModel:
    """Each corpus model in turn (test ids show the corpus id); ``.path`` exports it on first use."""
    return CORPUS[request.param]


@dataclass
class CliResult:
    """What one in-process ``passctl`` run gave; unpacks as ``rc, out, err``."""

    rc: int
    out: str
    err: str

    def __iter__(self):
        return iter((self.rc, self.out, self.err))


@pytest.fixture
def cli(capsys):
    """``cli(*argv)`` runs ``passctl`` in-process and returns its exit code, stdout and stderr."""
    from passctl.tools.cli import main

    def run(*argv) -> CliResult:
        capsys.readouterr()
        rc = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return CliResult(rc, captured.out, captured.err)

    return run


_crash_numbers = itertools.count()


@pytest.fixture(autouse=True)
def _crash_reproducers_under_pytest_tmp(monkeypatch, tmp_path_factory):
    """A crash reproducer written without ``--reproducer-dir`` goes under pytest's temporary
    folder (removed with it) instead of a new ``passctl-crash-*`` folder in the system temp
    folder, which every full run used to leave behind."""
    from passctl.tools import instrument_setup, reproducer

    root = tmp_path_factory.getbasetemp() / "crash-reproducers"

    def default_dir() -> str:
        return str(root / f"passctl-crash-{os.getpid()}-{next(_crash_numbers)}")

    monkeypatch.setattr(reproducer, "default_reproducer_dir", default_dir)
    monkeypatch.setattr(instrument_setup, "default_reproducer_dir", default_dir)
