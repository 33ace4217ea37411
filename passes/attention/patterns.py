"""The attention pattern family pattern_N: one rule object per way exports write softmax(Q.K^T*s+m).V."""

from __future__ import annotations

import copy
import logging
import math
from typing import Dict, List, Tuple

from passctl.ir import Shape, TensorType, Value
from passctl.passes.attention import guard
from passctl.dialect.attention import OP_TYPE
from passctl.dialect.canonical import DOMAIN
from passctl.passes.rewrite import MatchResult, RewriteRule, register_rule

logger = logging.getLogger(__name__)

SCALE_FORMS = {
    "mul-after": "Mul(MatMul(Q, K^T), s)",
    "div-after": "Div(MatMul(Q, K^T), sqrt(d))",
    "split": "MatMul(Mul(Q, s^0.5), Mul(K^T, s^0.5)) (torch's sdpa decomposition)",
    "mul-q": "MatMul(Mul(Q, s), K^T)",
    "div-q": "MatMul(Div(Q, sqrt(d)), K^T)",
    "unscaled": "MatMul(Q, K^T) (scale 1; the guard refuses it unless any_scale)",
}
MASK_FORMS = {
    "nomask": "no mask",
    "add": "Add(scores, mask) (additive float mask)",
    "where": "Where(keep, scores, fill) (boolean mask, fill -inf or a large negative)",
}
SOFTMAX_FORMS = {
    "softmax": "Softmax(scores)",
    "nanguard": "Where(IsNaN(p), 0, p) after Softmax (transformers 5, torch's sdpa export)",
    "fp32": "Cast(Softmax(Cast(scores, float32)), T) (fp16/bf16 models)",
    "castout": "Cast(Softmax(scores), T) with T the scores' type (eager softmax(dtype=float32).to() "
               "in a float32 model, legacy exporter)",
}


class AttentionPattern(RewriteRule):
    """The family's rule: ``MatMul(P(mask(scale(Q, K^T))), V)`` -> ``passctl::Attention``.

    One object per way of writing the scale, the mask and the softmax; its name says which:
    ``attention-<number>-<scale form>-<mask form>-<softmax form>`` (keys of :data:`SCALE_FORMS`,
    :data:`MASK_FORMS`, :data:`SOFTMAX_FORMS`). K^T's layout (Transpose of any permutation, the
    dynamo Reshape-Transpose-Reshape chain), grouped-query ``repeat_kv``, packed QKV and rotary
    embeddings upstream of Q/K are not part of the pattern: the shared guard
    (:func:`passctl.passes.attention.guard.check`) traces and checks them, and its plan goes to
    ``rewrite`` through the check result. ``any_scale`` is the ``fuse-attention`` option of that
    name (:meth:`with_any_scale`).

    Args:
        name: the rule name, e.g. ``"attention-37-mul-after-nomask-fp32"``.

    Raises:
        ValueError: a name whose forms are not the family's.
    """

    # NOTE: no commuted inputs: exports put the scores first in Mul/Div/Add and the scale constant
    # second; trying both orders would also bind Q to the constant and blur the reported reason.
    commute = False
    any_scale = False

    def __init__(self, name: str):
        head, number, rest = name.split("-", 2)
        scale_form, mask_form, softmax_form = rest.rsplit("-", 2)
        if head != "attention" or not number.isdigit() or scale_form not in SCALE_FORMS or \
                mask_form not in MASK_FORMS or softmax_form not in SOFTMAX_FORMS:
            raise ValueError(f"attention rule name '{name}' is not attention-<n>-<scale>-<mask>-<softmax>")
        self.name, self.number = name, int(number)
        self.scale_form, self.mask_form, self.softmax_form = scale_form, mask_form, softmax_form
        self.summary = (f"pattern_{number}: {SCALE_FORMS[scale_form]}; {MASK_FORMS[mask_form]}; "
                        f"{SOFTMAX_FORMS[softmax_form]} -> passctl::Attention")
        super().__init__()

    def with_any_scale(self, any_scale: bool) -> "AttentionPattern":
        """This rule with the ``any_scale`` option (a copy when it differs; the module's objects are
        shared by every ``fuse-attention`` pass)."""
        if bool(any_scale) == self.any_scale:
            return self
        rule = copy.copy(self)
        rule.any_scale = bool(any_scale)
        return rule

    def pattern(self, op, q, kt, v, s1, s2, mask, fill):
        f = self.scale_form
        if f == "mul-after":
            scores = op.Mul(op.MatMul(q, kt), s1)
        elif f == "div-after":
            scores = op.Div(op.MatMul(q, kt), s1)
        elif f == "split":
            scores = op.MatMul(op.Mul(q, s1), op.Mul(kt, s2))
        elif f == "mul-q":
            scores = op.MatMul(op.Mul(q, s1), kt)
        elif f == "div-q":
            scores = op.MatMul(op.Div(q, s1), kt)
        else:
            scores = op.MatMul(q, kt)
        if self.mask_form == "add":
            scores = op.Add(scores, mask)
        elif self.mask_form == "where":
            scores = op.Where(mask, scores, fill)
        if self.softmax_form == "fp32":
            probs = op.Cast(op.Softmax(op.Cast(scores, _name="cast_in"), _name="softmax"), _name="cast_out")
        elif self.softmax_form == "castout":
            probs = op.Cast(op.Softmax(scores, _name="softmax"), _name="cast_out")
        elif self.softmax_form == "nanguard":
            sm = op.Softmax(scores, _name="softmax")
            probs = op.Where(op.IsNaN(sm), 0.0, sm)
        else:
            probs = op.Softmax(scores, _name="softmax")
        return op.MatMul(probs, v)

    def _factors(self, b: Dict[str, Value]) -> List[Tuple[Value, str]]:
        f = self.scale_form
        if f in ("mul-after", "mul-q"):
            return [(b["s1"], "mul")]
        if f in ("div-after", "div-q"):
            return [(b["s1"], "div")]
        if f == "split":
            return [(b["s1"], "mul"), (b["s2"], "mul")]
        return []

    def check(self, context, softmax, cast_in=None, cast_out=None, **b):
        cast = self.softmax_form == "fp32"
        if cast:
            if cast_in.attr("to") != 1 or b["q"].dtype is None or cast_out.attr("to") != int(b["q"].dtype):
                return MatchResult().fail("the Casts around Softmax are not float32 and back to Q's "
                                          "element type", softmax)
        if self.softmax_form == "castout":
            dtype = softmax.inputs[0].dtype
            if dtype is None or cast_out.attr("to") != int(dtype) or b["q"].dtype != dtype:
                return MatchResult().fail("the Cast after Softmax changes the element type (not the "
                                          "no-op cast of a float32 model)", softmax)
        cand = guard.Candidate(b["q"], b["kt"], b["v"], self._factors(b), softmax,
                               context.root.outputs[0], mask=b.get("mask"),
                               mask_form="none" if self.mask_form == "nomask" else self.mask_form,
                               fill=b.get("fill"), softmax_cast=cast,
                               nan_to_zero=self.softmax_form == "nanguard")
        opset = context.model.opset if context.model is not None else 17
        plan, result = guard.check(cand, opset, self.any_scale)
        return MatchResult(plan=plan) if result else result

    def rewrite(self, op, plan: guard.Plan, **_):
        k, v = _bhsd(op, plan.k), _bhsd(op, plan.v)
        ins = [plan.q.value, k, v] + ([plan.mask] if plan.mask is not None else [])
        # NOTE: a Where mask stays boolean whatever its fill: Where(keep, s, fill) replaces the masked
        # scores, which an additive s + Where(keep, 0, fill) equals only in rows that keep a key (a
        # fully masked row is uniform in the original, softmax(s) in the additive form; issue 15).
        finite_fill = plan.mask_kind == "boolean" and math.isfinite(plan.fill)
        return op.op(OP_TYPE, *ins, _domain=DOMAIN, scale=float(plan.scale), mask_kind=plan.mask_kind,
                     mask_fill=float(plan.fill) if finite_fill else None,
                     is_causal=int(plan.is_causal), num_heads=int(plan.num_heads),
                     kv_num_heads=int(plan.kv_num_heads), softmax_precision=plan.softmax_precision,
                     nan_to_zero=int(plan.nan_to_zero))


def _bhsd(op, operand) -> Value:
    """The operand in BHSD: its value, or a new Transpose of it that carries the permuted shape (a
    lowering reads ranks and head counts from it: a value without a shape made the kernel forms
    guess; issue 15, case 01)."""
    if operand.perm is None:
        return operand.value
    x = operand.value
    y = op.Transpose(x, perm=list(operand.perm))
    if x.type is not None and x.dtype is not None:
        shape = None if x.shape is None else Shape([x.shape.dims[p] for p in operand.perm])
        y.type = TensorType(x.dtype, shape)
    return y


# One rule per (softmax form, mask form, scale form), numbered in the order fuse-attention tries them.
pattern_1 = register_rule(AttentionPattern("attention-1-mul-after-nomask-softmax"))
pattern_2 = register_rule(AttentionPattern("attention-2-div-after-nomask-softmax"))
pattern_3 = register_rule(AttentionPattern("attention-3-split-nomask-softmax"))
pattern_4 = register_rule(AttentionPattern("attention-4-mul-q-nomask-softmax"))
pattern_5 = register_rule(AttentionPattern("attention-5-div-q-nomask-softmax"))
pattern_6 = register_rule(AttentionPattern("attention-6-unscaled-nomask-softmax"))
pattern_7 = register_rule(AttentionPattern("attention-7-mul-after-add-softmax"))
pattern_8 = register_rule(AttentionPattern("attention-8-div-after-add-softmax"))
pattern_9 = register_rule(AttentionPattern("attention-9-split-add-softmax"))
pattern_10 = register_rule(AttentionPattern("attention-10-mul-q-add-softmax"))
pattern_11 = register_rule(AttentionPattern("attention-11-div-q-add-softmax"))
pattern_12 = register_rule(AttentionPattern("attention-12-unscaled-add-softmax"))
pattern_13 = register_rule(AttentionPattern("attention-13-mul-after-where-softmax"))
pattern_14 = register_rule(AttentionPattern("attention-14-div-after-where-softmax"))
pattern_15 = register_rule(AttentionPattern("attention-15-split-where-softmax"))
pattern_16 = register_rule(AttentionPattern("attention-16-mul-q-where-softmax"))
pattern_17 = register_rule(AttentionPattern("attention-17-div-q-where-softmax"))
pattern_18 = register_rule(AttentionPattern("attention-18-unscaled-where-softmax"))
pattern_19 = register_rule(AttentionPattern("attention-19-mul-after-nomask-nanguard"))
pattern_20 = register_rule(AttentionPattern("attention-20-div-after-nomask-nanguard"))
pattern_21 = register_rule(AttentionPattern("attention-21-split-nomask-nanguard"))
pattern_22 = register_rule(AttentionPattern("attention-22-mul-q-nomask-nanguard"))
pattern_23 = register_rule(AttentionPattern("attention-23-div-q-nomask-nanguard"))
pattern_24 = register_rule(AttentionPattern("attention-24-unscaled-nomask-nanguard"))
pattern_25 = register_rule(AttentionPattern("attention-25-mul-after-add-nanguard"))
pattern_26 = register_rule(AttentionPattern("attention-26-div-after-add-nanguard"))
pattern_27 = register_rule(AttentionPattern("attention-27-split-add-nanguard"))
pattern_28 = register_rule(AttentionPattern("attention-28-mul-q-add-nanguard"))
pattern_29 = register_rule(AttentionPattern("attention-29-div-q-add-nanguard"))
pattern_30 = register_rule(AttentionPattern("attention-30-unscaled-add-nanguard"))
pattern_31 = register_rule(AttentionPattern("attention-31-mul-after-where-nanguard"))
pattern_32 = register_rule(AttentionPattern("attention-32-div-after-where-nanguard"))
pattern_33 = register_rule(AttentionPattern("attention-33-split-where-nanguard"))
pattern_34 = register_rule(AttentionPattern("attention-34-mul-q-where-nanguard"))
pattern_35 = register_rule(AttentionPattern("attention-35-div-q-where-nanguard"))
pattern_36 = register_rule(AttentionPattern("attention-36-unscaled-where-nanguard"))
pattern_37 = register_rule(AttentionPattern("attention-37-mul-after-nomask-fp32"))
pattern_38 = register_rule(AttentionPattern("attention-38-div-after-nomask-fp32"))
pattern_39 = register_rule(AttentionPattern("attention-39-split-nomask-fp32"))
pattern_40 = register_rule(AttentionPattern("attention-40-mul-q-nomask-fp32"))
pattern_41 = register_rule(AttentionPattern("attention-41-div-q-nomask-fp32"))
pattern_42 = register_rule(AttentionPattern("attention-42-unscaled-nomask-fp32"))
pattern_43 = register_rule(AttentionPattern("attention-43-mul-after-add-fp32"))
pattern_44 = register_rule(AttentionPattern("attention-44-div-after-add-fp32"))
pattern_45 = register_rule(AttentionPattern("attention-45-split-add-fp32"))
pattern_46 = register_rule(AttentionPattern("attention-46-mul-q-add-fp32"))
pattern_47 = register_rule(AttentionPattern("attention-47-div-q-add-fp32"))
pattern_48 = register_rule(AttentionPattern("attention-48-unscaled-add-fp32"))
pattern_49 = register_rule(AttentionPattern("attention-49-mul-after-where-fp32"))
pattern_50 = register_rule(AttentionPattern("attention-50-div-after-where-fp32"))
pattern_51 = register_rule(AttentionPattern("attention-51-split-where-fp32"))
pattern_52 = register_rule(AttentionPattern("attention-52-mul-q-where-fp32"))
pattern_53 = register_rule(AttentionPattern("attention-53-div-q-where-fp32"))
pattern_54 = register_rule(AttentionPattern("attention-54-unscaled-where-fp32"))
pattern_55 = register_rule(AttentionPattern("attention-55-mul-after-nomask-castout"))
pattern_56 = register_rule(AttentionPattern("attention-56-div-after-nomask-castout"))
pattern_57 = register_rule(AttentionPattern("attention-57-split-nomask-castout"))
pattern_58 = register_rule(AttentionPattern("attention-58-mul-q-nomask-castout"))
pattern_59 = register_rule(AttentionPattern("attention-59-div-q-nomask-castout"))
pattern_60 = register_rule(AttentionPattern("attention-60-unscaled-nomask-castout"))
pattern_61 = register_rule(AttentionPattern("attention-61-mul-after-add-castout"))
pattern_62 = register_rule(AttentionPattern("attention-62-div-after-add-castout"))
pattern_63 = register_rule(AttentionPattern("attention-63-split-add-castout"))
pattern_64 = register_rule(AttentionPattern("attention-64-mul-q-add-castout"))
pattern_65 = register_rule(AttentionPattern("attention-65-div-q-add-castout"))
pattern_66 = register_rule(AttentionPattern("attention-66-unscaled-add-castout"))
pattern_67 = register_rule(AttentionPattern("attention-67-mul-after-where-castout"))
pattern_68 = register_rule(AttentionPattern("attention-68-div-after-where-castout"))
pattern_69 = register_rule(AttentionPattern("attention-69-split-where-castout"))
pattern_70 = register_rule(AttentionPattern("attention-70-mul-q-where-castout"))
pattern_71 = register_rule(AttentionPattern("attention-71-div-q-where-castout"))
pattern_72 = register_rule(AttentionPattern("attention-72-unscaled-where-castout"))

PATTERNS: List[AttentionPattern] = [
    pattern_1, pattern_2, pattern_3, pattern_4, pattern_5, pattern_6, pattern_7, pattern_8, pattern_9,
    pattern_10, pattern_11, pattern_12, pattern_13, pattern_14, pattern_15, pattern_16, pattern_17,
    pattern_18, pattern_19, pattern_20, pattern_21, pattern_22, pattern_23, pattern_24, pattern_25,
    pattern_26, pattern_27, pattern_28, pattern_29, pattern_30, pattern_31, pattern_32, pattern_33,
    pattern_34, pattern_35, pattern_36, pattern_37, pattern_38, pattern_39, pattern_40, pattern_41,
    pattern_42, pattern_43, pattern_44, pattern_45, pattern_46, pattern_47, pattern_48, pattern_49,
    pattern_50, pattern_51, pattern_52, pattern_53, pattern_54, pattern_55, pattern_56, pattern_57,
    pattern_58, pattern_59, pattern_60, pattern_61, pattern_62, pattern_63, pattern_64, pattern_65,
    pattern_66, pattern_67, pattern_68, pattern_69, pattern_70, pattern_71, pattern_72,
]
"""pattern_1 ... pattern_72, in the order the pass tries them."""


__all__ = ["AttentionPattern", "MASK_FORMS", "PATTERNS", "SCALE_FORMS", "SOFTMAX_FORMS",
           *(f"pattern_{n}" for n in range(1, len(PATTERNS) + 1))]
