"""The one guard every attention pattern shares: scale, mask broadcast, softmax axis, layouts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

from passctl.ir import Node, Value
from passctl.passes.attention.causal import mask_is_causal
from passctl.passes.attention.layout import (BHSD, Operand, dims, key_operand, rank, same_dim,
                                             unnamed, value_operand)
from passctl.passes.rewrite import MatchResult, constant_value

SCALE_RTOL = 1e-3
"""Relative tolerance of the scale check (fp16 exports round 1/sqrt(d) to 11 bits)."""

MASK_FILL_MAX = -1e4
"""A Where mask's fill value must be at most this (-inf, or a large negative like finfo.min)."""


@dataclass
class Candidate:
    """What a pattern matched, for the guard.

    Attributes:
        q, kt, v: the values multiplied as Q, K^T and (by the probabilities) V.
        scale_factors: ``(constant value, "mul" | "div")`` pairs applied to Q, K^T or the scores.
        softmax: the Softmax node.
        mask: the additive mask (``mask_form == "add"``) or the Where condition (``"where"``).
        fill: the Where's fill value (scores where the condition is false).
        softmax_cast: the scores are cast to float32 around Softmax.
        nan_to_zero: the probabilities pass through ``Where(IsNaN(p), 0, p)``.
        out: the value the attention replaces (``[B, H, S, Dv]``).
    """

    q: Value
    kt: Value
    v: Value
    scale_factors: List[Tuple[Value, str]]
    softmax: Node
    out: Value
    mask: Optional[Value] = None
    mask_form: str = "none"
    fill: Optional[Value] = None
    softmax_cast: bool = False
    nan_to_zero: bool = False


@dataclass
class Plan:
    """The canonical op the rewrite builds (see :mod:`passctl.dialect.attention`)."""

    q: Operand
    k: Operand
    v: Operand
    scale: float
    num_heads: int
    kv_num_heads: int
    head_size: int
    mask_kind: str = "none"
    mask: Optional[Value] = None
    fill: float = -math.inf
    is_causal: bool = False
    softmax_precision: int = 0
    nan_to_zero: bool = False


def _fail(reason: str, node: Optional[Node] = None) -> Tuple[None, MatchResult]:
    return None, MatchResult().fail(reason, node)


def _scale(c: Candidate) -> Tuple[Optional[float], str]:
    total = 1.0
    for value, kind in c.scale_factors:
        arr = constant_value(value)
        if arr is None:
            return None, f"scale '{value.name}' is not a constant"
        if arr.size != 1 or arr.dtype.kind != "f":
            return None, f"scale '{value.name}' is not a float scalar (shape {list(arr.shape)})"
        x = float(arr.reshape(-1)[0])
        if x == 0.0 or not math.isfinite(x):
            return None, f"scale '{value.name}' is {x}"
        total = total * x if kind == "mul" else total / x
    return total, ""


_LINEAR_MOVES = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Expand", "Identity", "Gather", "Split"}
"""Ops that move or copy elements (data input 0): a scalar factor before them is a factor after."""


def _upstream_scale(v: Value) -> Tuple[float, List[str]]:
    """The product of the scalar constant factors (``Mul(x, s)``, ``Div(x, s)``) applied to ``v``
    before it was moved into shape (head split Reshape / Transpose, repeat_kv, packed-QKV Gather /
    Split): ``Q = Transpose(Reshape(Mul(q_proj, s)))`` has its scale before the head split (BART's,
    Whisper's ``q_proj(x) * scaling``). Returns ``(factor, names of the constants)``; ``(1, [])``
    when there is none. The factors stay in the graph (the attention reads the scaled value)."""
    total, names = 1.0, []
    for _ in range(12):
        n = v.producer
        if n is None or n.domain not in ("", "ai.onnx"):
            break
        if n.op_type in _LINEAR_MOVES:
            v = n.inputs[0]
            continue
        if n.op_type in ("Mul", "Div") and len(n.inputs) == 2:
            consts = [constant_value(x) for x in n.inputs]
            idx = 1 if consts[1] is not None else (
                0 if consts[0] is not None and n.op_type == "Mul" else None)
            if idx is None or consts[1 - idx] is not None:
                break
            arr = consts[idx]
            if arr.size != 1 or arr.dtype.kind != "f":
                break
            x = float(arr.reshape(-1)[0])
            if x == 0.0 or not math.isfinite(x):
                break
            total = total * x if n.op_type == "Mul" else total / x
            names.append(n.inputs[idx].name)
            v = n.inputs[1 - idx]
            continue
        break
    return total, names


def _softmax_axis_ok(sm: Node, opset: int) -> Tuple[bool, str]:
    r = rank(sm.inputs[0])
    axis = sm.attr("axis", -1 if opset >= 13 else 1)
    if r is None:
        return False, "the rank of Softmax's input is unknown (run infer-shapes first)"
    if axis % r != r - 1:
        return False, (f"Softmax normalizes axis {axis} of a rank-{r} tensor, not the last (key) axis: "
                       "not attention's row softmax")
    return True, ""


def _check_layout(name: str, op: Operand) -> str:
    r = op.roles()
    if r is not None and r != BHSD:
        return (f"{name} has layout ({', '.join(r)}) traced from the head split ({op.how}); "
                f"attention needs ({', '.join(BHSD)})")
    d = op.shape_dims()
    if d is None:
        return f"{name} ('{op.value.name}') is not a rank-4 tensor of known rank"
    return ""


def check(c: Candidate, opset: int, any_scale: bool = False) -> Tuple[Optional[Plan], MatchResult]:
    """Check that the matched subgraph computes scaled dot-product attention exactly.

    Rules: (1) Softmax normalizes the last axis; (2) Q, K, V are rank 4 and, where their origin is
    traceable to the Reshape that split heads, have roles (B, H, S, D) (K after undoing the K^T
    transpose); (3) Q's and K's head sizes agree, Q heads H and KV heads Hkv are static with
    H % Hkv == 0, K's and V's sequence axes agree; (4) the scale constants multiply to
    1/sqrt(head size) within :data:`SCALE_RTOL`, counting scalar factors applied to Q or K before
    the head split (``any_scale`` accepts any scalar); (5) an additive
    mask broadcasts to the scores without enlarging them, a Where mask fills at most
    :data:`MASK_FILL_MAX`.

    Returns:
        ``(Plan, ok)`` or ``(None, MatchResult().fail(reason, node))``.
    """
    ok, why = _softmax_axis_ok(c.softmax, opset)
    if not ok:
        return _fail(why, c.softmax)
    if rank(c.q) != 4 or rank(c.kt) != 4 or rank(c.v) != 4:
        return _fail(f"Q, K^T, V ranks are {rank(c.q)}, {rank(c.kt)}, {rank(c.v)}; the canonical "
                     "attention takes rank-4 [B, H, S, D] operands", c.softmax)
    q, k, v = Operand(c.q, None, 1, "Q"), key_operand(c.kt), value_operand(c.v)
    if k.n_rep != v.n_rep:
        # NOTE: K and V must be taken at the same level: K's repeat_kv followed and V's not (or the
        # reverse) once gave K 4 heads, V 2 and kv_num_heads 4 (issue 15, case 12). Both are then
        # taken as multiplied (already repeated, kv_num_heads = num_heads): exact, KV read H times.
        k = Operand(c.kt, (0, 1, 3, 2), 1, f"K^T as multiplied (V repeat_kv x{v.n_rep}, K x{k.n_rep})")
        v = Operand(c.v, None, 1, "V as multiplied")
    for name, op in (("Q", q), ("K", k), ("V", v)):
        why = _check_layout(name, op)
        if why:
            return _fail(why, c.softmax)
    qd, kd, vd = q.shape_dims(), k.shape_dims(), v.shape_dims()
    heads, head_size = q.heads(), qd[3]
    if not isinstance(heads, int) or not isinstance(head_size, int):
        return _fail(f"Q's heads / head size {_fmt([qd[1]])} / {_fmt([qd[3]])} are not static (run "
                     "infer-shapes; fix the input shapes)", c.softmax)
    kh, vh = k.heads(), v.heads()
    if kh is None or vh is None or kh != vh or k.n_rep != v.n_rep:
        return _fail(f"K and V head counts differ or are not static (K {kh} x{k.n_rep}, V {vh} "
                     f"x{v.n_rep})", c.softmax)
    kv_heads, kv_num_heads = kh * k.n_rep, kh
    if kv_heads not in (heads, 1):
        return _fail(f"Q has {heads} heads but K/V repeat to {kv_heads}", c.softmax)
    if heads % kv_num_heads:
        return _fail(f"{heads} query heads are not a multiple of {kv_num_heads} KV heads", c.softmax)
    if _differ(kd[3], head_size):
        return _fail(f"K's head size {kd[3]} differs from Q's {head_size}", c.softmax)
    if _differ(kd[2], vd[2]):
        return _fail(f"K's sequence axis {kd[2]} differs from V's {vd[2]}", c.softmax)
    scale, why = _scale(c)
    if scale is None:
        return _fail(why, c.softmax)
    want = 1.0 / math.sqrt(head_size)
    # NOTE: Q (and K) may be scaled before the head split: Q.K^T is then already scaled by those
    # factors, which the plan's scale (the factors inside the pattern) does not repeat.
    q_pre, q_names = _upstream_scale(c.q)
    k_pre, k_names = _upstream_scale(c.kt)
    effective = scale * q_pre * k_pre
    if not any_scale and abs(effective - want) > SCALE_RTOL * want:
        before = (f" ({scale:.6g} in the pattern times {q_pre * k_pre:.6g} applied to Q/K before the "
                  f"head split: {', '.join(q_names + k_names)})") if q_names or k_names else ""
        return _fail(f"scale {effective:.6g}{before} is not 1/sqrt(head size {head_size}) = {want:.6g} "
                     "(a wrong head size or layout, or a model-specific scale: run with "
                     "any_scale=true to accept it)", c.softmax)
    plan = Plan(q, k, v, scale, heads, kv_num_heads, head_size,
                softmax_precision=1 if c.softmax_cast else 0, nan_to_zero=c.nan_to_zero)
    scores = [[qd[0], heads, qd[2], kd[2]], dims(c.softmax.inputs[0]) or []]
    if c.mask_form == "add":
        why = _mask_broadcast(c.mask, scores, c.softmax)
        if why:
            return _fail(why, c.softmax)
        plan.mask_kind, plan.mask = "additive", c.mask
    elif c.mask_form == "where":
        fill = constant_value(c.fill)
        if fill is None or fill.size != 1 or not float(fill.reshape(-1)[0]) <= MASK_FILL_MAX:
            return _fail(f"Where's fill '{c.fill.name}' is not a constant <= {MASK_FILL_MAX} "
                         "(not a mask)", c.softmax)
        if c.mask.dtype is not None and c.mask.dtype.name != "BOOL":
            return _fail(f"Where's condition '{c.mask.name}' is not bool", c.softmax)
        why = _mask_broadcast(c.mask, scores, c.softmax)
        if why:
            return _fail(why, c.softmax)
        plan.fill = float(fill.reshape(-1)[0])
        plan.mask_kind, plan.mask = "boolean", c.mask
    if plan.mask is not None:
        plan.is_causal = mask_is_causal(plan.mask)
    return plan, MatchResult()


def _mask_broadcast(mask: Value, scores: List[list], softmax: Node) -> str:
    """``scores`` holds two token lists for the scores [B, H, S, T] (from Q/K, and the Softmax
    input's own dims); each mask dim must be 1 or provably equal to one of them."""
    md = dims(mask)
    if md is None:
        return f"the rank of mask '{mask.name}' is unknown (run infer-shapes first)"
    if len(md) > 4:
        return f"mask '{mask.name}' has rank {len(md)} > 4: it would enlarge the scores"
    for i in range(1, len(md) + 1):
        m = md[-i]
        alternatives = [s[-i] for s in scores if len(s) >= i]
        if m == 1 or any(same_dim(m, s) for s in alternatives):
            continue
        if unnamed(m) or any(unnamed(s) for s in alternatives):
            # NOTE: an unnamed dim (the legacy exporter's shapes) cannot be compared; the mask is then
            # accepted when every comparable dim agrees, as MatMul/Add would fail at run time on a
            # size mismatch other than a size-1 broadcast of the scores themselves.
            continue
        return (f"mask '{mask.name}' dims {_fmt(md)} do not provably broadcast to the scores "
                f"{_fmt(scores[0])} (mask dim {_fmt([m])} vs {_fmt(alternatives[:1])})")
    return ""


def _differ(a, b) -> bool:
    """Provably different sizes (both static or named, and not equal)."""
    return not same_dim(a, b) and not unnamed(a) and not unnamed(b)


def _fmt(tokens) -> str:
    return "[" + ", ".join(str(t) if isinstance(t, int) else (t[1] if t[0] == "sym" else "?")
                           for t in tokens) + "]"


__all__ = ["Candidate", "MASK_FILL_MAX", "Plan", "SCALE_RTOL", "check"]
