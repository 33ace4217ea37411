"""Lowerings of passctl::Attention: ONNX Attention-23, com.microsoft.MultiHeadAttention, decomposed."""

from __future__ import annotations

from typing import Optional

import numpy as np

from passctl.dialect.attention import OP_TYPE
from passctl.dialect.canonical import MS_DOMAIN
from passctl.ir import Node, Value
from passctl.passes.attention.layout import head_split_roles, dims
from passctl.passes.lowering.table import LowerContext, register_lowering
from passctl.passes.rewrite import constant_value

ATTENTION_OPSET = 23
"""First default-domain opset with the ``Attention`` op."""


def _attrs(node: Node):
    return (float(node.attr("scale")), node.attr("mask_kind", "none"), int(node.attr("is_causal", 0)),
            int(node.attr("num_heads")), int(node.attr("kv_num_heads")),
            int(node.attr("softmax_precision", 0)), int(node.attr("nan_to_zero", 0)))


def _mask(node: Node) -> Optional[Value]:
    return node.inputs[3] if len(node.inputs) > 3 else None


def _np_dtype(v: Value):
    return v.dtype.numpy() if v.dtype is not None else np.float32


def _i64(ctx: LowerContext, values, name: str) -> Value:
    return ctx.const(np.array(values, dtype=np.int64), name)


def _unsqueeze(ctx: LowerContext, x: Value, axes) -> Value:
    if ctx.opset >= 13:
        return ctx.b.op("Unsqueeze", x, _i64(ctx, axes, "attn_axes"))
    return ctx.b.op("Unsqueeze", x, axes=list(axes))


def repeat_kv(ctx: LowerContext, x: Value, n_rep: int, heads: int, head_size: Optional[int]) -> Value:
    """``[B, Hkv, T, D]`` -> ``[B, Hkv * n_rep, T, D]``, head h reading KV head h // n_rep
    (transformers' ``repeat_kv``: Unsqueeze, Expand, Reshape)."""
    if n_rep == 1:
        return x
    e = ctx.b.op("Expand", _unsqueeze(ctx, x, [2]), _i64(ctx, [1, 1, n_rep, 1, 1], "attn_rep"))
    if head_size is None:
        d = dims(x)
        head_size = d[3] if d is not None and isinstance(d[3], int) else None
    if head_size is not None:
        return ctx.b.op("Reshape", e, _i64(ctx, [0, heads, -1, head_size], "attn_rep_shape"))
    shape = ctx.b.op("Shape", x)
    first = ctx.b.op("Slice", shape, _i64(ctx, [0], "attn_0"), _i64(ctx, [1], "attn_1"))
    last = ctx.b.op("Slice", shape, _i64(ctx, [2], "attn_2"), _i64(ctx, [4], "attn_4"))
    target = ctx.b.op("Concat", first, _i64(ctx, [heads], "attn_heads"), last, axis=0)
    return ctx.b.op("Reshape", e, target)


def _rows_expanded(ctx: LowerContext, bias: Value, mask: Value, q: Value) -> Value:
    """``bias`` as rank 4 whose query axis is Q's sequence length: ONNX Runtime's MultiHeadAttention
    and Attention-23 kernels broadcast a mask over batch and heads only (a ``[B, 1, 1, T]`` padding
    mask is expanded to ``[B, 1, S, T]``; a mask whose axis is provably S is left alone)."""
    b = ctx.b
    md = dims(mask) or []
    if len(md) < 4:
        bias = _unsqueeze(ctx, bias, list(range(4 - len(md))))
    if len(md) < 2 or md[-2] != dims(q)[2] or md[-2] == 1:
        seq = b.op("Shape", q, start=2, end=3) if ctx.opset >= 15 else b.op(
            "Slice", b.op("Shape", q), _i64(ctx, [2], "attn_s"), _i64(ctx, [3], "attn_e"))
        shape = b.op("Concat", _i64(ctx, [1, 1], "attn_11"), seq, _i64(ctx, [1], "attn_1"), axis=0)
        bias = b.op("Expand", bias, shape)
    return bias


def _nan_to_zero(ctx: LowerContext, y: Value) -> Value:
    zero = ctx.const(np.array(0, dtype=_np_dtype(y)), "attn_zero")
    return ctx.b.op("Where", ctx.b.op("IsNaN", y), zero, y)


def decomposed(ctx: LowerContext, node: Node) -> Optional[Value]:
    """The canonical op's math in standard ops of any opset >= 13: MatMul, Mul by the scale, mask
    Add / Where, Softmax(-1) (in float32 when ``softmax_precision``), MatMul with V. ``is_causal``
    without a mask becomes a Trilu lower triangle (opset >= 14); with a mask the mask already holds
    the causal part (the fusion sets the flag only then), so it is not applied twice."""
    q, k, v = node.inputs[:3]
    mask = _mask(node)
    scale, kind, causal, heads, kv_heads, precision, nan_zero = _attrs(node)
    if ctx.opset < 13 or (causal and mask is None and ctx.opset < 14):
        return None
    b, dtype = ctx.b, _np_dtype(q)
    head_size = dims(q)[3] if dims(q) else None
    n_rep = heads // kv_heads
    k = repeat_kv(ctx, k, n_rep, heads, head_size if isinstance(head_size, int) else None)
    v = repeat_kv(ctx, v, n_rep, heads, None)
    s = b.op("MatMul", q, b.op("Transpose", k, perm=[0, 1, 3, 2]))
    s = b.op("Mul", s, ctx.const(np.array(scale, dtype=dtype), "attn_scale"))
    if kind == "additive":
        s = b.op("Add", s, mask)
    elif kind == "boolean":
        s = b.op("Where", mask, s, ctx.const(np.array(-np.inf, dtype=dtype), "attn_neg_inf"))
    if causal and mask is None:
        lengths = b.op("Shape", s, start=-2) if ctx.opset >= 15 else b.op(
            "Slice", b.op("Shape", s), _i64(ctx, [-2], "attn_m2"), _i64(ctx, [2**62], "attn_end"))
        ones = b.op("ConstantOfShape", lengths, value=np.ones(1, dtype=np.bool_))
        s = b.op("Where", b.op("Trilu", ones, upper=0), s,
                 ctx.const(np.array(-np.inf, dtype=dtype), "attn_neg_inf"))
    cast = precision == 1 and q.dtype is not None and q.dtype.name != "FLOAT"
    if cast:
        s = b.op("Cast", s, to=1)
    p = b.op("Softmax", s, axis=-1)
    if cast:
        p = b.op("Cast", p, to=int(q.dtype))
    if nan_zero:
        p = _nan_to_zero(ctx, p)
    ctx.form = f"{OP_TYPE}->decomposed"
    return b.op("MatMul", p, v)


def attention23(ctx: LowerContext, node: Node) -> Optional[Value]:
    """ONNX ``Attention`` (opset 23) with the 4-D inputs as they are (KV heads by shape): only for
    models whose default opset is already >= 23 (an opset cannot be raised for one node)."""
    if ctx.opset < ATTENTION_OPSET:
        return None
    q, k, v = node.inputs[:3]
    mask = _mask(node)
    scale, kind, causal, _, _, precision, nan_zero = _attrs(node)
    ins = [q, k, v] + ([_rows_expanded(ctx, mask, mask, q)] if mask is not None and kind != "none"
                       else [])
    # NOTE: is_causal only without a mask: with one the flag is a hint, and a kernel's -inf causal
    # mask differs from a finite fill (finfo.min) in fully masked rows (uniform over all keys vs the
    # earlier ones).
    y = ctx.b.op("Attention", *ins, scale=scale, is_causal=causal if len(ins) == 3 else 0,
                 softmax_precision=1 if precision == 1 else None)
    ctx.form = f"{OP_TYPE}->Attention-23"
    return _nan_to_zero(ctx, y) if nan_zero else y


def _to_bsd(ctx: LowerContext, x: Value, heads: int, head_size: Optional[int]) -> Value:
    """``[B, H, S, D]`` -> ``[B, S, H * D]``; when ``x`` is ``Transpose(Reshape(y, [B, S, H, D]),
    (0, 2, 1, 3))`` of a 3-D ``y`` (the head split), ``y`` itself."""
    t = x.producer
    if t is not None and t.op_type == "Transpose" and tuple(t.attr("perm") or ()) == (0, 2, 1, 3):
        r = t.inputs[0].producer
        if r is not None and r.op_type == "Reshape" and head_split_roles(r) == ("B", "S", "H", "D"):
            return r.inputs[0]
    hidden = heads * head_size if isinstance(head_size, int) else -1
    return ctx.b.op("Reshape", ctx.b.op("Transpose", x, perm=[0, 2, 1, 3]),
                    _i64(ctx, [0, 0, hidden], "attn_bsd"))


def _from_bsd(ctx: LowerContext, y: Value, heads: int) -> Value:
    """``[B, S, H * Dv]`` -> ``[B, H, S, Dv]`` (Reshape + Transpose, which ONNX Runtime cancels
    against the model's own head-merging Transpose)."""
    y4 = ctx.b.op("Reshape", y, _i64(ctx, [0, 0, heads, -1], "attn_bshd"))
    return ctx.b.op("Transpose", y4, perm=[0, 2, 1, 3])


def _without_trailing_none(ins: list) -> list:
    """``ins`` without its trailing omitted (None) optional inputs."""
    while ins and ins[-1] is None:
        ins.pop()
    return ins


def _bias(ctx: LowerContext, node: Node) -> Optional[Value]:
    """The mask as an additive float bias ``[B|1, 1|H, S, T]`` (a boolean mask becomes 0 / -inf)."""
    q, mask, kind = node.inputs[0], _mask(node), node.attr("mask_kind", "none")
    if kind == "none" or mask is None:
        return None
    bias = mask
    if kind == "boolean":
        dtype = _np_dtype(q)
        bias = ctx.b.op("Where", mask, ctx.const(np.array(0, dtype=dtype), "attn_zero"),
                        ctx.const(np.array(-np.inf, dtype=dtype), "attn_neg_inf"))
    return _rows_expanded(ctx, bias, mask, q)


def _minus_inf_filled(mask: Optional[Value]) -> bool:
    """Whether an additive mask is ``Where(cond, 0, -inf)`` (possibly expanded or cast): its masked
    entries are -inf, as a kernel's own causal mask."""
    for _ in range(4):
        n = mask.producer if mask is not None else None
        if n is None:
            return False
        if n.op_type in ("Expand", "Cast", "Reshape", "Unsqueeze"):
            mask = n.inputs[0]
            continue
        if n.op_type != "Where":
            return False
        keep, fill = constant_value(n.inputs[1]), constant_value(n.inputs[2])
        return keep is not None and fill is not None and bool(np.all(keep == 0)) and bool(
            np.all(np.isneginf(fill)))
    return False


def group_query_attention(ctx: LowerContext, node: Node) -> Optional[Value]:
    """``com.microsoft.GroupQueryAttention`` for causal grouped-query attention (ONNX Runtime
    ContribOperators.md; run here on ORT 1.32's CPU provider): 3-D ``query [B, S, H * D]``,
    ``key`` / ``value [B, S, Hkv * D]`` without repeating KV heads, no KV cache (``seqlens_k`` =
    S - 1 for every batch row, ``total_sequence_length`` = S), the mask as ``attention_bias``. The
    kernel is always causal, which the fusion's ``is_causal`` proves the mask holds; fully masked
    rows give 0 (measured), as ``nan_to_zero`` wants. None unless causal, KV heads < Q heads, V's
    head size equals Q's, and the mask is boolean or ``Where(cond, 0, -inf)`` (with a finite fill a
    fully masked row averages all keys, the kernel's causal -inf only the earlier ones)."""
    q, k, v = node.inputs[:3]
    scale, kind, causal, heads, kv_heads, _, nan_zero = _attrs(node)
    qd, vd = dims(q), dims(v)
    if not causal or kv_heads == heads or qd is None or vd is None:
        return None
    if kind == "additive" and not _minus_inf_filled(_mask(node)):
        return None  # a finite fill: fully masked rows would differ (see attention23's NOTE)
    head_size = qd[3] if isinstance(qd[3], int) else None
    if head_size is None or vd[3] != head_size:
        return None
    b = ctx.b
    q3, k3, v3 = (_to_bsd(ctx, x, h, head_size) for x, h in ((q, heads), (k, kv_heads), (v, kv_heads)))
    shape = b.op("Shape", q)
    seq = b.op("Slice", shape, _i64(ctx, [2], "attn_2"), _i64(ctx, [3], "attn_3"))
    batch = b.op("Slice", shape, _i64(ctx, [0], "attn_0"), _i64(ctx, [1], "attn_1"))
    total = b.op("Cast", b.op("Reshape", seq, _i64(ctx, [], "attn_scalar")), to=6)
    last = b.op("Cast", b.op("Sub", seq, _i64(ctx, [1], "attn_one")), to=6)
    seqlens = b.op("Expand", last, batch)
    ins = _without_trailing_none([q3, k3, v3, None, None, seqlens, total, None, None, None,
                                  _bias(ctx, node)])
    y, _, _ = b.op("GroupQueryAttention", *ins, domain=MS_DOMAIN, outputs=3, num_heads=heads,
                   kv_num_heads=kv_heads, scale=scale)
    if nan_zero:
        y = _nan_to_zero(ctx, y)
    ctx.form = f"{OP_TYPE}->com.microsoft::GroupQueryAttention"
    return _from_bsd(ctx, y, heads)


def multi_head_attention(ctx: LowerContext, node: Node) -> Optional[Value]:
    """``com.microsoft.MultiHeadAttention(query, key, value, bias=, key_padding_mask=,
    attention_bias)`` with 3-D ``[B, S, H * D]`` inputs (ONNX Runtime ContribOperators.md), KV heads
    repeated to H for grouped-query attention, a boolean mask turned into a 0 / -inf bias expanded to
    ``[B|1, 1, S, T]``; the output goes back to ``[B, H, S, Dv]`` (Reshape + Transpose, which ONNX
    Runtime cancels against the model's own Transpose). None when V's head size differs from Q's."""
    q, k, v = node.inputs[:3]
    scale, _, causal, heads, kv_heads, _, nan_zero = _attrs(node)
    qd, vd = dims(q), dims(v)
    if qd is None or vd is None or (isinstance(vd[3], int) and isinstance(qd[3], int) and vd[3] != qd[3]):
        return None
    b = ctx.b
    head_size = qd[3] if isinstance(qd[3], int) else None
    n_rep = heads // kv_heads
    k3 = _to_bsd(ctx, repeat_kv(ctx, k, n_rep, heads, head_size), heads, head_size)
    v3 = _to_bsd(ctx, repeat_kv(ctx, v, n_rep, heads, head_size), heads, head_size)
    q3 = _to_bsd(ctx, q, heads, head_size)
    bias = _bias(ctx, node)
    ins = _without_trailing_none([q3, k3, v3, None, None, bias])
    # NOTE: unidirectional only without a mask: with one, the flag is a hint (the mask holds the
    # causal part), and ONNX Runtime 1.32's CPU MultiHeadAttention with both gave wrong values for
    # left-padded rows (measured on the GPT-2 and LLaMA exports).
    y = b.op("MultiHeadAttention", *ins, domain=MS_DOMAIN, num_heads=heads, scale=scale,
             unidirectional=1 if causal and bias is None else None)
    if nan_zero:
        y = _nan_to_zero(ctx, y)
    ctx.form = f"{OP_TYPE}->com.microsoft::MultiHeadAttention" + (" (kv repeated)" if n_rep > 1 else "")
    return _from_bsd(ctx, y, heads)


# NOTE: the first function that returns a value wins: Attention-23 only exists from opset 23;
# GroupQueryAttention takes causal grouped-query attention without repeating KV heads; MHA needs
# equal Q/V head sizes; decomposed always works (opset >= 13).
for _fn in (attention23, group_query_attention, multi_head_attention, decomposed):
    register_lowering("onnxruntime", OP_TYPE, _fn)
for _fn in (attention23, decomposed):
    register_lowering("standard", OP_TYPE, _fn)

__all__ = ["ATTENTION_OPSET", "attention23", "decomposed", "group_query_attention",
           "multi_head_attention", "repeat_kv"]
