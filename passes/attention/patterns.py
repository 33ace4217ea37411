"""The attention pattern family pattern_N: one rule per way exports write softmax(Q.K^T * s + m) . V."""

from __future__ import annotations

import itertools
import logging
from typing import Dict, List, Tuple, Type

import numpy as np

from passctl.ir import Value
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
    """Base of the family: ``MatMul(P(mask(scale(Q, K^T))), V)`` -> ``passctl::Attention``.

    Each subclass fixes one way of writing the scale, the mask and the softmax (class attributes
    ``scale_form``, ``mask_form``, ``softmax_form``). K^T's layout (Transpose of any permutation,
    the dynamo Reshape-Transpose-Reshape chain), grouped-query ``repeat_kv``, packed QKV and rotary
    embeddings upstream of Q/K are not part of the pattern: the shared guard
    (:func:`passctl.passes.attention.guard.check`) traces and checks them. ``any_scale`` is set by
    the pass (option of ``fuse-attention``).
    """

    # NOTE: no commuted inputs: exports put the scores first in Mul/Div/Add and the scale constant
    # second; trying both orders would also bind Q to the constant and blur the reported reason.
    commute = False
    scale_form = mask_form = softmax_form = ""
    number = 0
    any_scale = False

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
            probs = op.Cast(op.Softmax(op.Cast(scores)))
        elif self.softmax_form == "castout":
            probs = op.Cast(op.Softmax(scores))
        elif self.softmax_form == "nanguard":
            sm = op.Softmax(scores)
            probs = op.Where(op.IsNaN(sm), 0.0, sm)
        else:
            probs = op.Softmax(scores)
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

    def check(self, context, **b):
        softmax = next(n for n in context.nodes if n.op_type == "Softmax")
        cast = self.softmax_form == "fp32"
        if cast:
            inner = softmax.inputs[0].producer
            outer = next(n for n in context.nodes if n.op_type == "Cast" and n is not inner)
            if inner.attr("to") != 1 or b["q"].dtype is None or outer.attr("to") != int(b["q"].dtype):
                return MatchResult().fail("the Casts around Softmax are not float32 and back to Q's "
                                          "element type", softmax)
        if self.softmax_form == "castout":
            outer = next(n for n in context.nodes if n.op_type == "Cast")
            dtype = softmax.inputs[0].dtype
            if dtype is None or outer.attr("to") != int(dtype) or b["q"].dtype != dtype:
                return MatchResult().fail("the Cast after Softmax changes the element type (not the "
                                          "no-op cast of a float32 model)", softmax)
        cand = guard.Candidate(b["q"], b["kt"], b["v"], self._factors(b), softmax,
                               context.root.outputs[0], mask=b.get("mask"),
                               mask_form="none" if self.mask_form == "nomask" else self.mask_form,
                               fill=b.get("fill"), softmax_cast=cast,
                               nan_to_zero=self.softmax_form == "nanguard")
        opset = context.model.opset if context.model is not None else 17
        plan, result = guard.check(cand, opset, self.any_scale)
        self._plan = plan
        return result

    def rewrite(self, op, **b):
        plan: guard.Plan = self._plan
        k = plan.k.value if plan.k.perm is None else op.Transpose(plan.k.value, perm=list(plan.k.perm))
        v = plan.v.value if plan.v.perm is None else op.Transpose(plan.v.value, perm=list(plan.v.perm))
        ins = [plan.q.value, k, v]
        if plan.mask is not None:
            mask = plan.mask
            if self.mask_form == "where" and plan.mask_kind == "additive":
                dtype = (plan.q.value.dtype.numpy() if plan.q.value.dtype is not None else np.float32)
                mask = op.Where(mask, op.constant(np.array(0, dtype=dtype), "attn_keep"),
                                op.constant(np.array(plan.fill, dtype=dtype), "attn_fill"))
            ins.append(mask)
        return op.op(OP_TYPE, *ins, _domain=DOMAIN, scale=float(plan.scale), mask_kind=plan.mask_kind,
                     is_causal=int(plan.is_causal), num_heads=int(plan.num_heads),
                     kv_num_heads=int(plan.kv_num_heads), softmax_precision=plan.softmax_precision,
                     nan_to_zero=int(plan.nan_to_zero))


def _make_family() -> List[Type[AttentionPattern]]:
    out = []
    combos = itertools.product(SOFTMAX_FORMS, MASK_FORMS, SCALE_FORMS)
    for number, (softmax_form, mask_form, scale_form) in enumerate(combos, start=1):
        name = f"attention-{number}-{scale_form}-{mask_form}-{softmax_form}"
        summary = (f"pattern_{number}: {SCALE_FORMS[scale_form]}; {MASK_FORMS[mask_form]}; "
                   f"{SOFTMAX_FORMS[softmax_form]} -> passctl::Attention")
        cls = type(f"pattern_{number}", (AttentionPattern,),
                   {"name": name, "summary": summary, "number": number, "scale_form": scale_form,
                    "mask_form": mask_form, "softmax_form": softmax_form,
                    "__module__": __name__, "__doc__": summary})
        out.append(register_rule(cls))
    return out


PATTERNS: List[Type[AttentionPattern]] = _make_family()
"""pattern_1 ... pattern_72, in the order the pass tries them."""

globals().update({cls.__name__: cls for cls in PATTERNS})


__all__ = ["AttentionPattern", "MASK_FORMS", "PATTERNS", "SCALE_FORMS", "SOFTMAX_FORMS"]
