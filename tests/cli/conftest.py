"""Fixtures for the CLI tests: a small Conv+BN model file (the in-process ``cli`` runner is in
tests/conftest.py)."""

from __future__ import annotations

import onnx
import pytest
from cli_helpers import conv_bn_proto  # tests/cli/cli_helpers.py



@pytest.fixture
def conv_bn_model(tmp_path) -> str:
    """Path of :func:`conv_bn_proto` saved as ``tmp_path/conv_bn.onnx``."""
    path = tmp_path / "conv_bn.onnx"
    onnx.save(conv_bn_proto(), str(path))
    return str(path)
