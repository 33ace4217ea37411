"""fuse-activations: SiLU (x * Sigmoid(x)) and HardSwish (HardSigmoid, Relu6 and Clip forms)."""

from __future__ import annotations

import logging

from passctl.dialect.canonical import DOMAIN
from passctl.passes.fusion.fusion_set import FusionRuleSet
from passctl.passes.registry import register_pass
from passctl.passes.rewrite import (AttrVar, ConstantPattern, MatchResult, Or, RewriteRule, RuleContext,
                                    register_rule)

logger = logging.getLogger(__name__)

def op_constant(v):
    """The scalar value of constant ``v``."""
    return RuleContext.constant(v).reshape(-1)[0]


_SIXTH = ConstantPattern(1.0 / 6.0, rtol=1e-6)


def _float_check(x, what):
    if x.dtype is not None and not x.dtype.is_floating:
        return MatchResult().fail(f"{what}: '{x.name}' is not floating point ({x.dtype})")
    return MatchResult()


@register_rule
class SiLU(RewriteRule):
    """Rule 1: ``Mul(x, Sigmoid(x))`` (either operand order) -> ``passctl::SiLU(x)``.
    Math: Elfwing et al. 2017 (SiLU; Swish with beta = 1)."""

    name = "silu"
    summary = "x * Sigmoid(x) -> passctl::SiLU"
    commute = True

    def pattern(self, op, x):
        return op.Mul(x, op.Sigmoid(x))

    def check(self, context, x):
        return _float_check(x, "SiLU")

    def rewrite(self, op, x):
        return op.SiLU(x, _domain=DOMAIN)


@register_rule
class SwishBeta(RewriteRule):
    """Rule 1b: ``Mul(x, Sigmoid(Mul(x, beta)))`` with a scalar constant beta (Paddle's swish, ONNX
    Swish-24's alpha) -> ``passctl::SiLU(x, alpha=beta)``."""

    name = "swish-beta"
    summary = "x * Sigmoid(beta * x) -> passctl::SiLU(alpha=beta)"
    commute = True

    def pattern(self, op, x, beta):
        return op.Mul(x, op.Sigmoid(op.Mul(x, beta)))

    def check(self, context, x, beta):
        arr = context.constant(beta)
        if arr is None or arr.size != 1 or arr.ndim > 1 or arr.dtype.kind != "f":
            return MatchResult().fail(f"Swish: beta '{beta.name}' is not a scalar float constant",
                                      beta.producer)
        return _float_check(x, "Swish")

    def rewrite(self, op, x, beta):
        alpha = float(op_constant(beta))
        return op.SiLU(x, _domain=DOMAIN, alpha=None if alpha == 1.0 else alpha)


@register_rule
class HardSwishFromHardSigmoid(RewriteRule):
    """Rule 2: ``Mul(x, HardSigmoid(x, alpha=1/6, beta=0.5))`` -> ``passctl::HardSwish(x)``
    (HardSwish-14's definition; other alpha/beta are a different function and are refused)."""

    name = "hardswish-hardsigmoid"
    summary = "x * HardSigmoid(x, 1/6, 0.5) -> passctl::HardSwish"
    commute = True

    def pattern(self, op, x):
        return op.Mul(x, op.HardSigmoid(x, alpha=AttrVar("alpha", default=0.2),
                                        beta=AttrVar("beta", default=0.5)))

    def check(self, context, x, alpha, beta):
        if abs(alpha - 1.0 / 6.0) > 1e-6 or abs(beta - 0.5) > 1e-6:
            return MatchResult().fail(f"HardSigmoid alpha={alpha}, beta={beta} is not HardSwish's "
                                      "alpha=1/6, beta=0.5", context.root)
        return _float_check(x, "HardSwish")

    def rewrite(self, op, x, **_):
        return op.HardSwish(x, _domain=DOMAIN)


@register_rule
class HardSwishRelu6(RewriteRule):
    """Rule 3: ``x * Relu6(x + 3) / 6`` -> ``passctl::HardSwish(x)``.

    Alternatives: ``div`` ``Div(Mul(x, r), 6)`` (Paddle, torch), ``mul`` ``Mul(Mul(x, r), 1/6)``,
    ``x-div`` ``Mul(x, Div(r, 6))``, ``x-mul`` ``Mul(x, Mul(r, 1/6))``; Relu6 as Clip with min/max
    inputs (opset >= 11) or attributes. A fusion counts as ``hardswish-<form>-<clip>``, the names of
    the former one-rule-per-variant classes (aliases of this rule).
    Math: Howard et al. 2019 (MobileNetV3), ONNX HardSwish-14.
    """

    name = "hardswish-relu6"
    summary = "x * Relu6(x + 3) / 6 -> passctl::HardSwish (counted as hardswish-<form>-<clip>)"
    variant = "hardswish-{form}-{clip}"
    commute = True

    def pattern(self, op, x):
        shifted = op.Add(x, 3.0)
        r = Or(op.Clip(shifted, 0.0, 6.0), op.Clip(shifted, min=0.0, max=6.0), name="clip",
               labels=("clip-inputs", "clip-attrs"))
        return Or(op.Div(op.Mul(x, r), 6.0), op.Mul(op.Mul(x, r), _SIXTH), op.Mul(x, op.Div(r, 6.0)),
                  op.Mul(x, op.Mul(r, _SIXTH)), name="form", labels=("div", "mul", "x-div", "x-mul"))

    def check(self, context, x):
        return _float_check(x, "HardSwish")

    def rewrite(self, op, x):
        return op.HardSwish(x, _domain=DOMAIN)


@register_pass
class FuseActivations(FusionRuleSet):
    """SiLU and HardSwish as canonical ``passctl::SiLU`` / ``passctl::HardSwish``.

    Rules: 1 ``silu``, 1b ``swish-beta``, 2 ``hardswish-hardsigmoid``, 3 ``hardswish-relu6`` (8 variants
    as alternatives, counted as ``hardswish-<form>-<clip>``). Lower with
    ``lower-onnxruntime`` (com.microsoft.QuickGelu(alpha=1) for SiLU; HardSwish-14 or
    x * HardSigmoid(x)) or ``lower-standard``.

    Statistics: ``silu``, ``hardswish``, and the count per rule.
    """

    name = "fuse-activations"
    summary = "Fuse x*Sigmoid(x) into passctl::SiLU and the HardSwish forms into passctl::HardSwish"
    RULES = (SiLU, SwishBeta, HardSwishFromHardSigmoid, HardSwishRelu6)
    FAMILIES = {SiLU.name: "silu", SwishBeta.name: "silu", HardSwishFromHardSigmoid.name: "hardswish",
                **{n: "hardswish" for n in HardSwishRelu6().variant_names()}}


__all__ = ["FuseActivations", "HardSwishFromHardSigmoid", "HardSwishRelu6", "SiLU"]
