"""Shared helpers of the TVM emitter tests: build small ONNX models, emit, run, compare."""

from __future__ import annotations

import math
import subprocess
import sys
from typing import Dict

import numpy as np
import onnx

from passctl.ir import Model, from_onnx
from passctl.targets import get_target
from passctl.targets.tvm import TvmEmitter, load_artifact
from passctl.support.check import compare, run_onnxruntime


def emit_tvm(model: Model, out, target: str = "cpu", self_check: bool = True) -> dict:
    """Emit ``model`` with the TVM emitter into ``out``; returns the emitter's info dict."""
    return TvmEmitter(self_check=self_check).emit(model, get_target(target), str(out))


def run_tvm(folder, feeds: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Outputs of the TVM artifact in ``folder`` (loaded with tvm.runtime only)."""
    return load_artifact(str(folder)).run(feeds)


def run_ort(proto: onnx.ModelProto, feeds) -> Dict[str, np.ndarray]:
    """Outputs of ``proto`` in ONNX Runtime (CPU, graph optimizations off), by output name."""
    return run_onnxruntime(proto, feeds)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |b| (the relative error of passctl's --check: ``compare``'s max_rel)."""
    diff = compare({"y": b}, {"y": a}).outputs["y"]
    return math.inf if diff.nonfinite_mismatch else diff.max_rel  # a NaN where b has none fails


def run_cli(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m passctl.tools.cli ARGS`` in a child process (arguments str()-ed), output captured
    as text."""
    return subprocess.run([sys.executable, "-m", "passctl.tools.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def attention_proto(dtype: int, h: int, hkv: int, s: int, d: int, mask_kind: str = "none",
                    causal: int = 0, scale: float = 0.25) -> onnx.ModelProto:
    """One ``passctl::Attention`` node (docs/ops.md): q ``[1, h, s, d]``, k / v ``[1, hkv, s, d]``
    and, for ``mask_kind="additive"``, m ``[1, 1, s, s]``, all of ONNX element type ``dtype``;
    output y ``[1, h, s, d]``."""
    from onnx import helper

    inputs = [helper.make_tensor_value_info("q", dtype, [1, h, s, d]),
              helper.make_tensor_value_info("k", dtype, [1, hkv, s, d]),
              helper.make_tensor_value_info("v", dtype, [1, hkv, s, d])]
    if mask_kind == "additive":
        inputs.append(helper.make_tensor_value_info("m", dtype, [1, 1, s, s]))
    node = helper.make_node("Attention", [i.name for i in inputs], ["y"], domain="passctl",
                            name="attn", scale=scale, mask_kind=mask_kind, is_causal=causal,
                            num_heads=h, kv_num_heads=hkv, softmax_precision=0, nan_to_zero=0)
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info("y", dtype, [1, h, s, d])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("passctl", 1)])


def attention_numpy(q, k, v, scale: float, bias) -> np.ndarray:
    """softmax(scale * Q K^T + bias) V in float64, K / V heads repeated for grouped-query attention
    (q ``[b, h, s, d]``, k / v ``[b, hkv, s, d]``, bias broadcast to ``[s, s]``)."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    k, v = np.repeat(k, q.shape[1] // k.shape[1], axis=1), np.repeat(v, q.shape[1] // v.shape[1], axis=1)
    scores = scale * q @ k.transpose(0, 1, 3, 2) + bias
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def ir(proto: onnx.ModelProto) -> Model:
    """The IR of ``proto`` (checked by onnx.checker first)."""
    onnx.checker.check_model(proto)
    return from_onnx(proto)
