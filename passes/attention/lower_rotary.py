"""Lowerings of ``passctl::RotaryEmbedding``: ONNX RotaryEmbedding-23, com.microsoft.RotaryEmbedding,
or standard ops (registered into lower-onnxruntime and lower-standard)."""

from __future__ import annotations

from typing import Optional

import numpy as np

from passctl.dialect.canonical import MS_DOMAIN, ensure_opset, last_dim
from passctl.dialect.rotary import OP_TYPE
from passctl.ir import Node, Value
from passctl.passes.lowering.table import LowerContext, register_lowering

ROTARY_OPSET = 23
"""The first ONNX opset with ``RotaryEmbedding``."""


def _attrs(node: Node):
    """(interleaved, rotary_embedding_dim or None for the whole head)."""
    dim = int(node.attr("rotary_embedding_dim", 0) or 0)
    return int(node.attr("interleaved", 0) or 0), (dim or None)


def _kernel_dtype(node: Node) -> str:
    dtype = node.inputs[0].dtype
    if dtype is None or dtype.name not in ("FLOAT", "FLOAT16"):
        return f"element type {dtype.name if dtype else 'unknown'} (the kernels take float32/float16)"
    return ""


def rotary23(ctx: LowerContext, node: Node) -> Optional[Value]:
    """ONNX ``RotaryEmbedding`` (opset 23; only when the model's opset already is): inputs
    reordered to (X, cos_cache, sin_cache, position_ids), the same attributes."""
    if ctx.opset < ROTARY_OPSET:
        return None  # not a kernel constraint: the op does not exist at this opset
    x, pos, cos, sin = node.inputs[:4]
    interleaved, dim = _attrs(node)
    ctx.form = f"{OP_TYPE}->RotaryEmbedding-23"
    return ctx.b.op("RotaryEmbedding", x, cos, sin, pos, interleaved=interleaved,
                    rotary_embedding_dim=dim)


def ms_rotary(ctx: LowerContext, node: Node) -> Optional[Value]:
    """``com.microsoft::RotaryEmbedding(X, position_ids, cos_cache, sin_cache)`` on the 4-D BHSD
    input (ONNX Runtime's contrib kernel; float32/float16; a partial rotary needs ``num_heads``,
    taken from X's static axis 1)."""
    why = _kernel_dtype(node)
    if why:
        return ctx.refuse(why)
    x, pos, cos, sin = node.inputs[:4]
    interleaved, dim = _attrs(node)
    heads = x.shape[1] if x.shape is not None and x.shape.rank == 4 else None
    if dim is not None and not isinstance(heads, int):
        return ctx.refuse("a partial rotary needs a static head count (X's axis 1)")
    ensure_opset(ctx.model, MS_DOMAIN, 1)
    ctx.form = f"{OP_TYPE}->com.microsoft::RotaryEmbedding"
    return ctx.b.op("RotaryEmbedding", x, pos, cos, sin, domain=MS_DOMAIN, interleaved=interleaved,
                    rotary_embedding_dim=dim, num_heads=heads if dim is not None else None)


def _i64(ctx: LowerContext, values, name: str) -> Value:
    return ctx.const(np.array(values, dtype=np.int64), name)


def _last(ctx: LowerContext, x: Value, start: int, end: int, step: int = 1) -> Value:
    """``x[..., start:end:step]``."""
    return ctx.b.op("Slice", x, _i64(ctx, [start], "rotary_start"), _i64(ctx, [end], "rotary_end"),
                    _i64(ctx, [-1], "rotary_axis"), _i64(ctx, [step], "rotary_step"))


def decomposed(ctx: LowerContext, node: Node) -> Optional[Value]:
    """Standard ops (opset >= 13): ``Gather`` of the cache rows by position, then the rotation
    (halves by ``Slice``; pairs by step-2 ``Slice`` and an interleaving ``Concat`` + ``Reshape``);
    a partial rotary's pass-through part is concatenated back."""
    x, pos, cos, sin = node.inputs[:4]
    interleaved, dim = _attrs(node)
    d = last_dim(x)
    rdim = dim or d
    if rdim is None:
        return ctx.refuse("the head size (X's last axis) is not static")
    b = ctx.b
    axis1 = _i64(ctx, [1], "rotary_heads_axis")
    c = b.op("Unsqueeze", b.op("Gather", cos, pos, axis=0), axis1)  # [B, 1, S, R/2]
    s = b.op("Unsqueeze", b.op("Gather", sin, pos, axis=0), axis1)
    xr = _last(ctx, x, 0, rdim) if dim is not None and dim != d else x
    half = rdim // 2
    if interleaved:
        x1, x2 = _last(ctx, xr, 0, rdim, 2), _last(ctx, xr, 1, rdim, 2)
    else:
        x1, x2 = _last(ctx, xr, 0, half), _last(ctx, xr, half, rdim)
    y1 = b.op("Sub", b.op("Mul", x1, c), b.op("Mul", x2, s))
    y2 = b.op("Add", b.op("Mul", x2, c), b.op("Mul", x1, s))
    if interleaved:
        last = _i64(ctx, [-1], "rotary_last")
        pairs = b.op("Concat", b.op("Unsqueeze", y1, last), b.op("Unsqueeze", y2, last), axis=-1)
        y = b.op("Reshape", pairs, b.op("Shape", xr))
    else:
        y = b.op("Concat", y1, y2, axis=-1)
    if xr is not x:
        y = b.op("Concat", y, _last(ctx, x, rdim, np.iinfo(np.int64).max), axis=-1)
    ctx.form = f"{OP_TYPE}->decomposed"
    return y


# NOTE: ONNX Runtime: the contrib kernel first (any opset; the brief's cpu form), then
# RotaryEmbedding-23 where the opset allows, then standard ops; lower-standard (TensorRT and other
# runtimes without contrib ops): RotaryEmbedding-23, else standard ops.
for _fn in (ms_rotary, rotary23, decomposed):
    register_lowering("onnxruntime", OP_TYPE, _fn)
for _fn in (rotary23, decomposed):
    register_lowering("standard", OP_TYPE, _fn)

__all__ = ["ROTARY_OPSET", "decomposed", "ms_rotary", "rotary23"]
