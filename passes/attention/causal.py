"""Is an attention mask provably causal? Trilu, constant lower triangles and Range comparisons."""

from __future__ import annotations

from typing import Optional

import numpy as np

from passctl.ir import Value
from passctl.passes.attention.layout import dims, same_dim, shape_tokens
from passctl.passes.rewrite import constant_value

# Ops through which a factor of the mask stays a factor (a conjunction of conditions, an additive
# sum of masks, a broadcast or a cast of one).
_PASS_FIRST = {"Cast", "Expand", "Reshape", "Unsqueeze", "Identity"}
_MAX_DEPTH = 16


def mask_is_causal(mask: Optional[Value]) -> bool:
    """True when ``mask`` (bool: true keeps; or additive float) is a conjunction one of whose
    factors keeps exactly key j <= query i: ``Trilu(upper=0)`` of ones, a constant lower triangle,
    or ``LessOrEqual(kv_index, q_index)`` / ``GreaterOrEqual(q_index, kv_index)`` of indices from one
    ``Range`` laid out on the key (last) and query (second to last) axes. A causal part found this
    way lets a kernel skip the upper triangle; the mask still holds it, so the result is the same."""
    return _walk(mask, 0)


def _walk(v: Optional[Value], depth: int) -> bool:
    if v is None or depth > _MAX_DEPTH:
        return False
    arr = constant_value(v)
    if arr is not None:
        return _is_lower_triangle(arr)
    n = v.producer
    if n is None or n.domain not in ("", "ai.onnx"):
        return False
    op = n.op_type
    if op in ("And", "Add"):
        return any(_walk(i, depth + 1) for i in n.inputs)
    if op in _PASS_FIRST:
        return _walk(n.inputs[0], depth + 1)
    if op == "Where":
        # Where(cond, 0, fill): an additive mask made from a condition.
        keep = constant_value(n.inputs[1])
        fill = constant_value(n.inputs[2])
        if keep is not None and fill is not None and np.all(keep == 0) and np.all(fill < -1e4):
            return _walk(n.inputs[0], depth + 1)
        return False
    if op == "Trilu":
        k = constant_value(n.inputs[1]) if len(n.inputs) > 1 and n.inputs[1] is not None else 0
        ones = constant_value(n.inputs[0])
        src_ones = ones is not None and bool(np.all(ones != 0))
        if not src_ones and n.inputs[0].producer is not None and \
                n.inputs[0].producer.op_type == "ConstantOfShape":
            value = n.inputs[0].producer.attr("value")
            src_ones = value is None or bool(np.all(value.numpy() != 0))
        return n.attr("upper", 1) == 0 and int(np.asarray(k).reshape(-1)[0] if np.size(k) else 0) == 0 \
            and src_ones
    if op in ("LessOrEqual", "GreaterOrEqual"):
        a, b = n.inputs[0], n.inputs[1]
        kv, q = (a, b) if op == "LessOrEqual" else (b, a)
        return _axis_of(kv) == -1 and _axis_of(q) == -2 and _same_range(kv, q)
    return False


def _is_lower_triangle(arr: np.ndarray) -> bool:
    if arr.ndim < 2 or arr.shape[-1] != arr.shape[-2] or arr.shape[-1] < 2:
        return False
    if arr.dtype.kind == "f":
        keep = arr == 0  # an additive mask: 0 keeps, large negative drops
        if not np.all((arr == 0) | (arr < -1e4)):
            return False
    else:
        keep = arr != 0
    return bool(np.all(keep == np.tril(np.ones(arr.shape[-2:], dtype=bool))))


def _axis_of(v: Value) -> Optional[int]:
    """-1 when ``v`` varies only along the last axis, -2 when only along the one before: from its
    static shape, else by following the Unsqueeze chain from the Range (legacy exports)."""
    d = dims(v)
    if d is not None and len(d) >= 2 and all(isinstance(t, int) or t[0] == "sym" for t in d):
        varying = [i - len(d) for i, t in enumerate(d) if t != 1]
        return varying[0] if len(varying) == 1 else None
    return _unsqueezed_axis(v)


def _unsqueezed_axis(v: Value, depth: int = 0) -> Optional[int]:
    """The (negative) axis a Range's values lie on after a chain of Unsqueeze / Cast nodes."""
    n = v.producer
    if n is None or depth > 8:
        return None
    if n.op_type == "Range":
        return -1
    if n.op_type == "Cast":
        return _unsqueezed_axis(n.inputs[0], depth + 1)
    if n.op_type != "Unsqueeze":
        return None
    inner = _unsqueezed_axis(n.inputs[0], depth + 1)
    axes = constant_value(n.inputs[1]) if len(n.inputs) > 1 else n.attr("axes")
    if inner is None or axes is None:
        return None
    axes = [int(a) for a in np.asarray(axes).reshape(-1)]
    inner_rank = _unsqueezed_rank(n.inputs[0])
    if inner_rank is None:
        return None
    out_rank = inner_rank + len(axes)
    axes = sorted(a % out_rank for a in axes)
    pos = inner % inner_rank  # position among the input's axes
    kept = [i for i in range(out_rank) if i not in axes]
    return kept[pos] - out_rank


def _unsqueezed_rank(v: Value, depth: int = 0) -> Optional[int]:
    n = v.producer
    if n is None or depth > 8:
        return None
    if n.op_type == "Range":
        return 1
    if n.op_type == "Cast":
        return _unsqueezed_rank(n.inputs[0], depth + 1)
    if n.op_type == "Unsqueeze":
        axes = constant_value(n.inputs[1]) if len(n.inputs) > 1 else n.attr("axes")
        inner = _unsqueezed_rank(n.inputs[0], depth + 1)
        return None if inner is None or axes is None else inner + int(np.asarray(axes).size)
    return None


def _range_of(v: Value, depth: int = 0) -> Optional[Value]:
    """The Range output ``v`` is a reshaped / unsqueezed / cast copy of."""
    n = v.producer
    if n is None or depth > 8:
        return None
    if n.op_type == "Range":
        return v
    if n.op_type in ("Unsqueeze", "Reshape", "Cast", "Identity", "Expand"):
        return _range_of(n.inputs[0], depth + 1)
    return None


def _same_range(a: Value, b: Value) -> bool:
    ra, rb = _range_of(a), _range_of(b)
    if ra is None or rb is None:
        return False
    if ra is rb:
        return True
    na, nb = ra.producer, rb.producer
    sa, sb = constant_value(na.inputs[0]), constant_value(nb.inputs[0])
    da, db = constant_value(na.inputs[2]), constant_value(nb.inputs[2])
    if sa is None or sb is None or da is None or db is None:
        return False
    if int(sa) != 0 or int(sb) != 0 or int(da) != 1 or int(db) != 1:
        return False
    la, lb = na.inputs[1], nb.inputs[1]
    if la is lb:
        return True
    ca, cb = constant_value(la), constant_value(lb)
    if ca is not None and cb is not None:
        return int(ca) == int(cb)
    # Limits computed from shapes (Cast(Gather(Shape(x), i))): the same named or static size.
    ta, tb = shape_tokens(la), shape_tokens(lb)
    if ta is not None and tb is not None and len(ta) == 1 and len(tb) == 1:
        named = isinstance(ta[0], int) or ta[0][0] == "sym"
        if named and same_dim(ta[0], tb[0]):
            return True
    # Same static or same named length (an unnamed dim proves nothing).
    ta, tb = dims(ra), dims(rb)
    if ta is None or tb is None or len(ta) != 1 or len(tb) != 1:
        return False
    named = isinstance(ta[0], int) or ta[0][0] == "sym"
    return named and same_dim(ta[0], tb[0])


__all__ = ["mask_is_causal"]
