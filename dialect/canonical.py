"""The passctl-domain canonical ops that fusions emit and the lowering passes turn into target ops."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np

from passctl.ir import Model, Node, Value

DOMAIN = "passctl"
"""Operator domain of the canonical ops (opset version :data:`VERSION`)."""

VERSION = 1

MS_DOMAIN = "com.microsoft"
"""ONNX Runtime's contrib-op domain (version 1)."""


@dataclass(frozen=True)
class CanonicalOp:
    """The schema of one canonical op: inputs (``?`` marks optional ones), attributes, math."""

    name: str
    inputs: Tuple[str, ...]
    attributes: Dict[str, str]
    math: str
    source: str


SCHEMAS: Dict[str, CanonicalOp] = {s.name: s for s in [
    CanonicalOp(
        "LayerNorm", ("X", "Scale?", "B?"),
        {"axis": "int, always -1 here (the last axis)", "epsilon": "float"},
        "Y = (X - mean(X)) / sqrt(var(X) + epsilon) * Scale + B over the last axis; mean and the "
        "biased variance are taken over that axis; Scale defaults to 1, B to 0; Scale and B have "
        "shape [D] (D = last dimension of X); Y has X's shape and element type",
        "ONNX LayerNormalization-17 (same math; Scale is optional here)"),
    CanonicalOp(
        "SkipLayerNorm", ("X", "Skip", "Scale?", "B?", "Bias?"),
        {"epsilon": "float"},
        "Y = LayerNorm(X + Skip + Bias, Scale, B) over the last axis; X and Skip have the same shape "
        "[..., D]; Scale, B, Bias have shape [D] (Bias defaults to 0)",
        "ONNX Runtime com.microsoft.SkipLayerNormalization (ContribOperators.md)"),
    CanonicalOp(
        "RMSNorm", ("X", "Scale?"),
        {"axis": "int, always -1 here", "epsilon": "float"},
        "Y = X / sqrt(mean(X^2) + epsilon) * Scale over the last axis (no mean subtraction); "
        "Scale has shape [D] and defaults to 1",
        "Zhang & Sennrich 2019 (RMSNorm); ONNX RMSNormalization-23; LLaMA's LlamaRMSNorm"),
    CanonicalOp(
        "SkipRMSNorm", ("X", "Skip", "Scale?"),
        {"epsilon": "float"},
        "S = X + Skip; Y = RMSNorm(S, Scale) over the last axis; outputs (Y, S?): the second output "
        "S is the residual sum that a pre-norm model's next block reads (present only when used); X "
        "and Skip have the same shape [..., D]; Scale has shape [D] and defaults to 1",
        "ONNX Runtime com.microsoft.SkipSimplifiedLayerNormalization (ContribOperators.md; its "
        "4th output input_skip_bias_sum is S)"),
    CanonicalOp(
        "Gelu", ("X", "Bias?"),
        {"approximate": "string, 'none' (erf form) or 'tanh'"},
        "with v = X + Bias: 'none': Y = 0.5 * v * (1 + erf(v / sqrt(2))); 'tanh': Y = 0.5 * v * "
        "(1 + tanh(sqrt(2 / pi) * (v + 0.044715 * v^3))); Bias has shape [D]",
        "Hendrycks & Gimpel 2016 (GELU); ONNX Gelu-20"),
    CanonicalOp(
        "SiLU", ("X",), {"alpha": "float, default 1.0 (Swish's beta)"},
        "Y = X * sigmoid(alpha * X)",
        "Elfwing et al. 2017 (SiLU, also called Swish-1); ONNX Swish-24 with alpha = 1"),
    CanonicalOp(
        "HardSwish", ("X",), {},
        "Y = X * max(0, min(1, X / 6 + 0.5))",
        "Howard et al. 2019 (MobileNetV3); ONNX HardSwish-14"),
]}


def canonical_op_doc() -> str:
    """The schemas as Markdown-like text (one paragraph per op), for docs and ``list-passes``."""
    lines = []
    for s in SCHEMAS.values():
        attrs = ", ".join(f"{k}: {v}" for k, v in s.attributes.items()) or "none"
        lines.append(f"{DOMAIN}::{s.name}({', '.join(s.inputs)}); attributes: {attrs}\n"
                     f"    {s.math}\n    source: {s.source}")
    return "\n".join(lines)


def ensure_opset(model: Model, domain: str, version: int = 1) -> None:
    """Add ``domain`` (at ``version``) to the model's opset imports when it is missing."""
    model.opset_imports.setdefault(domain, version)


def drop_unused_opset(model: Model, domain: str) -> None:
    """Remove ``domain`` from the opset imports when no node (any graph, any function) uses it."""
    graphs = [model.graph] + [f.graph for f in model.functions.values()]
    for g in graphs:
        if any(n.domain == domain for n in g.all_nodes()):
            return
    model.opset_imports.pop(domain, None)


def optional_input(node: Node, i: int) -> Optional[Value]:
    """Input ``i`` of ``node``, or None when the node has fewer inputs (an omitted optional input
    of a canonical op such as SkipLayerNorm's bias)."""
    return node.inputs[i] if len(node.inputs) > i else None


def last_dim(v: Optional[Value]) -> Optional[int]:
    """The static size of the last dimension of ``v`` (None when its shape or that dim is unknown)."""
    shape = None if v is None else v.shape
    if shape is None or shape.rank is None or shape.rank == 0:
        return None
    d = shape[shape.rank - 1]
    return d if isinstance(d, int) else None


def vector_like(array: np.ndarray, size: Optional[int]) -> Optional[np.ndarray]:
    """``array`` as a 1-D vector of ``size`` elements when it broadcasts over the last axis only.

    A parameter of a normalization may be written as ``[D]``, ``[1, D]``, ``[1, 1, D]`` (all leading
    dims 1). A scalar or ``[1]`` parameter broadcasts too and is expanded to ``[D]`` when ``size`` is
    known. Anything else (``[S, D]``, ``[D, 1]``, a different ``D``) is refused (None).
    """
    shape = array.shape
    if any(d != 1 for d in shape[:-1]):
        return None
    n = shape[-1] if shape else 1
    if size is None:
        return array.reshape(n) if n > 1 else None
    if n == size:
        return array.reshape(size)
    if n == 1:
        return np.broadcast_to(array.reshape(1), (size,)).copy()
    return None


__all__ = ["optional_input", "CanonicalOp", "DOMAIN", "MS_DOMAIN", "SCHEMAS", "VERSION", "canonical_op_doc",
           "drop_unused_opset", "ensure_opset", "last_dim", "vector_like"]
