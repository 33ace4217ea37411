"""Axis roles of attention operands (batch, heads, sequence, head size) traced back to the head split."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

import numpy as np

from passctl.ir import Node, Value
from passctl.passes.rewrite import constant_value

Token = Union[int, Tuple]
"""A dimension: an int, ``("sym", name)`` for a named symbolic dim, or ``("dim", id, axis)`` for an
unnamed dim of a value (equal tokens are equal sizes)."""

BHSD = ("B", "H", "S", "D")
"""The canonical attention layout: batch, heads, sequence, head size (ONNX Attention-23's 4-D form)."""

_ELEMENTWISE = {"Mul", "Add", "Sub", "Div", "Neg", "Cast", "Identity", "Concat", "Slice", "Sqrt"}
_MAX_DEPTH = 40


def rank(v: Optional[Value]) -> Optional[int]:
    """The static rank of ``v`` (None when unknown)."""
    return None if v is None or v.shape is None else v.shape.rank


def dim_token(v: Value, axis: int) -> Token:
    """The token of ``v``'s dimension ``axis`` (a static int, a named symbol, or ``v``'s own dim)."""
    d = v.shape[axis] if v.shape is not None and v.shape.rank is not None else None
    if isinstance(d, int):
        return d
    if isinstance(d, str) and d:
        return ("sym", d)
    return ("dim", id(v), axis)


def dims(v: Value) -> Optional[List[Token]]:
    """Tokens of every dimension of ``v`` (None when its rank is unknown)."""
    r = rank(v)
    return None if r is None else [dim_token(v, i) for i in range(r)]


def same_dim(a: Token, b: Token) -> bool:
    """Whether two tokens are provably the same size."""
    return a == b


def unnamed(t: Token) -> bool:
    """Whether ``t`` is a value's own unnamed dim (``("dim", id, axis)``), which compares equal only
    to itself and so proves nothing about sizes."""
    return isinstance(t, tuple) and t[0] == "dim"


def _maybe_same(a: Token, b: Token) -> bool:
    """Equal, or not provably different (one side an unnamed dim): a head-split Reshape keeps the
    leading dims in order, and only their sizes could tell a swap apart."""
    return same_dim(a, b) or unnamed(a) or unnamed(b) or a == 0


def shape_tokens(v: Optional[Value], depth: int = 0) -> Optional[List[Token]]:
    """Evaluate a 1-D int64 shape tensor symbolically: constants, ``Shape(x)`` (start/end), Concat,
    Slice / Gather with constant indices, Unsqueeze / Squeeze / Cast of those. None when unknown."""
    if v is None or depth > 12:
        return None
    arr = constant_value(v)
    if arr is not None:
        return [int(x) for x in np.asarray(arr).reshape(-1)]
    n = v.producer
    if n is None or n.domain not in ("", "ai.onnx"):
        return None
    op = n.op_type
    if op == "Shape":
        d = dims(n.inputs[0])
        if d is None:
            return None
        start, end = n.attr("start", 0), n.attr("end", None)
        return d[start:end] if end is not None else d[start:]
    if op == "Concat":
        out: List[Token] = []
        for i in n.inputs:
            part = shape_tokens(i, depth + 1)
            if part is None:
                return None
            out.extend(part)
        return out
    if op in ("Cast", "Unsqueeze", "Squeeze", "Identity"):
        return shape_tokens(n.inputs[0], depth + 1)
    if op == "Mul":
        a, b = shape_tokens(n.inputs[0], depth + 1), shape_tokens(n.inputs[1], depth + 1)
        if a is None or b is None or len(a) != 1 or len(b) != 1:
            return None
        if isinstance(a[0], int) and isinstance(b[0], int):
            return [a[0] * b[0]]
        if isinstance(b[0], int):
            return [("mul", a[0], b[0])]
        return [("mul", b[0], a[0])] if isinstance(a[0], int) else None
    if op == "Gather":
        data, idx = shape_tokens(n.inputs[0], depth + 1), constant_value(n.inputs[1])
        if data is None or idx is None or n.attr("axis", 0) != 0:
            return None
        return [data[int(i)] for i in np.asarray(idx).reshape(-1)]
    if op == "Slice":
        data = shape_tokens(n.inputs[0], depth + 1)
        starts, ends = constant_value(n.inputs[1]), constant_value(n.inputs[2])
        axes = constant_value(n.inputs[3]) if len(n.inputs) > 3 and n.inputs[3] is not None else None
        steps = constant_value(n.inputs[4]) if len(n.inputs) > 4 and n.inputs[4] is not None else None
        if data is None or starts is None or ends is None or starts.size != 1:
            return None
        if (axes is not None and int(axes.reshape(-1)[0]) != 0) or (
                steps is not None and int(steps.reshape(-1)[0]) != 1):
            return None
        s, e = int(starts.reshape(-1)[0]), int(ends.reshape(-1)[0])
        length = len(data)
        s, e = max(-length, min(s, length)), max(-length, min(e, length))
        return data[s:e]
    return None


def reshape_target(node: Node) -> Optional[List[Token]]:
    """The output dims of a Reshape as tokens: its shape input evaluated, ``0`` copied from the input
    (when ``allowzero`` is 0); ``-1`` stays -1."""
    target = shape_tokens(node.inputs[1])
    if target is None:
        return None
    src = dims(node.inputs[0])
    out = []
    for i, t in enumerate(target):
        if t == 0 and not node.attr("allowzero", 0):
            if src is None or i >= len(src):
                return None
            t = src[i]
        out.append(t)
    return out


def head_split_roles(node: Node) -> Optional[Tuple[str, ...]]:
    """Roles of a Reshape that splits the hidden axis of ``[B, S, hidden]`` into heads: ``[B, S, H,
    D]`` (or ``[B, S, P, H, D]`` for a packed QKV projection), checked with static sizes."""
    x = node.inputs[0]
    out_rank = rank(node.outputs[0])
    src, target = dims(x), reshape_target(node)
    if src is None or target is None or len(src) != 3 or len(target) not in (4, 5):
        return None
    if not (_maybe_same(target[0], src[0]) and _maybe_same(target[1], src[1])):
        return None
    hidden, tail = src[2], target[2:]
    if not isinstance(hidden, int) or not all(isinstance(t, int) for t in tail[1:]):
        return None
    known = int(np.prod([t for t in tail if t != -1]))
    if tail.count(-1) > 1 or (tail.count(-1) == 0 and known != hidden) or hidden % known:
        return None
    if out_rank is not None and out_rank != len(target):
        return None
    return ("B", "S", "H", "D") if len(target) == 4 else ("B", "S", "P", "H", "D")


def split_heads(node: Node) -> Optional[int]:
    """The static head count of a head-splitting Reshape (``-1`` resolved from the hidden size)."""
    if head_split_roles(node) is None:
        return None
    hidden, tail = dims(node.inputs[0])[2], reshape_target(node)[2:]
    heads = tail[-2]
    if heads == -1:
        known = int(np.prod([t for t in tail if t != -1]))
        heads = hidden // known
    return heads if isinstance(heads, int) else None


def gqa_source(v: Value) -> Optional[Tuple[Value, int]]:
    """``(kv, n_rep)`` when ``v`` is ``Reshape(Expand(Unsqueeze(kv, [2]), [B, Hkv, n_rep, T, D]),
    [B, Hkv * n_rep, T, D])`` (transformers' ``repeat_kv``), else None."""
    n = v.producer
    if n is None or n.op_type != "Reshape":
        return None
    e = n.inputs[0].producer
    if e is None or e.op_type != "Expand":
        return None
    u = e.inputs[0].producer
    if u is None or u.op_type != "Unsqueeze":
        return None
    axes = constant_value(u.inputs[1]) if len(u.inputs) > 1 else np.asarray(u.attr("axes", ()))
    kv = u.inputs[0]
    kv_dims, ex, target = dims(kv), shape_tokens(e.inputs[1]), reshape_target(n)
    if axes is None or [int(a) for a in np.asarray(axes).reshape(-1)] != [2] or kv_dims is None:
        return None
    if len(kv_dims) != 4 or target is None or len(target) != 4:
        return None
    if ex is None:
        if target[3] == -1:
            return None
        # NOTE: the legacy exporter writes Expand's shape through Where(Equal(shape, -1), 1, shape);
        # the Reshape target [B, Hkv * n_rep, T, D] then gives n_rep. Expand only grows size-1 axes and
        # the target keeps B, T, D, so the growth by n_rep is the unsqueezed axis.
        t1 = target[1]
        if isinstance(t1, tuple) and t1[0] == "mul" and same_dim(t1[1], kv_dims[1]):
            rep = t1[2]
        elif isinstance(t1, int) and isinstance(kv_dims[1], int) and t1 % kv_dims[1] == 0:
            rep = t1 // kv_dims[1]
        else:
            return None
        if not (_maybe_same(target[0], kv_dims[0]) and _maybe_same(target[2], kv_dims[2])
                and same_dim(target[3], kv_dims[3])):
            return None
        return (kv, rep) if rep >= 1 else None
    if len(ex) != 5:
        return None
    rep = ex[2]
    if not isinstance(rep, int) or rep < 1:
        return None
    for a, b in ((ex[0], kv_dims[0]), (ex[1], kv_dims[1]), (ex[3], kv_dims[2]), (ex[4], kv_dims[3])):
        if not (same_dim(a, b) or a == 1):
            return None
    heads = kv_dims[1] * rep if isinstance(kv_dims[1], int) else None
    # NOTE: the last two axes are kept in either layout ([B, Hkv, T, D], or K^T's [B, Hkv, D, T]
    # repeated after the transpose: Reshape [0, H, D, -1]), one of them possibly written -1.
    if target.count(-1) > 1 or not (same_dim(target[0], kv_dims[0]) and target[1] in (heads, -1)
                                    and (same_dim(target[2], kv_dims[2]) or target[2] == -1)
                                    and (same_dim(target[3], kv_dims[3]) or target[3] == -1)):
        return None
    return kv, rep


def transposed_chain_source(v: Value) -> Optional[Value]:
    """``k`` when ``v`` is the dynamo exporter's ``k.transpose(-2, -1)`` for a batched MatMul:
    ``Reshape(Transpose(Reshape(k, [-1, T, D]), [0, 2, 1]), [*k.shape[:-2], D, T])``."""
    n = v.producer
    if n is None or n.op_type != "Reshape":
        return None
    t = n.inputs[0].producer
    if t is None or t.op_type != "Transpose" or tuple(t.attr("perm", ())) != (0, 2, 1):
        return None
    r = t.inputs[0].producer
    if r is None or r.op_type != "Reshape":
        return None
    k = r.inputs[0]
    kd, flat, out = dims(k), reshape_target(r), reshape_target(n)
    if kd is None or flat is None or out is None or len(flat) != 3 or len(out) != len(kd):
        return None
    if not (same_dim(flat[1], kd[-2]) and same_dim(flat[2], kd[-1])):
        return None
    want = kd[:-2] + [kd[-1], kd[-2]]
    if not all(same_dim(a, b) for a, b in zip(out, want)):
        return None
    return k


def roles(v: Optional[Value], memo: Optional[Dict[int, Optional[Tuple[str, ...]]]] = None,
          depth: int = 0) -> Optional[Tuple[str, ...]]:
    """The role of each axis of ``v`` (``B``, ``S``, ``H``, ``D``, ``P`` for the packed-QKV axis),
    traced back to the Reshape that split the hidden axis into heads, through Transposes, the K^T
    reshape chain, ``repeat_kv``, packed-QKV Gather / Split + Squeeze, and elementwise ops such as
    rotary embedding. None when the origin cannot be traced (callers then check shapes only)."""
    if v is None or depth > _MAX_DEPTH:
        return None
    memo = {} if memo is None else memo
    if id(v) in memo:
        return memo[id(v)]
    memo[id(v)] = None
    result = _roles(v, memo, depth)
    if result is not None and rank(v) is not None and len(result) != rank(v):
        result = None
    memo[id(v)] = result
    return result


def heads(v: Optional[Value], depth: int = 0) -> Optional[int]:
    """The static size of ``v``'s head axis, from its shape or traced back (as :func:`roles`) to the
    Reshape that split heads (exports often leave that dim unknown: ``Reshape(x, [B, S, -1, D])``)."""
    r = roles(v)
    if r is None or "H" not in r:
        return None
    d = dims(v)[r.index("H")]
    if isinstance(d, int):
        return d
    if depth > _MAX_DEPTH:
        return None
    n = v.producer
    if n.op_type == "Reshape":
        h = split_heads(n)
        if h is not None:
            return h
        src = gqa_source(v)
        if src is not None:
            kv = heads(src[0], depth + 1)
            return None if kv is None else kv * src[1]
        return heads(transposed_chain_source(v), depth + 1)
    for i in n.inputs:
        if i is not None and constant_value(i) is None and roles(i) is not None:
            h = heads(i, depth + 1)
            if h is not None:
                return h
    return None


def _roles(v: Value, memo, depth: int) -> Optional[Tuple[str, ...]]:
    n = v.producer
    if n is None or n.domain not in ("", "ai.onnx"):
        return None
    op = n.op_type
    if op == "Reshape":
        split = head_split_roles(n)
        if split is not None:
            return split
        src = gqa_source(v)
        if src is not None:
            return roles(src[0], memo, depth + 1)
        k = transposed_chain_source(v)
        if k is not None:
            r = roles(k, memo, depth + 1)
            return None if r is None else r[:-2] + (r[-1], r[-2])
        return None
    if op == "Transpose":
        r = roles(n.inputs[0], memo, depth + 1)
        perm = n.attr("perm")
        if r is None:
            return None
        perm = tuple(perm) if perm is not None else tuple(reversed(range(len(r))))
        return tuple(r[p] for p in perm)
    if op in ("Gather", "Squeeze"):
        r = roles(n.inputs[0], memo, depth + 1)
        if r is None:
            return None
        if op == "Gather":
            idx = constant_value(n.inputs[1])
            if idx is None or idx.ndim != 0:
                return None
            axes = [n.attr("axis", 0)]
        else:
            a = constant_value(n.inputs[1]) if len(n.inputs) > 1 else n.attr("axes")
            if a is None:
                return None
            axes = [int(x) for x in np.asarray(a).reshape(-1)]
        axes = [a % len(r) for a in axes]
        if any(r[a] != "P" for a in axes):
            return None
        return tuple(x for i, x in enumerate(r) if i not in axes)
    if op == "Split":
        return roles(n.inputs[0], memo, depth + 1)
    if op in _ELEMENTWISE:
        out_rank = rank(v)
        for i in n.inputs:
            if i is not None and (out_rank is None or rank(i) == out_rank) and constant_value(i) is None:
                r = roles(i, memo, depth + 1)
                if r is not None:
                    return r
    return None


@dataclass
class Operand:
    """An attention operand in canonical BHSD form: ``Transpose(value, perm)`` (no Transpose when
    ``perm`` is None), whose heads are repeated ``n_rep`` times (grouped-query / multi-query)."""

    value: Value
    perm: Optional[Tuple[int, ...]] = None
    n_rep: int = 1
    how: str = ""

    def shape_dims(self) -> Optional[List[Token]]:
        """Tokens of the BHSD operand before head repetition."""
        d = dims(self.value)
        if d is None or len(d) != 4:
            return None
        return d if self.perm is None else [d[p] for p in self.perm]

    def heads(self) -> Optional[int]:
        """Static head count of the operand before repetition (shape, else traced)."""
        d = self.shape_dims()
        if d is not None and isinstance(d[1], int):
            return d[1]
        return heads(self.value)

    def roles(self) -> Optional[Tuple[str, ...]]:
        r = roles(self.value)
        if r is None or self.perm is None:
            return r
        return tuple(r[p] for p in self.perm)


def key_operand(kt: Value, depth: int = 0) -> Operand:
    """K in BHSD from the value multiplied as ``K^T`` (``[B, H, D, T]``): look through a Transpose
    (any permutation, composed with the last-two swap), the dynamo transpose chain, and ``repeat_kv``
    (of K, or of K^T after the transpose)."""
    n = kt.producer
    if n is not None and n.op_type == "Transpose" and rank(kt) == 4:
        perm = tuple(n.attr("perm") or (3, 2, 1, 0))
        kperm = (perm[0], perm[1], perm[3], perm[2])
        src = n.inputs[0]
        if kperm == (0, 1, 2, 3):
            return _with_gqa(Operand(src, None, 1, f"K^T = Transpose{perm} of K"))
        return Operand(src, kperm, 1, f"K^T = Transpose{perm}; K = Transpose{kperm}")
    k = transposed_chain_source(kt)
    if k is not None:
        return _with_gqa(Operand(k, None, 1, "K^T = Reshape-Transpose-Reshape chain"))
    src = gqa_source(kt) if depth < 4 else None
    if src is not None:  # K transposed first, then repeated: repeat_kv(K^T) = repeat_kv(K)^T
        inner = key_operand(src[0], depth + 1)
        return Operand(inner.value, inner.perm, inner.n_rep * src[1],
                       f"{inner.how}, repeat_kv x{src[1]} of K^T")
    return Operand(kt, (0, 1, 3, 2), 1, "K^T given; K = Transpose(0, 1, 3, 2)")


def value_operand(v: Value) -> Operand:
    """V in BHSD, looking through ``repeat_kv``."""
    return _with_gqa(Operand(v, None, 1, "V"))


def _with_gqa(op: Operand) -> Operand:
    src = gqa_source(op.value) if op.perm is None else None
    if src is None:
        return op
    return Operand(src[0], None, src[1], op.how + f", repeat_kv x{src[1]}")


__all__ = ["BHSD", "Operand", "Token", "dim_token", "dims", "gqa_source", "head_split_roles", "heads",
           "key_operand", "rank", "reshape_target", "roles", "same_dim", "shape_tokens",
           "transposed_chain_source", "unnamed", "value_operand"]
