"""Fusion-test setup: tests/passes on sys.path, so these tests share its ``helpers`` module."""

from __future__ import annotations

import sys
from pathlib import Path

_PASS_TESTS = str(Path(__file__).resolve().parents[1])
if _PASS_TESTS not in sys.path:
    sys.path.insert(0, _PASS_TESTS)
