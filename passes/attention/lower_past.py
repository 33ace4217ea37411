"""Lowerings of ``passctl::Attention`` with past inputs and present outputs (fuse-attention-past):
``com.microsoft::GroupQueryAttention`` with its KV cache on ONNX Runtime, else the cache Concat and
any form of attention without past (registered first into lower-onnxruntime and lower-standard)."""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from passctl.dialect.attention import OP_TYPE
from passctl.dialect.canonical import DOMAIN, MS_DOMAIN, ensure_opset
from passctl.ir import Node, Value
from passctl.passes.attention.layout import dims
from passctl.passes.attention.lower import (GQA_CPU_HEAD_SIZE_MULTIPLE, KERNEL_DTYPES, _fill_const,
                                            _from_bsd, _i64, _nan_to_zero, _to_bsd)
from passctl.passes.lowering.table import _TABLES, LowerContext, register_lowering


def has_past(node: Node) -> bool:
    """Whether ``node`` is a ``passctl::Attention`` with past inputs (inputs 4 and 5)."""
    return len(node.inputs) > 5 and node.inputs[4] is not None and node.inputs[5] is not None


def group_query_attention_past(ctx: LowerContext, node: Node) -> Optional[Tuple[Value, Value, Value]]:
    """``com.microsoft::GroupQueryAttention(query, key, value, past_key, past_value, seqlens_k,
    total_sequence_length, attention_bias=Mask)`` (ContribOperators.md), the cache as ONNX Runtime
    keeps it: 3-D ``[B, S, H * D]`` projections (taken from the head-split Reshape where there is
    one), past ``[B, Hkv, P, D]``, present ``[B, Hkv, P + S, D]``, ``seqlens_k`` = P + S - 1 for
    every row (int32 [B]), ``total_sequence_length`` = P + S (int32 scalar), the mask as
    ``attention_bias`` (a boolean one as 0 / fill).

    The kernel is always causal (bottom-right: query i sees keys <= P + i), which the node's
    ``is_causal`` proves the mask holds (fuse-attention-past checks it), so the result equals the
    original in every row the mask does not drop entirely. Such rows (a left-padded prompt's pad
    positions) average V over all keys in the original (a finite fill) and over the causal keys
    in the kernel; no kept query reads them.

    Checked (reasons go to ``fallbacks``): causal; float32 / float16; heads a multiple of KV
    heads; a static head size, a multiple of 8 (the CPU kernel), equal for V; a mask of rank 4;
    batch or sequence static 1 (ONNX Runtime 1.32's CPU kernel: "batch_size must be 1 when
    sequence_length > 1 and past context is given")."""
    if not has_past(node):
        return None
    q, k, v, mask, past_k, past_v = node.inputs[:6]
    heads, kv_heads = int(node.attr("num_heads")), int(node.attr("kv_num_heads"))
    if not int(node.attr("is_causal", 0)):
        return ctx.refuse("not proven causal (the kernel always is)")
    if ctx.opset < 15:
        return ctx.refuse("opset below 15 (Shape with start/end)")
    if q.dtype is None or q.dtype.name not in KERNEL_DTYPES:
        return ctx.refuse(f"element type {q.dtype.name if q.dtype else 'unknown'}")
    if heads % kv_heads:
        return ctx.refuse(f"{heads} query heads are not a multiple of {kv_heads} KV heads")
    qd, vd = dims(q), dims(v)
    head_size = qd[3] if qd is not None and isinstance(qd[3], int) else None
    if head_size is None or head_size % GQA_CPU_HEAD_SIZE_MULTIPLE or vd is None or vd[3] != head_size:
        return ctx.refuse(f"head size {head_size} is not static, not a multiple of "
                          f"{GQA_CPU_HEAD_SIZE_MULTIPLE} or not V's")
    if qd[0] != 1 and qd[2] != 1:
        return ctx.refuse("ONNX Runtime's kernel refuses batch > 1 with several new tokens and a "
                          "past (a batch's chunked prefill); neither batch nor sequence is static 1")
    kind = node.attr("mask_kind", "none")
    md = dims(mask) if mask is not None else None
    if kind != "none" and (md is None or len(md) != 4):
        return ctx.refuse("the mask is not of rank 4 [B|1, H|1, S, P + S] (attention_bias)")
    b = ctx.b
    bias = None
    if kind == "boolean":
        dtype = q.dtype.numpy()
        bias = b.op("Where", mask, ctx.const(np.array(0, dtype=dtype), "attn_zero"),
                    _fill_const(ctx, node, dtype))
    elif kind == "additive":
        bias = mask
    q3, k3, v3 = (_to_bsd(ctx, x, h, head_size) for x, h in ((q, heads), (k, kv_heads), (v, kv_heads)))
    total = b.op("Add", b.op("Shape", past_k, start=2, end=3), b.op("Shape", q, start=2, end=3))
    batch = b.op("Shape", q, start=0, end=1)
    seqlens = b.op("Cast", b.op("Expand", b.op("Sub", total, _i64(ctx, [1], "attn_one")), batch), to=6)
    total32 = b.op("Cast", b.op("Reshape", total, _i64(ctx, [], "attn_scalar")), to=6)
    ins = [q3, k3, v3, past_k, past_v, seqlens, total32] + ([None, None, None, bias] if bias is not None else [])
    y, pk, pv = b.op("GroupQueryAttention", *ins, domain=MS_DOMAIN, outputs=3, num_heads=heads,
                     kv_num_heads=kv_heads, scale=float(node.attr("scale")))
    ensure_opset(ctx.model, MS_DOMAIN, 1)
    ctx.form = f"{OP_TYPE}+past->com.microsoft::GroupQueryAttention"
    y = _from_bsd(ctx, y, heads)
    if int(node.attr("nan_to_zero", 0)):
        y = _nan_to_zero(ctx, y, node)
    return y, pk, pv


def _concat_then(target: str):
    def attention_past_concat(ctx: LowerContext, node: Node) -> Optional[Tuple[Value, Value, Value]]:
        """``present = Concat(past, new, axis=2)`` for K and V, then the first form of ``target``'s
        table that takes the attention without past over the presents (``is_causal`` cleared:
        without past it would mean top-left aligned; the mask holds the causal part)."""
        if not has_past(node):
            return None
        q, k, v, mask, past_k, past_v = node.inputs[:6]
        pk = ctx.b.op("Concat", past_k, k, axis=2)
        pv = ctx.b.op("Concat", past_v, v, axis=2)
        attrs = {name: node.attr(name) for name in node.attributes}
        attrs["is_causal"] = 0
        plain = Node(DOMAIN, OP_TYPE, [q, pk, pv, mask], attrs, 1, name=node.name)
        try:
            for fn in _TABLES[target][OP_TYPE]:
                if fn in _PAST_FORMS:
                    continue
                y = fn(ctx, plain)
                if y is not None:
                    ctx.form = f"{OP_TYPE}+past->Concat+{ctx.form.split('->', 1)[-1]}"
                    return y, pk, pv
        finally:
            plain.set_inputs([])  # the stand-in node must leave no uses behind
        return ctx.refuse("no form takes the attention over the concatenated cache")

    return attention_past_concat


_PAST_FORMS = []
# NOTE: registered first, so a node with past never reaches the forms without past (which read
# inputs 0-3 only); the Concat form ends in `decomposed`, which takes every node.
for _target in ("standard", "onnxruntime"):
    _fn = _concat_then(_target)
    _PAST_FORMS.append(_fn)
    register_lowering(_target, OP_TYPE, _fn, first=True)
_PAST_FORMS.append(group_query_attention_past)
register_lowering("onnxruntime", OP_TYPE, group_query_attention_past, first=True)

__all__ = ["group_query_attention_past", "has_past"]
