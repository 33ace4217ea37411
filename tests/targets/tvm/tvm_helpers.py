"""Shared helpers of the TVM emitter tests: build small ONNX models, emit, run, compare."""

from __future__ import annotations

import subprocess
import sys
from typing import Dict

import numpy as np
import onnx
import onnxruntime as ort

from passctl.ir import Model, from_onnx
from passctl.targets import get_target
from passctl.targets.tvm import TvmEmitter, load_artifact


def emit_tvm(model: Model, out, target: str = "cpu", self_check: bool = True) -> dict:
    """Emit ``model`` with the TVM emitter into ``out``; returns the emitter's info dict."""
    return TvmEmitter(self_check=self_check).emit(model, get_target(target), str(out))


def run_tvm(folder, feeds: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Outputs of the TVM artifact in ``folder`` (loaded with tvm.runtime only)."""
    return load_artifact(str(folder)).run(feeds)


def run_ort(proto: onnx.ModelProto, feeds) -> Dict[str, np.ndarray]:
    """Outputs of ``proto`` in ONNX Runtime (CPU), by output name."""
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |b| (the relative error of passctl's --check)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def run_cli(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m passctl.tools.cli ARGS`` in a child process (arguments str()-ed), output captured
    as text."""
    return subprocess.run([sys.executable, "-m", "passctl.tools.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def ir(proto: onnx.ModelProto) -> Model:
    """The IR of ``proto`` (checked by onnx.checker first)."""
    onnx.checker.check_model(proto)
    return from_onnx(proto)
