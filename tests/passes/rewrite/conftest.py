"""Fusion-test setup: the pass-test helpers importable, and a pipeline runner returning stats."""

from __future__ import annotations

import sys
from pathlib import Path

_PASSES_TESTS = str(Path(__file__).resolve().parents[1])
if _PASSES_TESTS not in sys.path:
    sys.path.insert(0, _PASSES_TESTS)
