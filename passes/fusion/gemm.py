"""fuse-gemm: MatMul + Add -> Gemm, Transpose folded into Gemm/MatMul operands."""

from __future__ import annotations

import logging
from typing import Optional, Sequence

import numpy as np

from passctl.ir import DataType, Model, Value
from passctl.passes.base import PassResult
from passctl.passes.fusion.conv_activation import MS_DOMAIN, import_ms_domain
from passctl.passes.registry import register_pass
from passctl.passes.rewrite import AttrVar, MatchResult, Opt, RewriteRule, RuleContext, RuleSet, register_rule

logger = logging.getLogger(__name__)

# Gemm-13 element types that ONNX Runtime's CPU Gemm kernel runs (float, double).
_GEMM_TYPES = (DataType.FLOAT, DataType.DOUBLE)


def _rank(v: Optional[Value]) -> Optional[int]:
    return None if v is None or v.shape is None else v.shape.rank


def _swaps_last_two(perm: Optional[Sequence[int]], rank: Optional[int]) -> bool:
    """True when Transpose(perm) on a rank-``rank`` tensor swaps the last two axes only."""
    if rank is None or rank < 2:
        return False
    if perm is None:  # Transpose without perm reverses the axes (ONNX Transpose spec)
        return rank == 2
    return list(perm) == list(range(rank - 2)) + [rank - 1, rank - 2]


def _const_or_transposed_const(v: Value) -> bool:
    if RuleContext.constant(v) is not None:
        return True
    p = v.producer
    return p is not None and p.op_type == "Transpose" and RuleContext.constant(p.inputs[0]) is not None


def _dtype_reason(v: Value) -> Optional[str]:
    if v.dtype not in _GEMM_TYPES:
        what = "unknown" if v.dtype is None else v.dtype.short_name
        return f"element type {what}: Gemm is fused only for float32/float64"
    return None


def _bias_reason(c: Value, out: Value, m, n) -> Optional[str]:
    """Why ``c`` cannot be Gemm's C (unidirectional broadcast to [M, N], Gemm-13 spec), or None."""
    if c.shape is None or out.shape is None:
        return f"shape of bias '{c.name}' or of the Add output is unknown (run infer-shapes)"
    dims = list(c.shape.dims)
    if len(dims) > 2 or out.shape.rank != 2:
        return (f"bias '{c.name}' of shape [{c.shape}] makes the Add output rank {out.shape.rank}: it does "
                "not broadcast to Gemm's [M, N]")
    full = [1] * (2 - len(dims)) + dims
    for d, want in zip(full, (m, n)):
        if d != 1 and (d != want or d is None):
            return f"bias '{c.name}' of shape [{c.shape}] does not broadcast to Gemm's [M, N] = [{m}, {n}]"
    if c.dtype != out.dtype:
        return f"bias '{c.name}' has another element type than the product"
    return None


class MatMulAddToGemm(RewriteRule):
    """Add(MatMul(a, b), c) -> Gemm(a, b, c) for 2-D ``a``, constant ``b`` (or a Transpose of a
    constant, folded next by :class:`GemmTransposeRule`) and ``c`` that broadcasts to [M, N].

    Math: Gemm-13 computes ``alpha * A' B' + beta * C`` with alpha = beta = 1 by default, C
    unidirectionally broadcast to [M, N]; MatMul-13 of 2-D inputs is ``A B``.
    """

    name = "matmul-add-gemm"
    summary = "Add(MatMul(a, b), c) -> Gemm(a, b, c) for 2-D a, constant b"
    commute = True

    def pattern(self, op, a, b, c):
        return op.Add(op.MatMul(a, b), c)

    def check(self, context: RuleContext, a, b, c):
        rank_a, rank_b = _rank(a), _rank(b)
        if rank_a is None or rank_b is None:
            return MatchResult().fail("ranks of the MatMul inputs are unknown (run infer-shapes)")
        if rank_a != 2 or rank_b != 2:
            return MatchResult().fail(f"MatMul of rank {rank_a} x rank {rank_b}: Gemm takes 2-D A and B; "
                                      "ONNX Runtime fuses batched MatMul + Add itself (1.32: "
                                      "Reshape + Gemm + Reshape at ORT_ENABLE_EXTENDED; FusedMatMul has no "
                                      "bias), so the pair stays")
        if not _const_or_transposed_const(b):
            return MatchResult().fail(f"B '{b.name}' is not a constant weight")
        reason = _dtype_reason(a) or _bias_reason(c, context.root.outputs[0], a.shape[0], b.shape[1])
        return MatchResult().fail(reason) if reason else MatchResult()

    def rewrite(self, op, a, b, c):
        return op.Gemm(a, b, c)


class GemmTransposeRule(RewriteRule):
    """Gemm(Transpose(a), b[, c]) -> Gemm(a, b[, c], transA=1 - transA), and the same for ``b``.

    Gemm's operands are 2-D, so the Transpose (perm [1, 0] or none) is exactly Gemm's transA/transB
    (Gemm-13 spec). One rule object per operand (``gemm-transpose-a`` / ``-b``); ``c`` is an
    optional input, and a fold with ``c`` counts as ``gemm-transpose-a-bias`` / ``-b-bias`` (aliases).

    Args:
        operand: ``"a"`` or ``"b"``.
    """

    def __init__(self, operand: str):
        self.operand = operand
        self.name = f"gemm-transpose-{operand}"
        self.aliases = (f"{self.name}-bias",)
        self.summary = f"Gemm(Transpose({operand}), ...) -> Gemm(trans{operand.upper()})"
        super().__init__()

    def pattern(self, op, a, b, c):
        ta = op.Transpose(a, perm=AttrVar("perm")) if self.operand == "a" else a
        tb = op.Transpose(b, perm=AttrVar("perm")) if self.operand == "b" else b
        return op.Gemm(ta, tb, Opt(c), alpha=AttrVar("alpha"), beta=AttrVar("beta"),
                       transA=AttrVar("transA", default=0), transB=AttrVar("transB", default=0))

    def reported_name(self, bindings):
        return self.name if bindings["c"] is None else f"{self.name}-bias"

    def check(self, context: RuleContext, perm=None):
        if perm is not None and list(perm) != [1, 0]:
            return MatchResult().fail(f"Transpose perm {list(perm)} is not [1, 0]")
        return MatchResult()

    def rewrite(self, op, a, b, alpha, beta, transA, transB, c=None):
        flags = {"transA": transA, "transB": transB}
        key = "transA" if self.operand == "a" else "transB"
        flags[key] = 1 - flags[key]
        inputs = [a, b] + ([c] if c is not None else [])
        return op.Gemm(*inputs, alpha=alpha, beta=beta, transA=flags["transA"] or None,
                       transB=flags["transB"] or None)


class MatMulTransposeRule(RewriteRule):
    """MatMul with a Transpose that swaps the last two axes of one operand, folded:

    1. both 2-D: ``Gemm(a, b, transA/transB=1)`` (Gemm-13, no C);
    2. a constant weight (any perm): ``MatMul(a, W')`` with a NEW initializer ``W' =
       transpose(W, perm)``; the old weight is never changed (another node may read it);
    3. batched (rank > 2): ``com.microsoft::FusedMatMul(a, b, transA/transB=1)`` (ONNX Runtime
       contrib op; ContribOperators.md: transA/transB transpose the last two axes).
    """

    operand = "a"
    # False in fuse-gemm-standard: batched operands are left alone (FusedMatMul is ONNX Runtime's).
    contrib_ops = True

    def pattern(self, op, a, b):
        if self.operand == "a":
            return op.MatMul(op.Transpose(a, perm=AttrVar("perm")), b)
        return op.MatMul(a, op.Transpose(b, perm=AttrVar("perm")))

    def _mode(self, a, b, perm) -> str:
        t_in = a if self.operand == "a" else b
        if self.operand == "b" and RuleContext.constant(t_in) is not None and _rank(t_in) is not None and (
                _rank(a) is None or _rank(a) != 2 or _rank(t_in) != 2):
            return "constant"
        ra, rb = _rank(a), _rank(b)
        if ra is None or rb is None:
            return "unknown rank"
        if not _swaps_last_two(perm, _rank(t_in)):
            return f"perm {None if perm is None else list(perm)} does not swap only the last two axes"
        if ra == 2 and rb == 2:
            return "gemm"
        if ra < 2 or rb < 2:
            return "MatMul of a 1-D operand: no transposed form"
        if not self.contrib_ops:
            return ("batched MatMul: its transposed form is com.microsoft FusedMatMul (ONNX Runtime only), "
                    "which this standard-ONNX pass does not emit")
        return "fused"

    def check(self, context: RuleContext, a, b, perm=None):
        mode = self._mode(a, b, perm)
        if mode == "unknown rank":
            return MatchResult().fail("ranks of the MatMul operands are unknown (run infer-shapes)")
        if mode not in ("gemm", "constant", "fused"):
            return MatchResult().fail(mode)
        if mode != "constant":
            reason = _dtype_reason(a)
            if reason:
                return MatchResult().fail(reason)
        return MatchResult()

    def rewrite(self, op, a, b, perm=None):
        mode = self._mode(a, b, perm)
        flag = {"transA": 1} if self.operand == "a" else {"transB": 1}
        if mode == "constant":
            w = RuleContext.constant(b)
            axes = None if perm is None else list(perm)
            return op.MatMul(a, op.constant(np.ascontiguousarray(np.transpose(w, axes)), f"{b.name}_T"))
        if mode == "gemm":
            return op.Gemm(a, b, **flag)
        return op.FusedMatMul(a, b, _domain=MS_DOMAIN, **flag)


@register_rule
class MatMulTransposeA(MatMulTransposeRule):
    name = "matmul-transpose-a"
    summary = "MatMul(Transpose(a), b) -> Gemm / FusedMatMul with transA"


@register_rule
class MatMulTransposeB(MatMulTransposeRule):
    name = "matmul-transpose-b"
    summary = "MatMul(a, Transpose(b)) -> Gemm / FusedMatMul with transB, or a transposed weight"
    operand = "b"


@register_rule
class GemmAddBias(RewriteRule):
    """Add(Gemm(a, b) without C, c) -> Gemm(a, b, c, beta=1) when ``c`` broadcasts to [M, N]."""

    name = "gemm-add"
    summary = "Add(Gemm(a, b), c) -> Gemm(a, b, c)"
    commute = True

    def pattern(self, op, a, b, c):
        return op.Add(op.Gemm(a, b, alpha=AttrVar("alpha"), transA=AttrVar("transA", default=0),
                              transB=AttrVar("transB", default=0), _name="gemm"), c)

    def check(self, context: RuleContext, a, b, c, gemm, transA, transB):
        y = gemm.outputs[0].shape
        if y is None or y.rank != 2:
            return MatchResult().fail("shape of the Gemm output is unknown (run infer-shapes)")
        reason = _bias_reason(c, context.root.outputs[0], y[0], y[1])
        return MatchResult().fail(reason) if reason else MatchResult()

    def rewrite(self, op, a, b, c, alpha, transA, transB, **_):
        return op.Gemm(a, b, c, alpha=alpha, transA=transA or None, transB=transB or None)


gemm_transpose_a = register_rule(GemmTransposeRule("a"))
gemm_transpose_b = register_rule(GemmTransposeRule("b"))
GEMM_TRANSPOSE_RULES = (gemm_transpose_a, gemm_transpose_b)
RULES = (register_rule(MatMulAddToGemm), GemmAddBias, MatMulTransposeA, MatMulTransposeB) + \
    GEMM_TRANSPOSE_RULES


@register_pass
class FuseGemm(RuleSet):
    """MatMul + Add to Gemm and Transposes folded into Gemm / MatMul operands (a rule set).

    Rules (stat keys are the rule names):
      1. ``matmul-add-gemm``: ``Add(MatMul(a, b), c)`` -> ``Gemm(a, b, c)``: 2-D ``a``, constant 2-D
         ``b`` (or a Transpose of one), ``c`` broadcasting to [M, N]. Batched MatMul + Add stays
         (ONNX Runtime fuses it itself; the check says so).
      2. ``gemm-add``: ``Add(Gemm(a, b), c)`` -> ``Gemm(a, b, c)`` (after rule 3 made the Gemm).
      3. ``matmul-transpose-a`` / ``-b``: a Transpose swapping the last two axes of a MatMul operand
         becomes Gemm's transA/transB (2-D), a NEW transposed initializer (constant weight of a
         batched MatMul), or ``com.microsoft::FusedMatMul`` transA/transB (batched, ONNX Runtime).
      4. ``gemm-transpose-a`` / ``-b`` (counted as ``-bias`` with C): ``Gemm(Transpose(a), ...)``
         toggles transA/transB.

    Needs shapes (run ``infer-shapes`` first; the checks say so when they are missing). Adds the
    ``com.microsoft`` opset import when it emits FusedMatMul. Statistics: ``fused`` and per rule.
    """

    name = "fuse-gemm"
    summary = "MatMul + Add -> Gemm; Transpose folded into Gemm/MatMul operands"

    contrib_ops = True

    def __init__(self, options=None, **kwargs):
        rules = [r() for r in RULES]
        for r in rules:
            if isinstance(r, MatMulTransposeRule):
                r.contrib_ops = self.contrib_ops
        super().__init__(rules, options, **kwargs)

    def run(self, model: Model) -> PassResult:
        result = super().run(model)
        if result.modified:
            import_ms_domain(model)
        return PassResult(result.modified, {"fused": sum(result.stats.values()), **result.stats})


@register_pass
class FuseGemmStandard(FuseGemm):
    """:class:`FuseGemm` emitting standard ONNX only (for TVM / TensorRT): the same rules, except that
    a Transpose of a batched (rank > 2) MatMul operand stays (no com.microsoft FusedMatMul)."""

    name = "fuse-gemm-standard"
    summary = "MatMul + Add -> Gemm; Transpose folded into Gemm / constant MatMul weights (standard ONNX)"
    contrib_ops = False
