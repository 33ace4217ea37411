"""Checks shared by the normalization fusions: reduced axes, keepdims, epsilon, parameter shapes."""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from passctl.ir import Node, Value
from passctl.dialect.canonical import last_dim, vector_like
from passctl.passes.rewrite import MatchResult, RuleContext, constant_value

def reduce_axes(node: Node) -> Tuple[Optional[Tuple[int, ...]], str]:
    """The axes a ReduceMean reduces over: its ``axes`` attribute (opset < 18) or its constant second
    input (opset >= 18). Returns ``(axes, "")`` or ``(None, reason)``."""
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        arr = constant_value(node.inputs[1])
        if arr is None:
            return None, f"the axes input '{node.inputs[1].name}' of ReduceMean is not a constant"
        return tuple(int(a) for a in np.asarray(arr).reshape(-1)), ""
    axes = node.attr("axes")
    if axes is None:
        return None, "ReduceMean has no axes, so it reduces over every axis, not the last one"
    return tuple(int(a) for a in axes), ""


def check_reductions(context: RuleContext, x: Value, what: str) -> MatchResult:
    """Every ReduceMean of the match keeps dims and reduces exactly the last axis of ``x``.

    ``what`` names the normalization in reasons (``"LayerNorm"``, ``"RMSNorm"``).
    """
    rank = None if x.shape is None else x.shape.rank
    for node in context.nodes:
        if node.op_type != "ReduceMean":
            continue
        if node.attr("keepdims", 1) == 0:
            return MatchResult().fail(f"{what}: ReduceMean keepdims=0 drops the reduced axis, so the "
                                      "statistic does not broadcast back as a normalization's does",
                                      node)
        axes, why = reduce_axes(node)
        if axes is None:
            return MatchResult().fail(f"{what}: {why}", node)
        last = len(axes) == 1 and (axes[0] == -1 or (rank is not None and axes[0] == rank - 1))
        if not last:
            if rank is None and len(axes) == 1 and axes[0] >= 0:
                return MatchResult().fail(f"{what}: the rank of '{x.name}' is unknown, so axis "
                                          f"{axes[0]} cannot be proven the last one; run infer-shapes "
                                          "first", node)
            return MatchResult().fail(f"{what}: normalization over axes {list(axes)} of "
                                      f"'{x.name}' (rank {rank}), not over the last axis only", node)
    return MatchResult()


def check_epsilon(context: RuleContext, eps: Value, what: str) -> Tuple[Optional[float], MatchResult]:
    """``eps`` is a scalar or ``[1]`` constant, finite and >= 0; returns ``(value, ok)``."""
    arr = context.constant(eps)
    if arr is None:
        return None, MatchResult().fail(f"{what}: epsilon '{eps.name}' is not a constant",
                                        eps.producer)
    if arr.size != 1:
        return None, MatchResult().fail(f"{what}: epsilon '{eps.name}' has shape {list(arr.shape)}, "
                                        "not a scalar", eps.producer)
    if arr.ndim > 1:  # [1, 1, 1, 1] added to a rank-3 variance would raise the output's rank
        return None, MatchResult().fail(f"{what}: epsilon '{eps.name}' has shape {list(arr.shape)}, "
                                        "not a scalar or [1]", eps.producer)
    value = float(arr.reshape(-1)[0])
    if not np.isfinite(value) or value < 0:
        return None, MatchResult().fail(f"{what}: epsilon {value} is negative or not finite",
                                        eps.producer)
    return value, MatchResult()


def check_param(context: RuleContext, x: Value, p: Value, role: str, what: str
                ) -> Tuple[Optional[np.ndarray], MatchResult]:
    """A scale/bias ``p`` of a normalization over the last axis of ``x`` broadcasts to ``[D]`` only.

    Returns ``(vector, ok)``: the constant as a ``[D]`` array (or None when ``p`` is a non-constant
    value of shape ``[D]``, used as is), or a failure naming the shapes.
    """
    d = last_dim(x)
    arr = context.constant(p)
    rank = None if x.shape is None else x.shape.rank
    if arr is None:
        shape = p.shape
        if shape is not None and shape.rank == 1 and (d is None or shape[0] == d):
            return None, MatchResult()
        return None, MatchResult().fail(f"{what}: {role} '{p.name}' is not a constant of shape [D] "
                                        f"(its shape is {shape}); cannot prove it broadcasts to the "
                                        "normalized shape", p.producer)
    vec = vector_like(arr, d)
    if vec is None or arr.ndim > (rank if rank is not None else 1):
        want = f"[{d}]" if d is not None else "[D]"
        return None, MatchResult().fail(f"{what}: {role} '{p.name}' has shape {list(arr.shape)}, which "
                                        f"does not broadcast to the normalized shape {want} of "
                                        f"'{x.name}'", p.producer)
    if x.dtype is not None and arr.dtype != x.dtype.numpy():
        return None, MatchResult().fail(f"{what}: {role} '{p.name}' has element type {arr.dtype}, "
                                        f"the input has {x.dtype}")
    return vec, MatchResult()


def param_vector(op, x: Value, p: Value) -> Value:
    """``p`` as a ``[D]`` vector for a rewrite: ``p`` itself when it is one already (or not a
    constant), else a new initializer (``[1, D]`` or ``[1]`` reshaped / expanded; see
    :func:`passctl.dialect.canonical.vector_like`). Call only after :func:`check_param` passed."""
    arr = constant_value(p)
    if arr is None:
        return p
    vec = vector_like(arr, last_dim(x))
    return p if vec.shape == arr.shape else op.constant(vec, f"{p.name}_vec")


__all__ = ["check_epsilon", "check_param", "check_reductions", "param_vector", "reduce_axes"]
