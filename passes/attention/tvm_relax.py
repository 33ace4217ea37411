"""passctl::Attention -> Relax ``nn.attention`` (BSNH), for the TVM emitter's converter table."""

from __future__ import annotations

from typing import Any, Dict, Sequence

import numpy as np


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def relax_attention(bb, inputs: Sequence[Any], attrs: Dict[str, Any]):
    """Build Relax ops for one ``passctl::Attention`` (schema: passes/attention/canonical.py).

    Q/K/V arrive in BHSD; Relax's ``nn.attention`` takes BSNH (``[B, S, H, D]``), so each is
    permuted, KV heads are repeated to H (``repeat`` on the head axis: head h reads KV head
    h // n_rep), a boolean mask becomes a 0 / -inf bias of Q's dtype, a mask of rank < 4 gets leading
    unit axes, ``is_causal`` without a mask becomes ``causal_mask="TopLeft"`` (with a mask it is a
    hint, and TVM 0.27's legalized kernel gives NaN for bias plus causal_mask), the result is permuted back to BHSD
    and, with ``nan_to_zero``, NaN rows become 0. ``softmax_precision`` is left to Relax (its kernels
    accumulate fp16 attention in fp32).

    Args:
        bb: the frontend's ``relax.BlockBuilder``.
        inputs: Relax expressions ``[Q, K, V, Mask?]``.
        attrs: the node's attributes (strings may be bytes).

    Returns:
        The Relax expression of the output ``[B, H, S, Dv]``.
    """
    from tvm import relax

    op = relax.op
    q, k, v = (bb.normalize(x) for x in inputs[:3])
    mask = bb.normalize(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else None
    heads, kv_heads = int(attrs["num_heads"]), int(attrs["kv_num_heads"])
    kind = _text(attrs.get("mask_kind", "none"))
    dtype = str(q.ty.dtype)
    if kv_heads != heads:
        k = op.repeat(k, heads // kv_heads, axis=1)
        v = op.repeat(v, heads // kv_heads, axis=1)
    bsnh = [0, 2, 1, 3]
    bias = None
    if mask is not None and kind != "none":
        bias = mask
        if kind == "boolean":
            bias = op.where(mask, relax.const(np.zeros((), dtype=dtype)),
                            relax.const(np.full((), -np.inf, dtype=dtype)))
        elif str(mask.ty.dtype) != dtype:
            bias = op.astype(bias, dtype)
        rank = len(mask.ty.shape)
        if rank < 4:
            bias = op.expand_dims(bias, list(range(4 - rank)))
    # NOTE: with a mask the causal flag is only a hint (the mask holds the causal part), and TVM
    # 0.27's legalized nn.attention returns NaN when it gets both a bias and causal_mask.
    causal = "TopLeft" if int(attrs.get("is_causal", 0)) and bias is None else None
    y = op.nn.attention(op.permute_dims(q, bsnh), op.permute_dims(k, bsnh), op.permute_dims(v, bsnh),
                        bias, scale=float(attrs["scale"]), causal_mask=causal)
    y = op.permute_dims(y, bsnh)
    if int(attrs.get("nan_to_zero", 0)):
        y = bb.normalize(y)
        y = op.where(op.isnan(y), relax.const(np.zeros((), dtype=dtype)), y)
    return y


def converters() -> Dict[str, Any]:
    """``{"Attention": relax_attention}``, to merge into the TVM emitter's passctl converter table."""
    return {"Attention": relax_attention}


__all__ = ["converters", "relax_attention"]
