"""Lowerings of passctl::Attention: ONNX Attention-23, com.microsoft.MultiHeadAttention, decomposed."""

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

from passctl.dialect.attention import OP_TYPE
from passctl.dialect.canonical import MS_DOMAIN
from passctl.ir import Node, Value
from passctl.passes.attention.layout import dims, head_split_roles, same_dim, unnamed
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


def _fill(node: Node) -> float:
    """The score a boolean mask puts at masked keys (``mask_fill``; -inf when absent)."""
    return float(node.attr("mask_fill", -math.inf))


def _finite_fill(node: Node) -> bool:
    """A boolean mask whose masked scores are a finite number (``Where(keep, s, -1e4)``): a fully
    masked row then averages V over all keys, which no additive-bias kernel computes."""
    return node.attr("mask_kind", "none") == "boolean" and _mask(node) is not None and \
        math.isfinite(_fill(node))


def _fill_const(ctx: LowerContext, node: Node, dtype) -> Value:
    """``mask_fill`` as a scalar of ``dtype``; a finite fill stays finite (finfo.min at worst: -1e9
    in float16 would round to -inf and turn a fully masked row's uniform softmax into NaN)."""
    fill = _fill(node)
    if math.isfinite(fill) and np.dtype(dtype).kind == "f":
        fill = max(fill, float(np.finfo(dtype).min))
    return ctx.const(np.array(fill, dtype=dtype), "attn_fill")


KERNEL_DTYPES = ("FLOAT", "FLOAT16")
"""Element types ONNX Runtime's CPU MultiHeadAttention / GroupQueryAttention kernels are registered
for (float and MLFloat16; ContribOperators.md lists the CPU provider's types per op; GQA's bfloat16
is CUDA only); others have no kernel and the session would refuse the model."""


def _kernel_dtype_reason(node: Node) -> str:
    q = node.inputs[0]
    if q.dtype is None or q.dtype.name not in KERNEL_DTYPES:
        return f"Q's element type {q.dtype.name if q.dtype is not None else 'unknown'} has no kernel " \
               f"(only {', '.join(t.lower() for t in KERNEL_DTYPES)})"
    return ""


def _heads_mismatch(node: Node) -> str:
    """Why Q's / K's / V's static head axes disagree with ``num_heads`` / ``kv_num_heads`` ("" when
    they agree or are not static): a kernel told the wrong head count splits the hidden axis wrongly
    and returns a wrong shape (issue 15, case 12)."""
    heads, kv_heads = int(node.attr("num_heads")), int(node.attr("kv_num_heads"))
    for name, x, want in (("Q", node.inputs[0], heads), ("K", node.inputs[1], kv_heads),
                          ("V", node.inputs[2], kv_heads)):
        d = dims(x)
        if d is None or len(d) != 4:
            return f"the rank of {name} '{x.name}' is unknown or not 4 (run infer-shapes)"
        if isinstance(d[1], int) and d[1] != want:
            return f"{name} '{x.name}' has {d[1]} heads, the attention says {want}"
    return ""


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


def _seq_len(ctx: LowerContext, x: Value) -> Value:
    """``Shape(x)[2:3]`` (the sequence axis of a BHSD operand) as a 1-element int64 tensor."""
    b = ctx.b
    if ctx.opset >= 15:
        return b.op("Shape", x, start=2, end=3)
    return b.op("Slice", b.op("Shape", x), _i64(ctx, [2], "attn_s"), _i64(ctx, [3], "attn_e"))


def _attention_bias(ctx: LowerContext, node: Node, boolean_as_bias: bool = True
                    ) -> Tuple[Optional[Value], str]:
    """The mask as the ``attention_bias`` a kernel takes: rank 4, ``[B or 1, H or 1, S, T]`` with
    S Q's and T K's sequence length (the mask broadcast over keys or queries expanded).

    ONNX Runtime's MultiHeadAttention and GroupQueryAttention check exactly that
    (``onnxruntime/contrib_ops/cpu/bert/multihead_attention_helper.h``, ``CheckAttentionBias``:
    "Input 'attention_bias' is expected to have 4 dimensions", "dimension 2 should be same as
    sequence_length", "dimension 3 should be same as total_sequence_length"; ContribOperators.md:
    attention_bias ``(batch_size or 1, num_heads or 1, sequence_length, total_sequence_length)``).
    Axes 0 and 1 need no check: the fusion proved the mask broadcasts to the scores ``[B, H, S,
    T]``, so they are 1 or B / H. A boolean mask becomes ``Where(mask, 0, mask_fill)`` in Q's type
    (kept boolean when ``boolean_as_bias`` is false: ONNX Attention-23 takes a bool mask).

    Returns:
        ``(bias, "")``, ``(None, "")`` without a mask, or ``(None, reason)`` when the mask's rank is
        unknown or above 4 (the form must not guess: an unknown rank once gave an 8-D bias).
    """
    q, k = node.inputs[0], node.inputs[1]
    mask, kind = _mask(node), node.attr("mask_kind", "none")
    if kind == "none" or mask is None:
        return None, ""
    md = dims(mask)
    if md is None:
        return None, (f"the rank of mask '{mask.name}' is unknown, so attention_bias cannot be "
                      "made rank 4 (run infer-shapes)")
    if len(md) > 4:
        return None, f"mask '{mask.name}' has rank {len(md)} > 4"
    b, bias = ctx.b, mask
    if kind == "boolean" and boolean_as_bias:
        dtype = _np_dtype(q)
        bias = b.op("Where", mask, ctx.const(np.array(0, dtype=dtype), "attn_zero"),
                    _fill_const(ctx, node, dtype))
    if len(md) < 4:
        bias = _unsqueeze(ctx, bias, list(range(4 - len(md))))
        md = [1] * (4 - len(md)) + md
    qd, kd = dims(q), dims(k)
    rows_ok = qd is not None and same_dim(md[2], qd[2]) and not unnamed(md[2])
    keys_ok = kd is not None and same_dim(md[3], kd[2]) and not unnamed(md[3])
    if not (rows_ok and keys_ok):
        shape = b.op("Concat", _i64(ctx, [1, 1], "attn_11"), _seq_len(ctx, q), _seq_len(ctx, k), axis=0)
        bias = b.op("Expand", bias, shape)
    return bias, ""


def _reduce(ctx: LowerContext, op_type: str, x: Value, axes) -> Value:
    """``op_type`` (ReduceMax / ReduceMean / ReduceSum) over ``axes`` with keepdims 1, at any opset
    (``axes`` became an input at opset 18, for ReduceSum at 13)."""
    if ctx.opset >= (13 if op_type == "ReduceSum" else 18):
        return ctx.b.op(op_type, x, _i64(ctx, axes, "attn_axes"), keepdims=1)
    return ctx.b.op(op_type, x, axes=list(axes), keepdims=1)


def _fully_masked_rows(ctx: LowerContext, node: Node, y: Value) -> Value:
    """``y [B, H, S, Dv]`` of a kernel that added ``Where(keep, 0, fill)`` to the scores, made exact
    for a finite ``mask_fill``: where a query row keeps no key, the original
    ``softmax(Where(keep, s, fill))`` is uniform (every score is ``fill``), so the row is the mean
    of V over the keys; the kernel's ``softmax(s + fill) = softmax(s)`` differs. Rows that keep a
    key are the kernel's (``exp(fill + s - max)`` and ``exp(fill - max)`` both underflow to 0 in
    float32 for fill <= -1e4)."""
    b = ctx.b
    _, k, v = node.inputs[:3]
    heads, kv_heads = int(node.attr("num_heads")), int(node.attr("kv_num_heads"))
    mask = _mask(node)
    if dims(mask) == []:  # a scalar keeps or masks every row
        keeps_any = mask
    else:
        keeps_any = b.op("Cast", _reduce(ctx, "ReduceMax", b.op("Cast", mask, to=1), [-1]), to=9)
    vd = dims(v)
    mean_v = _reduce(ctx, "ReduceMean", v, [2])
    mean_v = repeat_kv(ctx, mean_v, heads // kv_heads, heads,
                       vd[3] if vd is not None and isinstance(vd[3], int) else None)
    return b.op("Where", keeps_any, y, mean_v)


def _finite_fill_keys(ctx: LowerContext, node: Node, k: Value) -> Tuple[Value, Value]:
    """For a kernel given a finite fill's ``Where(keep, 0, fill)`` bias: ``(k_clean, kept_bad)``.

    The original ``Where(keep, q.k, fill)`` never sees a masked key's score, so a NaN or an
    infinity in a masked key's K changes nothing; the kernel adds the bias to that score and the
    row turns NaN. ``k_clean`` is K with its non-finite entries set to 0 (a masked score is then
    exactly ``fill``, as in the original); ``kept_bad [B, H, S, 1]`` marks the rows that keep a key
    whose K is not finite, which the original computes as NaN (a NaN score; ``+inf`` gives
    ``inf - inf``), set to NaN after the kernel. Inexact only where a kept key's score is ``-inf``
    (an infinite K against a finite Q: the original drops that key)."""
    b = ctx.b
    heads, kv_heads = int(node.attr("num_heads")), int(node.attr("kv_num_heads"))
    dtype = _np_dtype(k)
    zero = ctx.const(np.array(0, dtype=dtype), "attn_zero")
    zk = b.op("Mul", k, zero)
    k_clean = b.op("Where", b.op("IsNaN", zk), zero, k)
    bad = b.op("Cast", b.op("IsNaN", _reduce(ctx, "ReduceSum", zk, [3])), to=1)  # [B, Hkv, T, 1]
    bad = b.op("Transpose", repeat_kv(ctx, bad, heads // kv_heads, heads, 1), perm=[0, 1, 3, 2])
    kept = b.op("Mul", b.op("Cast", _mask(node), to=1), bad)  # [B, H, S, T]
    kept_bad = b.op("Greater", _reduce(ctx, "ReduceMax", kept, [-1]),
                    ctx.const(np.array(0, dtype=np.float32), "attn_zero_f32"))
    return k_clean, kept_bad


def _nan_where(ctx: LowerContext, rows: Value, y: Value) -> Value:
    """``y`` with NaN in the ``rows`` ([B, H, S, 1] bool)."""
    return ctx.b.op("Where", rows, ctx.const(np.array(np.nan, dtype=_np_dtype(y)), "attn_nan"), y)


def _nan_rows(ctx: LowerContext, y: Value, bias: Value) -> Value:
    """``y [B, H, S, Dv]`` of a kernel that gives 0 in a query row whose ``bias`` ([B|1, H|1, S, T])
    is -inf at every key (ONNX Runtime 1.32's CPU Attention-23 and GroupQueryAttention, measured),
    with NaN there instead: what the original softmax over all -inf scores gives (without
    ``nan_to_zero``, which wants the 0)."""
    b = ctx.b
    none_kept = b.op("IsInf", _reduce(ctx, "ReduceMax", bias, [-1]), detect_positive=0)
    return b.op("Where", none_kept, ctx.const(np.array(np.nan, dtype=_np_dtype(y)), "attn_nan"), y)


def _zero_probs_out(ctx: LowerContext, node: Node) -> Value:
    """``0 @ V`` as ``[B, H, 1, Dv]``: what the original ``Where(IsNaN(p), 0, p) @ V`` gives in a
    row whose probabilities were all NaN: 0 where V's column over the keys is finite, NaN where it
    holds a NaN or an infinity (``0 * inf`` is NaN), so a kernel's output is fixed exactly whatever
    V holds: ``ReduceSum(V * 0, keys)``, KV heads repeated to H."""
    b = ctx.b
    v = node.inputs[2]
    heads, kv_heads = int(node.attr("num_heads")), int(node.attr("kv_num_heads"))
    zero_v = _reduce(ctx, "ReduceSum", b.op("Mul", v, ctx.const(np.array(0, dtype=_np_dtype(v)),
                                                                "attn_zero")), [2])
    vd = dims(v)
    return repeat_kv(ctx, zero_v, heads // kv_heads, heads,
                     vd[3] if vd is not None and isinstance(vd[3], int) else None)


def _nan_to_zero(ctx: LowerContext, y: Value, node: Optional[Node] = None) -> Value:
    """``nan_to_zero`` on ``y``: the original zeroes NaN probabilities before multiplying with V.
    ``y`` is the decomposed form's probabilities (``node`` None: NaN -> 0), or a kernel's output
    ``[B, H, S, Dv]`` (``node`` given): NaN positions become ``0 @ V``
    (:func:`_zero_probs_out`), which stays NaN where V's column is not finite, as in the
    original (a NaN in V reaches every row through the product with 0)."""
    if node is None:
        zero = ctx.const(np.array(0, dtype=_np_dtype(y)), "attn_zero")
    else:
        zero = _zero_probs_out(ctx, node)
    return ctx.b.op("Where", ctx.b.op("IsNaN", y), zero, y)


def _masked_rows_zero(ctx: LowerContext, node: Node, y: Value, bias: Value) -> Value:
    """``y [B, H, S, Dv]`` of a kernel that gives 0 in a query row whose ``bias`` is -inf at every
    key, with ``0 @ V`` there (:func:`_zero_probs_out`): what ``nan_to_zero``'s original gives, NaN
    in a column of V that is not finite."""
    b = ctx.b
    none_kept = b.op("IsInf", _reduce(ctx, "ReduceMax", bias, [-1]), detect_positive=0)
    return b.op("Where", none_kept, _zero_probs_out(ctx, node), y)


def decomposed(ctx: LowerContext, node: Node) -> Optional[Value]:
    """The canonical op's math in standard ops of any opset >= 13: MatMul, Mul by the scale, mask
    Add / Where, Softmax(-1) (in float32 when ``softmax_precision``), MatMul with V. ``is_causal``
    without a mask becomes a Trilu lower triangle (opset >= 14); with a mask the mask already holds
    the causal part (the fusion sets the flag only then), so it is not applied twice. Exact for every
    mask kind, fully masked rows included (a boolean mask is ``Where(mask, scores, mask_fill)``)."""
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
    elif kind == "boolean":  # masked scores replaced by the fill (-inf, or the model's finite one)
        s = b.op("Where", mask, s, _fill_const(ctx, node, dtype))
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
        p = _nan_to_zero(ctx, p)  # on the probabilities, as the original
    ctx.form = f"{OP_TYPE}->decomposed"
    return b.op("MatMul", p, v)


def attention23(ctx: LowerContext, node: Node) -> Optional[Value]:
    """ONNX ``Attention`` (opset 23) with the 4-D inputs as they are (KV heads by shape): only for
    models whose default opset is already >= 23 (an opset cannot be raised for one node). The mask
    goes in as ``attn_mask`` rank 4 ``[B|1, H|1, S, T]`` (ONNX Runtime's kernel broadcasts over batch
    and heads only: :func:`_attention_bias`; a boolean mask as a 0 / fill bias); fully masked rows
    are made the original's: the mean of V for a finite fill (:func:`_fully_masked_rows`), NaN for
    -inf (:func:`_nan_rows`; the kernel gives 0) unless ``nan_to_zero``."""
    if ctx.opset < ATTENTION_OPSET:
        return None  # not a constraint of the kernel: the op does not exist at this opset
    why = _heads_mismatch(node)
    if why:
        return ctx.refuse(why)
    q, k, v = node.inputs[:3]
    scale, kind, causal, _, _, precision, nan_zero = _attrs(node)
    finite = _finite_fill(node)
    kept_bad = None
    if finite:
        k, kept_bad = _finite_fill_keys(ctx, node, k)
    # NOTE: a boolean mask goes in as a float bias too: the fully masked rows are then found the
    # same way for every mask kind (_nan_rows).
    mask, why = _attention_bias(ctx, node)
    if why:
        return ctx.refuse(why)
    ins = [q, k, v] + ([mask] if mask is not None else [])
    # NOTE: is_causal only without a mask: with one the flag is a hint, and a kernel's -inf causal
    # mask differs from a finite fill (finfo.min) in fully masked rows (uniform over all keys vs the
    # earlier ones).
    y = ctx.b.op("Attention", *ins, scale=scale, is_causal=causal if len(ins) == 3 else 0,
                 softmax_precision=1 if precision == 1 else None)
    if finite:
        y = _nan_where(ctx, kept_bad, _fully_masked_rows(ctx, node, y))
    elif mask is not None:
        y = _masked_rows_zero(ctx, node, y, mask) if nan_zero else _nan_rows(ctx, y, mask)
    ctx.form = f"{OP_TYPE}->Attention-23"
    return _nan_to_zero(ctx, y, node) if nan_zero else y


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


GQA_CPU_HEAD_SIZE_MULTIPLE = 8
"""ONNX Runtime 1.32's CPU GroupQueryAttention refuses other head sizes at run time ("head_size
must be a multiple of 8. Got head_size % 8 == 4", measured; the CPU kernel's vectorized loops)."""


def group_query_attention(ctx: LowerContext, node: Node) -> Optional[Value]:
    """``com.microsoft.GroupQueryAttention`` for causal grouped-query attention (ONNX Runtime
    ContribOperators.md; run here on ORT 1.32's CPU provider): 3-D ``query [B, S, H * D]``,
    ``key`` / ``value [B, S, Hkv * D]`` without repeating KV heads, no KV cache (``seqlens_k`` =
    S - 1 for every batch row, ``total_sequence_length`` = S), the mask as ``attention_bias``. The
    kernel is always causal, which the fusion's ``is_causal`` proves the mask holds; fully masked
    rows give 0 (measured), as ``nan_to_zero`` wants (without it they are set to NaN, as the
    original's softmax over all -inf gives: :func:`_nan_rows`).

    Checked before choosing it (the kernel's documented / measured constraints; the reason goes to
    the report): causal; float32 / float16 (:data:`KERNEL_DTYPES`); KV heads < Q heads, dividing
    them (ContribOperators.md: num_heads % kv_num_heads == 0); Q's, K's and V's head axes those
    counts; V's head size equals Q's; the head size static and a multiple of
    :data:`GQA_CPU_HEAD_SIZE_MULTIPLE`; K's sequence length not provably other than Q's (no past:
    total_sequence_length is S); the mask boolean with a -inf fill or ``Where(cond, 0, -inf)``
    (with a finite fill a fully masked row averages all keys, the kernel's causal -inf only the
    earlier ones), of known rank <= 4 (attention_bias ``[B|1, H|1, S, T]``)."""
    q, k, v = node.inputs[:3]
    scale, kind, causal, heads, kv_heads, _, nan_zero = _attrs(node)
    if not causal or kv_heads == heads:
        return None  # not what the kernel is for (always causal; grouped-query)
    if heads % kv_heads:
        return ctx.refuse(f"{heads} query heads are not a multiple of {kv_heads} KV heads")
    why = _kernel_dtype_reason(node) or _heads_mismatch(node)
    if why:
        return ctx.refuse(why)
    qd, kd, vd = dims(q), dims(k), dims(v)
    if kind == "additive" and not _minus_inf_filled(_mask(node)):
        return ctx.refuse("the additive mask is not Where(cond, 0, -inf): a fully masked row would "
                          "differ from the kernel's causal -inf")
    if _finite_fill(node):
        return ctx.refuse(f"the boolean mask fills {_fill(node):g}, not -inf: a fully masked row would "
                          "differ from the kernel's causal -inf")
    head_size = qd[3] if isinstance(qd[3], int) else None
    if head_size is None:
        return ctx.refuse("the head size is not static")
    if vd[3] != head_size:
        return ctx.refuse(f"V's head size {vd[3] if isinstance(vd[3], int) else '?'} differs from "
                          f"Q's {head_size}")
    if head_size % GQA_CPU_HEAD_SIZE_MULTIPLE:
        return ctx.refuse(f"head size {head_size} is not a multiple of {GQA_CPU_HEAD_SIZE_MULTIPLE} "
                          "(ONNX Runtime's CPU kernel refuses it)")
    # NOTE: refused only when provably different: the legacy exporter leaves both unnamed, and the
    # fusion's is_causal (a lower triangle over [S, T]) comes from self-attention masks.
    if not same_dim(qd[2], kd[2]) and not unnamed(qd[2]) and not unnamed(kd[2]):
        return ctx.refuse("K's sequence length differs from Q's (the kernel without a KV cache "
                          "takes total_sequence_length = S)")
    bias, why = _attention_bias(ctx, node)
    if why:
        return ctx.refuse(why)
    b = ctx.b
    q3, k3, v3 = (_to_bsd(ctx, x, h, head_size) for x, h in ((q, heads), (k, kv_heads), (v, kv_heads)))
    shape = b.op("Shape", q)
    seq = b.op("Slice", shape, _i64(ctx, [2], "attn_2"), _i64(ctx, [3], "attn_3"))
    batch = b.op("Slice", shape, _i64(ctx, [0], "attn_0"), _i64(ctx, [1], "attn_1"))
    total = b.op("Cast", b.op("Reshape", seq, _i64(ctx, [], "attn_scalar")), to=6)
    last = b.op("Cast", b.op("Sub", seq, _i64(ctx, [1], "attn_one")), to=6)
    seqlens = b.op("Expand", last, batch)
    ins = _without_trailing_none([q3, k3, v3, None, None, seqlens, total, None, None, None, bias])
    y, _, _ = b.op("GroupQueryAttention", *ins, domain=MS_DOMAIN, outputs=3, num_heads=heads,
                   kv_num_heads=kv_heads, scale=scale)
    ctx.form = f"{OP_TYPE}->com.microsoft::GroupQueryAttention"
    y = _from_bsd(ctx, y, heads)
    if not nan_zero:
        return _nan_rows(ctx, y, bias) if bias is not None else y
    if bias is not None:
        y = _masked_rows_zero(ctx, node, y, bias)
    return _nan_to_zero(ctx, y, node)


def multi_head_attention(ctx: LowerContext, node: Node) -> Optional[Value]:
    """``com.microsoft.MultiHeadAttention(query, key, value, bias=, key_padding_mask=,
    attention_bias)`` with 3-D ``[B, S, H * D]`` inputs (ONNX Runtime ContribOperators.md), KV heads
    repeated to H for grouped-query attention, the mask as a rank-4 ``attention_bias [B|1, H|1, S,
    T]`` (:func:`_attention_bias`; a boolean mask as a 0 / fill bias, a finite fill's fully masked
    rows fixed after the kernel: :func:`_fully_masked_rows`); the output goes back to ``[B, H, S,
    Dv]`` (Reshape + Transpose, which ONNX Runtime cancels against the model's own Transpose).

    Checked before choosing it (the reason goes to the report): float32 / float16 (the kernel's
    types: :data:`KERNEL_DTYPES`); Q/K/V rank 4 with the head counts
    the node says; V's head size equals Q's (this lowering's 3-D packing); the mask of known rank <= 4."""
    q, k, v = node.inputs[:3]
    scale, _, causal, heads, kv_heads, _, nan_zero = _attrs(node)
    why = _kernel_dtype_reason(node) or _heads_mismatch(node)
    if why:
        return ctx.refuse(why)
    qd, vd = dims(q), dims(v)
    if isinstance(vd[3], int) and isinstance(qd[3], int) and vd[3] != qd[3]:
        return ctx.refuse(f"V's head size {vd[3]} differs from Q's {qd[3]}")
    bias, why = _attention_bias(ctx, node)
    if why:
        return ctx.refuse(why)
    b = ctx.b
    head_size = qd[3] if isinstance(qd[3], int) else None
    n_rep = heads // kv_heads
    kept_bad = None
    if _finite_fill(node):
        k, kept_bad = _finite_fill_keys(ctx, node, k)
    k3 = _to_bsd(ctx, repeat_kv(ctx, k, n_rep, heads, head_size), heads, head_size)
    v3 = _to_bsd(ctx, repeat_kv(ctx, v, n_rep, heads, head_size), heads, head_size)
    q3 = _to_bsd(ctx, q, heads, head_size)
    ins = _without_trailing_none([q3, k3, v3, None, None, bias])
    # NOTE: unidirectional only without a mask: with one, the flag is a hint (the mask holds the
    # causal part), and ONNX Runtime 1.32's CPU MultiHeadAttention with both gave wrong values for
    # left-padded rows (measured on the GPT-2 and LLaMA exports).
    y = b.op("MultiHeadAttention", *ins, domain=MS_DOMAIN, num_heads=heads, scale=scale,
             unidirectional=1 if causal and bias is None else None)
    ctx.form = f"{OP_TYPE}->com.microsoft::MultiHeadAttention" + (" (kv repeated)" if n_rep > 1 else "")
    y = _from_bsd(ctx, y, heads)
    if kept_bad is not None:
        y = _nan_where(ctx, kept_bad, _fully_masked_rows(ctx, node, y))
    # NOTE: the CPU kernel gives NaN in a row a -inf bias masks entirely and where Q or K holds a
    # NaN, as the original's softmax does (measured), so only nan_to_zero needs a fix-up.
    return _nan_to_zero(ctx, y, node) if nan_zero else y


# NOTE: the first function that returns a value wins: Attention-23 only exists from opset 23;
# GroupQueryAttention takes causal grouped-query attention without repeating KV heads; MHA needs
# equal Q/V head sizes; decomposed always works (opset >= 13).
for _fn in (attention23, group_query_attention, multi_head_attention, decomposed):
    register_lowering("onnxruntime", OP_TYPE, _fn)
for _fn in (attention23, decomposed):
    register_lowering("standard", OP_TYPE, _fn)

__all__ = ["ATTENTION_OPSET", "attention23", "decomposed", "group_query_attention",
           "multi_head_attention", "repeat_kv"]
