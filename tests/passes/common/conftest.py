"""Tests of the common passes: the pass-test helpers (tests/passes/helpers.py) importable."""

from __future__ import annotations

import sys
from pathlib import Path

_PASSES = str(Path(__file__).resolve().parents[1])
if _PASSES not in sys.path:
    sys.path.insert(0, _PASSES)
