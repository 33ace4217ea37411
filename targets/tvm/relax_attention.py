"""passctl::Attention -> Relax ``nn.attention`` (BSNH), for the TVM emitter's converter table."""

from __future__ import annotations

import logging
import math
from typing import Any, Dict, Sequence

import numpy as np

from passctl.targets.tvm.support import attr_text


def _nan_to_zero(bb, y, dtype: str):
    """``where(isnan(y), 0, y)``: fully masked rows give 0 (the ``nan_to_zero`` attribute)."""
    from tvm import relax

    y = bb.normalize(y)
    return relax.op.where(relax.op.isnan(y), relax.const(np.zeros((), dtype=dtype)), y)


def _rank4(bias, rank: int):
    """``bias`` with leading unit axes up to rank 4 (a mask broadcasts from the right)."""
    from tvm import relax

    return relax.op.expand_dims(bias, list(range(4 - rank))) if rank < 4 else bias


def _decomposed(bb, q, k, v, mask, kind: str, attrs: Dict[str, Any], dtype: str):
    """softmax(Q K^T * scale + bias) V for fp16 / bf16 in BHSD, the scores in float32; also any
    dtype with a boolean mask of finite ``mask_fill``: ``where(mask, scores, fill)``, exact in fully
    masked rows (uniform), which no bias added to the scores gives.

    TVM 0.27 legalizes ``nn.attention`` with ``topi.multiply(scores, scale)`` where ``scale`` is a
    float32 immediate, so an fp16 attention's kernel returns float32 while Relax typed it fp16 and
    the next fp16 matmul fails ("Binary operators must have the same datatype"). Here the scores
    are cast to float32 (scale, bias, causal mask and softmax in float32, as the ONNX Attention
    spec's softmax_precision=1 does) and the probabilities back to ``dtype`` for the P V matmul.
    """
    from tvm import relax

    op = relax.op
    q, k, v = (bb.normalize(x) for x in (q, k, v))
    s, t = int(q.ty.shape[2]), int(k.ty.shape[2])
    scores = op.astype(op.matmul(q, op.permute_dims(k, [0, 1, 3, 2])), "float32")
    scores = op.multiply(scores, relax.const(np.float32(attrs["scale"]), "float32"))
    fill = float(attrs.get("mask_fill", -np.inf))
    if mask is not None and kind == "boolean" and math.isfinite(fill):
        scores = op.where(mask, scores, relax.const(np.float32(fill), "float32"))
    elif mask is not None and kind != "none":
        if kind == "boolean":
            bias = op.where(mask, relax.const(np.float32(0), "float32"),
                            relax.const(np.float32(-np.inf), "float32"))
        else:
            bias = op.astype(mask, "float32")
        scores = op.add(scores, _rank4(bias, len(mask.ty.shape)))
    elif int(attrs.get("is_causal", 0)):  # top-left causal: key j visible to query i when j <= i
        upper = np.triu(np.full((s, t), -np.inf, np.float32), k=1)
        scores = op.add(scores, relax.const(upper, "float32"))
    probs = op.astype(op.nn.softmax(scores, axis=-1), dtype)
    y = op.matmul(probs, v)
    return _nan_to_zero(bb, y, dtype) if int(attrs.get("nan_to_zero", 0)) else y


def relax_attention(bb, inputs: Sequence[Any], attrs: Dict[str, Any], kernels=None):
    """Build Relax ops for one ``passctl::Attention`` (schema: dialect/attention.py).

    Q/K/V arrive in BHSD; Relax's ``nn.attention`` takes BSNH (``[B, S, H, D]``), so each is
    permuted, KV heads are repeated to H (``repeat`` on the head axis: head h reads KV head
    h // n_rep), a boolean mask becomes a 0 / -inf bias of Q's dtype, a mask of rank < 4 gets leading
    unit axes, ``is_causal`` without a mask becomes ``causal_mask="TopLeft"`` (with a mask it is a
    hint, and TVM 0.27's legalized kernel gives NaN for bias plus causal_mask), the result is
    permuted back to BHSD
    and, with ``nan_to_zero``, NaN rows become 0. float32 only: other dtypes are decomposed with
    float32 scores and softmax (:func:`_decomposed`), whatever ``softmax_precision`` says. (TVM's
    own flash-style prefill TIR kernel, ``tvm.relax.frontend.nn.llm``, is not used: on the H200 at
    B8 H16 S4096 D64 fp16 it took 113 ms against 18.3 ms for this decomposed form.)

    With ``kernels`` (a :class:`passctl.targets.tvm.triton_dispatch.TritonLibrary`, CUDA builds
    only) every attention whose mask has a materialized key axis runs the Triton FlashAttention-2
    kernel (any dtype, mask, causal flag and GQA); the rules above are the fallback.

    Args:
        bb: the frontend's ``relax.BlockBuilder``.
        inputs: Relax expressions ``[Q, K, V, Mask?]``.
        attrs: the node's attributes (strings may be bytes).
        kernels: the Triton kernel library of a CUDA build, or None.

    Returns:
        The Relax expression of the output ``[B, H, S, Dv]``.
    """
    from tvm import relax

    op = relax.op
    q, k, v = (bb.normalize(x) for x in inputs[:3])
    mask = bb.normalize(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else None
    heads, kv_heads = int(attrs["num_heads"]), int(attrs["kv_num_heads"])
    kind = attr_text(attrs.get("mask_kind", "none"))
    dtype = str(q.ty.dtype)
    bsnh = [0, 2, 1, 3]
    # A boolean mask with a finite fill replaces masked scores (fully masked rows are uniform): only
    # the decomposed form computes that; the kernels add a bias.
    finite_fill = mask is not None and kind == "boolean" and math.isfinite(
        float(attrs.get("mask_fill", -np.inf)))
    if kernels is not None and not finite_fill:
        from passctl.targets.tvm.triton_dispatch import call_attention

        try:
            return call_attention(bb, kernels, q, k, v, mask, attrs)
        except ValueError as e:  # a mask broadcast over keys: TVM's kernels below
            logging.getLogger(__name__).info("attention on TVM kernels: %s", e)
    if kv_heads != heads:
        k = op.repeat(k, heads // kv_heads, axis=1)
        v = op.repeat(v, heads // kv_heads, axis=1)
    if dtype != "float32" or finite_fill:
        return _decomposed(bb, q, k, v, mask, kind, attrs, dtype)
    bias = None
    if mask is not None and kind != "none":
        bias = mask
        if kind == "boolean":
            bias = op.where(mask, relax.const(np.zeros((), dtype=dtype)),
                            relax.const(np.full((), -np.inf, dtype=dtype)))
        elif str(mask.ty.dtype) != dtype:
            bias = op.astype(bias, dtype)
        bias = _rank4(bias, len(mask.ty.shape))
        t = int(bb.normalize(k).ty.shape[2])  # k may be a repeat (GQA) here
        if int(mask.ty.shape[-1]) != t:  # nn.attention needs the bias's key axis materialized
            bias = bb.normalize(bias)
            bias = op.broadcast_to(bias, [int(x) for x in list(bias.ty.shape)[:-1]] + [t])
    # NOTE: with a mask the causal flag is only a hint (the mask holds the causal part), and TVM
    # 0.27's legalized nn.attention returns NaN when it gets both a bias and causal_mask.
    causal = "TopLeft" if int(attrs.get("is_causal", 0)) and bias is None else None
    y = op.nn.attention(op.permute_dims(q, bsnh), op.permute_dims(k, bsnh), op.permute_dims(v, bsnh),
                        bias, scale=float(attrs["scale"]), causal_mask=causal)
    y = op.permute_dims(y, bsnh)
    return _nan_to_zero(bb, y, dtype) if int(attrs.get("nan_to_zero", 0)) else y


def converters(kernels=None) -> Dict[str, Any]:
    """``{"Attention": converter}`` to merge into the TVM emitter's passctl converter table; with
    ``kernels`` (a CUDA build's Triton library) the converter uses the Triton kernel."""
    return {"Attention": lambda bb, inputs, attrs: relax_attention(bb, inputs, attrs, kernels)}


__all__ = ["converters", "relax_attention"]
