"""fuse-gelu: GELU from its erf and tanh forms, and BiasGelu, as canonical passctl::Gelu."""

from __future__ import annotations

import logging
import math

from passctl.dialect.canonical import DOMAIN
from passctl.passes.fusion.fusion_set import FusionRuleSet
from passctl.passes.fusion.norm_checks import check_param, param_vector
from passctl.passes.registry import register_pass
from passctl.passes.rewrite import AttrVar, ConstantPattern, MatchResult, Or, RewriteRule, register_rule

logger = logging.getLogger(__name__)

# Constants as exporters write them in float32 (or float64): matched within this relative tolerance,
# or within the rounding of the constant's own dtype when that is coarser (ConstantPattern).
_RTOL = 1e-6
SQRT2 = ConstantPattern(math.sqrt(2.0), rtol=_RTOL)
INV_SQRT2 = ConstantPattern(1.0 / math.sqrt(2.0), rtol=_RTOL)
SQRT_2_OVER_PI = ConstantPattern(math.sqrt(2.0 / math.pi), rtol=_RTOL)
KAPPA = ConstantPattern(0.044715, rtol=_RTOL)


def _outer(op, x, one_plus):
    """``0.5 * x * one_plus`` in the three association orders exporters write (commute covers the
    operand order of each Mul), as alternatives named ``outer``:

    - ``half-x``: ``Mul(Mul(x, 0.5), h)`` (transformers' ``x * 0.5 * (1 + ...)``)
    - ``x-h``: ``Mul(Mul(x, h), 0.5)`` (torch's legacy exporter for ``F.gelu``)
    - ``half-h``: ``Mul(x, Mul(h, 0.5))`` (torch's dynamo exporter / onnxscript)
    """
    return Or(op.Mul(op.Mul(x, 0.5), one_plus), op.Mul(op.Mul(x, one_plus), 0.5),
              op.Mul(x, op.Mul(one_plus, 0.5)), name="outer", labels=_OUTER)


_OUTER = ("half-x", "x-h", "half-h")


class GeluFormula(RewriteRule):
    """Rules 1-2: the GELU formula -> ``passctl::Gelu(x, approximate)``; one rule object per form.

    Erf form (``gelu-erf``, ``approximate="none"``): ``0.5 * x * (1 + erf(x / sqrt(2)))``, the
    division written as ``Div(x, sqrt(2))`` or ``Mul(x, 1/sqrt(2))`` (alternatives ``div`` / ``mul``).
    Tanh form (``gelu-tanh``, ``approximate="tanh"``, FastGelu): ``0.5 * x * (1 + tanh(sqrt(2/pi) *
    (x + 0.044715 * x^3)))``, the cube written as ``Pow(x, 3)`` or ``Mul(x, Mul(x, x))`` (``pow`` /
    ``cube``). With the three outer forms (:func:`_outer`) a fusion counts as
    ``gelu-erf-<inner>-<outer>`` / ``gelu-tanh-<inner>-<outer>``, the names of the former
    one-rule-per-variant classes (aliases of these two). Constants match within 1e-6 relative, or
    within their own dtype's rounding (an fp16 sqrt(2) is 1.4140625).
    Math: Hendrycks & Gimpel 2016 (Gaussian Error Linear Units), ONNX Gelu-20.

    Args:
        form: ``"erf"`` or ``"tanh"``.
    """

    commute = True

    def __init__(self, form: str):
        self.form = form
        self.name = f"gelu-{form}"
        self.variant = self.name + "-{inner}-{outer}"
        self.summary = ("0.5*x*(1+erf(x/sqrt2)) -> passctl::Gelu" if form == "erf"
                        else "tanh-approximated GELU -> passctl::Gelu")
        super().__init__()

    def pattern(self, op, x):
        if self.form == "erf":
            t = op.Erf(Or(op.Div(x, SQRT2), op.Mul(x, INV_SQRT2), name="inner", labels=("div", "mul")))
        else:
            cube = Or(op.Pow(x, 3.0), op.Mul(x, op.Mul(x, x)), name="inner", labels=("pow", "cube"))
            t = op.Tanh(op.Mul(op.Add(x, op.Mul(cube, KAPPA)), SQRT_2_OVER_PI))
        return _outer(op, x, op.Add(t, 1.0))

    def check(self, context, x):
        if x.dtype is not None and not x.dtype.is_floating:
            return MatchResult().fail(f"Gelu: '{x.name}' is not floating point ({x.dtype})")
        return MatchResult()

    def rewrite(self, op, x):
        approximate = "none" if self.form == "erf" else "tanh"
        return op.Gelu(x, _domain=DOMAIN, approximate=approximate)


gelu_erf = register_rule(GeluFormula("erf"))
gelu_tanh = register_rule(GeluFormula("tanh"))


@register_rule
class GeluBias(RewriteRule):
    """Rule 3 (BiasGelu / FastGelu with bias): ``passctl::Gelu(Add(x, bias))`` with a ``[D]`` bias
    (a Linear layer's bias) -> ``passctl::Gelu(x, bias)``. A bias that broadcasts over other axes, or
    a non-constant addend without shape ``[D]`` (a residual), is refused."""

    name = "gelu-bias"
    summary = "Add of a [D] bias absorbed into passctl::Gelu (BiasGelu)"
    commute = True

    def pattern(self, op, x, bias):
        return op.Gelu(op.Add(x, bias), _domain=DOMAIN, approximate=AttrVar("approximate", default="none"))

    def check(self, context, x, bias, **_):
        return check_param(context, x, bias, "bias", "BiasGelu")[1]

    def rewrite(self, op, x, bias, approximate):
        return op.Gelu(x, param_vector(op, x, bias), _domain=DOMAIN, approximate=approximate)


@register_rule
class GeluBiasFromOnnx(RewriteRule):
    """Rule 4 (BiasGelu from ONNX's op): standard ``Gelu(Add(x, bias), approximate)`` (Gelu-20, as
    the dynamo exporter and onnxscript write ``F.gelu`` from opset 20 on) with a ``[D]`` bias ->
    ``passctl::Gelu(x, bias, approximate)``, which lowers to ONNX Runtime's BiasGelu / FastGelu
    with bias (or back to Add + Gelu-20 for standard ONNX). A Gelu without such an Add stays the
    standard op (nothing to gain). The bias is checked as in rule 3."""

    name = "gelu-bias-from-onnx"
    summary = "Gelu-20(Add(x, [D] bias)) -> passctl::Gelu(x, bias) (BiasGelu)"
    commute = True

    def pattern(self, op, x, bias):
        return op.Gelu(op.Add(x, bias), approximate=AttrVar("approximate", default="none"))

    def check(self, context, x, bias, approximate, **_):
        if approximate not in ("none", "tanh"):
            return MatchResult().fail(f"Gelu approximate={approximate!r} is neither 'none' nor 'tanh'")
        if x.dtype is not None and not x.dtype.is_floating:
            return MatchResult().fail(f"Gelu: '{x.name}' is not floating point ({x.dtype})")
        return check_param(context, x, bias, "bias", "BiasGelu")[1]

    def rewrite(self, op, x, bias, approximate):
        return op.Gelu(x, param_vector(op, x, bias), _domain=DOMAIN, approximate=approximate)


@register_pass
class FuseGelu(FusionRuleSet):
    """GELU (erf form), FastGelu (tanh form) and BiasGelu as canonical ``passctl::Gelu``.

    Rules: 1 ``gelu-erf`` (6 variants as alternatives), 2 ``gelu-tanh`` (6), 3 ``gelu-bias``, 4
    ``gelu-bias-from-onnx`` (ONNX Gelu-20 after a bias Add). Lower with
    ``lower-onnxruntime`` (com.microsoft Gelu / BiasGelu / FastGelu) or ``lower-standard`` (Gelu-20 or
    the formula).

    Statistics: ``gelu`` (erf form), ``fast_gelu`` (tanh form), ``bias_gelu`` (biases absorbed, rules
    3 and 4), and
    the count per variant (``gelu-erf-div-x-h``, ...).
    """

    name = "fuse-gelu"
    summary = "Fuse the erf / tanh GELU formulas (and a preceding bias Add) into canonical passctl::Gelu"
    RULES = (gelu_erf, gelu_tanh, GeluBias, GeluBiasFromOnnx)
    FAMILIES = {**{n: "gelu" for n in gelu_erf.variant_names()},
                **{n: "fast_gelu" for n in gelu_tanh.variant_names()}, GeluBias.name: "bias_gelu",
                GeluBiasFromOnnx.name: "bias_gelu"}


__all__ = ["FuseGelu", "GeluBias", "GeluBiasFromOnnx", "GeluFormula", "gelu_erf", "gelu_tanh"]
