"""fuse-gelu: GELU from its erf and tanh forms, and BiasGelu, as canonical passctl::Gelu."""

from __future__ import annotations

import logging
import math

from passctl.dialect.canonical import DOMAIN
from passctl.passes.fusion.fusion_set import FusionRuleSet, make_variants
from passctl.passes.fusion.norm_checks import check_param, param_vector
from passctl.passes.registry import register_pass
from passctl.passes.rewrite import AttrVar, ConstantPattern, MatchResult, RewriteRule, register_rule

logger = logging.getLogger(__name__)

# Constants as exporters write them in float32 (or float64): matched within this relative tolerance,
# or within the rounding of the constant's own dtype when that is coarser (ConstantPattern).
_RTOL = 1e-6
SQRT2 = ConstantPattern(math.sqrt(2.0), rtol=_RTOL)
INV_SQRT2 = ConstantPattern(1.0 / math.sqrt(2.0), rtol=_RTOL)
SQRT_2_OVER_PI = ConstantPattern(math.sqrt(2.0 / math.pi), rtol=_RTOL)
KAPPA = ConstantPattern(0.044715, rtol=_RTOL)


def _outer(op, x, one_plus, form):
    """``0.5 * x * one_plus`` in the three association orders exporters write (commute covers the
    operand order of each Mul):

    - ``half-x``: ``Mul(Mul(x, 0.5), h)`` (transformers' ``x * 0.5 * (1 + ...)``)
    - ``x-h``: ``Mul(Mul(x, h), 0.5)`` (torch's legacy exporter for ``F.gelu``)
    - ``half-h``: ``Mul(x, Mul(h, 0.5))`` (torch's dynamo exporter / onnxscript)
    """
    if form == "half-x":
        return op.Mul(op.Mul(x, 0.5), one_plus)
    if form == "x-h":
        return op.Mul(op.Mul(x, one_plus), 0.5)
    return op.Mul(x, op.Mul(one_plus, 0.5))


class _GeluCore(RewriteRule):
    """Rules 1-2 (one per exporter variant): the GELU formula -> ``passctl::Gelu(x, approximate)``.

    Erf form (``approximate="none"``): ``0.5 * x * (1 + erf(x / sqrt(2)))``, the division written as
    ``Div(x, sqrt(2))`` or ``Mul(x, 1/sqrt(2))``. Tanh form (``approximate="tanh"``, FastGelu):
    ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))``, the cube written as ``Pow(x, 3)`` or
    ``Mul(x, Mul(x, x))``. Constants match within 1e-6 relative, or within their own dtype's
    rounding (an fp16 sqrt(2) is 1.4140625).
    Math: Hendrycks & Gimpel 2016 (Gaussian Error Linear Units), ONNX Gelu-20.
    """

    commute = True
    outer = inner = ""

    def pattern(self, op, x):
        if self.inner in ("div", "mul"):
            scaled = op.Div(x, SQRT2) if self.inner == "div" else op.Mul(x, INV_SQRT2)
            t = op.Erf(scaled)
        else:
            cube = op.Pow(x, 3.0) if self.inner == "pow" else op.Mul(x, op.Mul(x, x))
            t = op.Tanh(op.Mul(op.Add(x, op.Mul(cube, KAPPA)), SQRT_2_OVER_PI))
        return _outer(op, x, op.Add(t, 1.0), self.outer)

    def check(self, context, x):
        if x.dtype is not None and not x.dtype.is_floating:
            return MatchResult().fail(f"Gelu: '{x.name}' is not floating point ({x.dtype})")
        return MatchResult()

    def rewrite(self, op, x):
        approximate = "none" if self.inner in ("div", "mul") else "tanh"
        return op.Gelu(x, _domain=DOMAIN, approximate=approximate)


_OUTER = ("half-x", "x-h", "half-h")
GELU_ERF = make_variants(_GeluCore, "gelu-erf", {"inner": ("div", "mul"), "outer": _OUTER},
                         lambda c: f"0.5*x*(1+erf(x/sqrt2)) ({c['inner']}, {c['outer']}) -> passctl::Gelu")
GELU_TANH = make_variants(_GeluCore, "gelu-tanh", {"inner": ("pow", "cube"), "outer": _OUTER},
                          lambda c: f"tanh-approximated GELU ({c['inner']}, {c['outer']}) -> passctl::Gelu")


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


@register_pass
class FuseGelu(FusionRuleSet):
    """GELU (erf form), FastGelu (tanh form) and BiasGelu as canonical ``passctl::Gelu``.

    Rules: 1 ``gelu-erf-*`` (6 variants), 2 ``gelu-tanh-*`` (6 variants), 3 ``gelu-bias``. Lower with
    ``lower-onnxruntime`` (com.microsoft Gelu / BiasGelu / FastGelu) or ``lower-standard`` (Gelu-20 or
    the formula).

    Statistics: ``gelu`` (erf form), ``fast_gelu`` (tanh form), ``bias_gelu`` (biases absorbed), and
    the count per rule.
    """

    name = "fuse-gelu"
    summary = "Fuse the erf / tanh GELU formulas (and a preceding bias Add) into canonical passctl::Gelu"
    RULES = (*GELU_ERF, *GELU_TANH, GeluBias)
    FAMILIES = {**{r.name: "gelu" for r in GELU_ERF}, **{r.name: "fast_gelu" for r in GELU_TANH},
                GeluBias.name: "bias_gelu"}


__all__ = ["FuseGelu", "GELU_ERF", "GELU_TANH", "GeluBias"]
