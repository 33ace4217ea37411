"""Shared pytest setup: the tests folder on sys.path (for ``corpus``) and the ``corpus_model`` fixture."""

from __future__ import annotations

import sys
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
