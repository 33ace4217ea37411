"""fuse-reshape-chains: Reshape->Reshape, Transpose->Transpose and Squeeze/Unsqueeze pairs collapsed."""

from __future__ import annotations

import logging
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from passctl.ir import Model, Value
from passctl.passes.base import PassResult
from passctl.passes.registry import register_pass
from passctl.passes.rewrite import AttrVar, MatchResult, Or, RewriteRule, RuleContext, RuleSet, register_rule

logger = logging.getLogger(__name__)


def _rank(v: Optional[Value]) -> Optional[int]:
    return None if v is None or v.shape is None else v.shape.rank


def collapsed_shape(s1: Optional[np.ndarray], allowzero1: int, s2: np.ndarray, allowzero2: int,
                    mid_dims: Optional[Sequence]) -> Union[Tuple[List[int], int], str]:
    """The target shape (and allowzero) of one Reshape equal to ``Reshape(Reshape(x, s1), s2)``.

    Reshape keeps the row-major element order (ONNX Reshape-14 spec), so the pair equals one Reshape
    of ``x`` to the second output shape; only the second shape's entries need translating. ``-1``
    stays (the element count is x's). A ``0`` with ``allowzero2 = 0`` copies dim i of the
    intermediate tensor, which is: x's own dim i when ``s1[i] == 0`` with ``allowzero1 = 0`` (a ``0``
    again, so a dynamic dim stays dynamic), else ``s1[i]`` when positive, else its static dim.

    Args:
        s1: the first Reshape's constant shape (int64 [r1]), or None when not constant.
        allowzero1, allowzero2: the two Reshapes' ``allowzero`` attributes (0 or 1).
        s2: the second Reshape's constant shape (int64 [r2]).
        mid_dims: the intermediate tensor's dims (ints, names or None), or None when unknown.

    Returns:
        ``(shape, allowzero)`` for the single Reshape, or a reason string when it cannot be expressed.
    """
    s2 = [int(d) for d in s2.reshape(-1)]
    if allowzero2 == 1 or 0 not in s2:
        return s2, int(allowzero2 == 1 and 0 in s2)
    out = []
    for i, d in enumerate(s2):
        if d != 0:
            out.append(d)
            continue
        static = mid_dims[i] if mid_dims is not None and i < len(mid_dims) else None
        first = int(s1.reshape(-1)[i]) if s1 is not None and i < s1.size else None
        if first == 0 and allowzero1 == 0:
            out.append(0)  # copies x's dim i, the same dim the intermediate copied (stays dynamic)
        elif first is not None and first > 0:
            out.append(first)
        elif isinstance(static, int) and static > 0:
            out.append(static)
        elif isinstance(static, int) or (s1 is not None and i < s1.size and int(s1.reshape(-1)[i]) == 0):
            return (f"dim {i} is an empty (size 0) dim copied by the second Reshape (allowzero=0); one "
                    "Reshape cannot mix copied and literal zeros (allowzero differences)")
        else:
            return (f"dim {i} of the second Reshape copies the intermediate dim (0 with allowzero=0), which "
                    "is neither static nor a positive constant of the first Reshape; the collapsed Reshape "
                    "could not say which size it is")
    return out, 0


@register_rule
class ReshapeReshape(RewriteRule):
    """Reshape(Reshape(x, s1), s2) -> Reshape(x, s) (see :func:`collapsed_shape`)."""

    name = "reshape-reshape"
    summary = "Reshape(Reshape(x, s1), s2) -> Reshape(x, s)"

    def pattern(self, op, x, s1, s2):
        inner = op.Reshape(x, s1, allowzero=AttrVar("allowzero1", default=0))
        return op.Reshape(inner, s2, allowzero=AttrVar("allowzero2", default=0))

    @staticmethod
    def _shape(x, s1, s2, allowzero1, allowzero2):
        second = RuleContext.constant(s2)
        if second is None:
            return "the second Reshape's shape is not a constant"
        # The intermediate tensor: the first Reshape's output (any Reshape(x, s1) has the same shape).
        mid = next(n for n in s1.consumers() if n.op_type == "Reshape" and n.inputs[0] is x
                   and n.inputs[1] is s1).outputs[0]
        dims = None if mid.shape is None else mid.shape.dims
        return collapsed_shape(RuleContext.constant(s1), int(allowzero1 or 0), second, int(allowzero2 or 0),
                               dims)

    def check(self, context: RuleContext, x, s1, s2, allowzero1, allowzero2):
        res = self._shape(x, s1, s2, allowzero1, allowzero2)
        return MatchResult().fail(res) if isinstance(res, str) else MatchResult()

    def rewrite(self, op, x, s1, s2, allowzero1, allowzero2):
        shape, allowzero = self._shape(x, s1, s2, allowzero1, allowzero2)
        target = op.constant(np.array(shape, np.int64), "collapsed_shape")
        return op.Reshape(x, target, allowzero=allowzero or None)


def compose_perms(p1: Optional[Sequence[int]], p2: Optional[Sequence[int]], rank: Optional[int]
                  ) -> Optional[List[int]]:
    """The perm of ``Transpose(Transpose(x, p1), p2)`` as one Transpose of ``x``: ``p[j] = p1[p2[j]]``
    (output axis j of the second reads axis p2[j] of the first, which reads axis p1[p2[j]] of x).
    A missing perm reverses the axes (ONNX Transpose spec), which needs ``rank``; None when unknown."""
    if p1 is None or p2 is None:
        if rank is None:
            return None
        rev = list(range(rank))[::-1]
        p1 = rev if p1 is None else p1
        p2 = rev if p2 is None else p2
    return [int(p1[j]) for j in p2]


@register_rule
class TransposeTranspose(RewriteRule):
    """Transpose(Transpose(x, p1), p2) -> Transpose(x, p1[p2]), or Identity(x) when that is 0..r-1."""

    name = "transpose-transpose"
    summary = "Transpose(Transpose(x, p1), p2) -> one Transpose, or Identity when they cancel"

    def pattern(self, op, x):
        return op.Transpose(op.Transpose(x, perm=AttrVar("p1")), perm=AttrVar("p2"))

    def check(self, context: RuleContext, x, p1, p2):
        if compose_perms(p1, p2, _rank(x)) is None:
            return MatchResult().fail("a Transpose has no perm (reverse axes) and the rank is unknown "
                                      "(run infer-shapes)")
        return MatchResult()

    def rewrite(self, op, x, p1, p2):
        perm = compose_perms(p1, p2, _rank(x))
        if perm == list(range(len(perm))):
            return op.Identity(x)
        return op.Transpose(x, perm=perm)


def _norm_axes(axes, rank: Optional[int]) -> Optional[List[int]]:
    if axes is None or rank is None:
        return None
    return sorted(int(a) + rank if int(a) < 0 else int(a) for a in np.asarray(axes).reshape(-1))


class PairRule(RewriteRule):
    """Unsqueeze(Squeeze(x, A), A) and Squeeze(Unsqueeze(x, A), A) -> Identity(x).

    One rule object per inner op (``squeeze-unsqueeze``, ``unsqueeze-squeeze``). Each op's axes are
    an input (opset >= 13) or an attribute (opset < 13, or a Squeeze without axes), as alternatives
    named ``inner`` / ``outer``; a match counts as ``<inner op>-<outer op>-<inner form>-<outer form>``
    (``squeeze-unsqueeze-input-attr``, ...: the former rule names, aliases of these). Axes are
    compared after normalizing negative values: Squeeze's against rank r of x (and Unsqueeze's
    against the output rank, also r); Unsqueeze's against r + k (and Squeeze's against the same
    rank, its input). (ONNX Squeeze-13 / Unsqueeze-13.)

    Args:
        inner_op: ``"Squeeze"`` or ``"Unsqueeze"``.
    """

    def __init__(self, inner_op: str):
        self.inner_op = inner_op
        self.outer_op = "Unsqueeze" if inner_op == "Squeeze" else "Squeeze"
        self.name = f"{inner_op.lower()}-{self.outer_op.lower()}"
        self.variant = self.name + "-{inner}-{outer}"
        self.summary = f"{self.outer_op}({inner_op}(x, axes), axes) -> x"
        super().__init__()

    def pattern(self, op, x, a_in, a_out):
        inner = Or(op.op(self.inner_op, x, a_in), op.op(self.inner_op, x, axes=AttrVar("axes_in")),
                   name="inner", labels=("input", "attr"))
        return Or(op.op(self.outer_op, inner, a_out), op.op(self.outer_op, inner, axes=AttrVar("axes_out")),
                  name="outer", labels=("input", "attr"))

    def check(self, context: RuleContext, x, inner, outer, a_in=None, a_out=None, axes_in=None,
              axes_out=None):
        inner_input, outer_input = inner == "input", outer == "input"
        inner = context.constant(a_in) if inner_input else axes_in
        outer = context.constant(a_out) if outer_input else axes_out
        if (inner_input and inner is None) or (outer_input and outer is None):
            return MatchResult().fail("axes are not constant")
        rank = _rank(x)
        if rank is None:
            return MatchResult().fail("rank of the input is unknown (run infer-shapes)")
        dims = list(x.shape.dims)
        if self.inner_op == "Squeeze":
            if inner is None:  # Squeeze without axes drops every size-1 dim: needs a static shape
                if not x.shape.is_static():
                    return MatchResult().fail("Squeeze without axes on a shape that is not static: which "
                                              "dims it drops is known only at run time")
                inner = [i for i, d in enumerate(dims) if d == 1]
            k = len(np.asarray(inner).reshape(-1))
            a, b = _norm_axes(inner, rank), _norm_axes(outer, rank)
        else:
            k = len(np.asarray(inner).reshape(-1))
            a = _norm_axes(inner, rank + k)
            if outer is None:  # Squeeze without axes also drops x's own size-1 dims
                if not x.shape.is_static() or 1 in dims:
                    return MatchResult().fail("Squeeze without axes would also drop size-1 (or unknown) dims "
                                              "of the input")
                outer = a
            b = _norm_axes(outer, rank + k)
        if a != b:
            return MatchResult().fail(f"{self.inner_op} axes {a} and {self.outer_op} axes {b} differ: they "
                                      "do not cancel")
        return MatchResult()

    def rewrite(self, op, x, **_):
        return op.Identity(x)


squeeze_unsqueeze = register_rule(PairRule("Squeeze"))
unsqueeze_squeeze = register_rule(PairRule("Unsqueeze"))
PAIR_RULES = (squeeze_unsqueeze, unsqueeze_squeeze)
RULES = (ReshapeReshape, TransposeTranspose) + PAIR_RULES


@register_pass
class FuseReshapeChains(RuleSet):
    """Collapse layout-only op chains (a rule set; standard ONNX, any target).

    Rules (stat keys are the rule names, or the variant names where said):
      1. ``reshape-reshape``: ``Reshape(Reshape(x, s1), s2)`` -> ``Reshape(x, s)``, respecting
         ``allowzero`` (see :func:`collapsed_shape`; refuses, with the reason, when a copied 0 cannot
         be translated).
      2. ``transpose-transpose``: two Transposes -> one (perm ``p1[p2]``), or ``Identity`` when the
         composition is the identity.
      3. ``squeeze-unsqueeze`` / ``unsqueeze-squeeze`` (counted as ``squeeze-unsqueeze-<inner
         axes>-<outer axes>``, each ``input`` or ``attr``): pairs with the same (normalized) axes ->
         ``Identity``.

    Identity nodes are left for ``eliminate-identity``. Statistics: ``fused`` and per rule.
    """

    name = "fuse-reshape-chains"
    summary = "Collapse Reshape->Reshape and Transpose->Transpose chains and cancel Squeeze/Unsqueeze pairs"

    def __init__(self, options=None, **kwargs):
        super().__init__(RULES, options, **kwargs)

    def run(self, model: Model) -> PassResult:
        result = super().run(model)
        return PassResult(result.modified, {"fused": sum(result.stats.values()), **result.stats})
