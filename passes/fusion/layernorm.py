"""fuse-layernorm: LayerNorm, SkipLayerNorm and RMSNorm from their decomposed forms (canonical ops)."""

from __future__ import annotations

import logging

from passctl.ir import Value
from passctl.dialect.canonical import DOMAIN
from passctl.passes.fusion.fusion_set import FusionRuleSet, make_variants
from passctl.passes.fusion.norm_checks import check_epsilon, check_param, check_reductions
from passctl.passes.fusion.norm_checks import param_vector as _param
from passctl.passes.registry import register_pass
from passctl.passes.rewrite import AttrVar, MatchResult, RewriteRule, RuleContext, register_rule

logger = logging.getLogger(__name__)

_VARIANTS = {"square": ("pow", "mul"), "normalize": ("div", "reciprocal"),
             "axes": ("axes-attr", "axes-input")}


def _mean(op, v, axes, axes_form):
    """ReduceMean over ``axes``: an attribute (opset < 18) or a second input (opset >= 18)."""
    return op.ReduceMean(v, axes) if axes_form == "axes-input" else op.ReduceMean(v)


def _square(op, v, form):
    return op.Pow(v, 2.0) if form == "pow" else op.Mul(v, v)


def _normalize(op, v, std, form):
    return op.Div(v, std) if form == "div" else op.Mul(v, op.Reciprocal(std))


def _float_eps(context: RuleContext, eps: Value, what: str):
    value, ok = check_epsilon(context, eps, what)
    if ok and context.constant(eps).dtype.kind != "f":
        return None, MatchResult().fail(f"{what}: epsilon '{eps.name}' is not floating point")
    return value, ok


class _LayerNormCore(RewriteRule):
    """Rule 1 (one per exporter variant): ``(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps)`` ->
    ``passctl::LayerNorm(x, epsilon=eps)``.

    Variants: the square as ``Pow(d, 2)`` or ``Mul(d, d)``; the division as ``Div(d, std)`` or
    ``Mul(d, Reciprocal(std))``; ReduceMean's axes as attribute (opset < 18) or input (>= 18).
    Check: both ReduceMeans keep dims and reduce the last axis only; eps is a scalar float constant.
    Math: Ba et al. 2016 (Layer Normalization), biased variance as in ONNX LayerNormalization-17.
    """

    commute = True
    square = normalize = axes = ""

    def pattern(self, op, x, eps, axes1, axes2):
        mean = _mean(op, x, axes1, self.axes)
        d = op.Sub(x, mean)
        var = _mean(op, _square(op, d, self.square), axes2, self.axes)
        return _normalize(op, d, op.Sqrt(op.Add(var, eps)), self.normalize)

    def check(self, context, x, eps, **_):
        ok = check_reductions(context, x, "LayerNorm")
        if not ok:
            return ok
        return _float_eps(context, eps, "LayerNorm")[1]

    def rewrite(self, op, x, eps, **_):
        value = float(RuleContext.constant(eps).reshape(-1)[0])
        return op.LayerNorm(x, _domain=DOMAIN, axis=-1, epsilon=value)


class _RMSNormCore(RewriteRule):
    """Rule 2 (one per exporter variant): ``x / sqrt(mean(x^2) + eps)`` -> ``passctl::RMSNorm(x)``.

    LLaMA's ``x * rsqrt(mean(x^2) + eps)`` exports as ``Mul(x, Reciprocal(Sqrt(...)))``. Variants and
    check as rule 1. Math: Zhang & Sennrich 2019 (Root Mean Square Layer Normalization).
    """

    commute = True
    square = normalize = axes = ""

    def pattern(self, op, x, eps, axes1):
        ms = _mean(op, _square(op, x, self.square), axes1, self.axes)
        return _normalize(op, x, op.Sqrt(op.Add(ms, eps)), self.normalize)

    def check(self, context, x, eps, **_):
        ok = check_reductions(context, x, "RMSNorm")
        if not ok:
            return ok
        return _float_eps(context, eps, "RMSNorm")[1]

    def rewrite(self, op, x, eps, **_):
        value = float(RuleContext.constant(eps).reshape(-1)[0])
        return op.RMSNorm(x, _domain=DOMAIN, axis=-1, epsilon=value)


LAYERNORM_CORE = make_variants(_LayerNormCore, "layernorm", _VARIANTS,
                               lambda c: f"decomposed LayerNorm ({', '.join(c.values())}) -> passctl::LayerNorm")
RMSNORM_CORE = make_variants(_RMSNormCore, "rmsnorm", _VARIANTS,
                             lambda c: f"decomposed RMSNorm ({', '.join(c.values())}) -> passctl::RMSNorm")


def _norm_attrs():
    return {"axis": AttrVar("axis"), "epsilon": AttrVar("epsilon")}


@register_rule
class LayerNormScale(RewriteRule):
    """Rule 3: ``Mul(passctl::LayerNorm(x), scale)`` -> ``passctl::LayerNorm(x, scale)``; scale must
    broadcast to the normalized shape ``[D]`` only (``[D]``, ``[1, D]``, ``[1]``...)."""

    name = "layernorm-scale"
    summary = "Mul by a [D] scale absorbed into passctl::LayerNorm"
    commute = True
    op_type = "LayerNorm"

    def pattern(self, op, x, scale):
        return op.Mul(op.op(self.op_type, x, _domain=DOMAIN, **_norm_attrs()), scale)

    def check(self, context, x, scale, **_):
        return check_param(context, x, scale, "scale", self.op_type)[1]

    def rewrite(self, op, x, scale, axis, epsilon):
        return op.op(self.op_type, x, _param(op, x, scale), _domain=DOMAIN, axis=axis, epsilon=epsilon)


@register_rule
class RMSNormScale(LayerNormScale):
    """Rule 4: ``Mul(passctl::RMSNorm(x), weight)`` -> ``passctl::RMSNorm(x, weight)`` (as rule 3)."""

    name = "rmsnorm-scale"
    summary = "Mul by a [D] weight absorbed into passctl::RMSNorm"
    op_type = "RMSNorm"


@register_rule
class LayerNormBias(RewriteRule):
    """Rule 5: ``Add(passctl::LayerNorm(x, scale), bias)`` -> ``passctl::LayerNorm(x, scale, bias)``;
    bias must broadcast to ``[D]`` only."""

    name = "layernorm-bias"
    summary = "Add of a [D] bias absorbed into passctl::LayerNorm"
    commute = True

    def pattern(self, op, x, scale, bias):
        return op.Add(op.LayerNorm(x, scale, _domain=DOMAIN, **_norm_attrs()), bias)

    def check(self, context, x, bias, **_):
        return check_param(context, x, bias, "bias", "LayerNorm")[1]

    def rewrite(self, op, x, scale, bias, axis, epsilon):
        return op.LayerNorm(x, scale, _param(op, x, bias), _domain=DOMAIN, axis=axis, epsilon=epsilon)


@register_rule
class LayerNormFromOnnx(RewriteRule):
    """Rule 6: standard ``LayerNormalization(x, scale[, bias])`` over the last axis, one output, fp32
    statistics (``stash_type`` 1) -> ``passctl::LayerNorm`` (the same math), so that rule 7 can fuse
    a residual Add into it. Lowering writes it back as ``LayerNormalization``."""

    name = "layernorm-from-onnx"
    summary = "standard LayerNormalization -> passctl::LayerNorm"

    def pattern(self, op, x, scale, bias):
        return op.LayerNormalization(x, scale, bias, axis=AttrVar("axis", default=-1),
                                     epsilon=AttrVar("epsilon", default=1e-5),
                                     stash_type=AttrVar("stash_type", default=1))

    def check(self, context, x, axis, stash_type, **_):
        if len(context.root.outputs) != 1:
            return MatchResult().fail("LayerNormalization also writes Mean / InvStdDev outputs")
        rank = None if x.shape is None else x.shape.rank
        if not (axis == -1 or (rank is not None and axis == rank - 1)):
            return MatchResult().fail(f"LayerNormalization axis={axis} is not the last axis")
        if stash_type != 1:
            return MatchResult().fail(f"LayerNormalization stash_type={stash_type} (statistics not in fp32)")
        return MatchResult()

    def rewrite(self, op, x, scale, bias, epsilon, **_):
        return op.LayerNorm(x, scale, bias, _domain=DOMAIN, axis=-1, epsilon=float(epsilon))


@register_rule
class LayerNormFromOnnxNoBias(LayerNormFromOnnx):
    name = "layernorm-from-onnx-no-bias"

    def pattern(self, op, x, scale):
        return op.LayerNormalization(x, scale, axis=AttrVar("axis", default=-1),
                                     epsilon=AttrVar("epsilon", default=1e-5),
                                     stash_type=AttrVar("stash_type", default=1))

    def rewrite(self, op, x, scale, epsilon, **_):
        return op.LayerNorm(x, scale, _domain=DOMAIN, axis=-1, epsilon=float(epsilon))


def _same_shape(a: Value, b: Value) -> bool:
    """Ranks equal and no dimension known to differ (a static 1 against another size differs)."""
    if a.shape is None or b.shape is None or a.shape.rank != b.shape.rank:
        return False
    return all(x == y or (x is None and y != 1) or (y is None and x != 1) for x, y in zip(a.shape, b.shape))


class _SkipLayerNorm(RewriteRule):
    """Rule 7: ``passctl::LayerNorm(Add(Add(x, bias), skip), ...)`` (``with_bias``) or
    ``passctl::LayerNorm(Add(x, skip), ...)`` -> ``passctl::SkipLayerNorm(x, skip, scale, B, bias)``.

    One variant per LayerNorm arity (``x``; ``x, scale``; ``x, scale, B``). Check: x and skip have the
    same shape (a residual connection), bias broadcasts to ``[D]``. The Add's output must have no
    other consumer (the rule engine refuses that match: a pre-norm residual stream keeps its Add).
    """

    commute = True
    arity = "1"
    bias = ""

    def pattern(self, op, x, skip, bias, scale, beta):
        s = op.Add(op.Add(x, bias), skip) if self.bias == "bias" else op.Add(x, skip)
        params = [scale, beta][: int(self.arity) - 1]
        return op.LayerNorm(s, *params, _domain=DOMAIN, **_norm_attrs())

    def check(self, context, x, skip, bias=None, **_):
        if not _same_shape(x, skip):
            return MatchResult().fail(f"SkipLayerNorm: shapes of '{x.name}' ({x.shape}) and '{skip.name}' "
                                      f"({skip.shape}) are not known to be equal (run infer-shapes)")
        if bias is not None:
            return check_param(context, x, bias, "bias", "SkipLayerNorm")[1]
        return MatchResult()

    def rewrite(self, op, x, skip, epsilon, bias=None, scale=None, beta=None, **_):
        b = None if bias is None else _param(op, x, bias)
        ins = [x, skip, scale, beta, b]
        while ins[-1] is None:
            ins.pop()
        return op.SkipLayerNorm(*ins, _domain=DOMAIN, epsilon=epsilon)


SKIP_LAYERNORM = make_variants(_SkipLayerNorm, "skip-layernorm", {"bias": ("bias", "nobias"),
                                                                  "arity": ("1", "2", "3")},
                               lambda c: "residual Add (+ bias Add) + passctl::LayerNorm -> "
                                         "passctl::SkipLayerNorm")


@register_rule
class RMSNormCastIn(RewriteRule):
    """Rule 8: ``passctl::RMSNorm(Cast(x, to=T))`` where x already has type T -> ``RMSNorm(x)``
    (transformers writes ``hidden_states.to(torch.float32)`` even for fp32 models)."""

    name = "rmsnorm-cast-noop"
    summary = "drop a Cast to the input's own type in front of passctl::RMSNorm"

    def pattern(self, op, x):
        return op.RMSNorm(op.Cast(x, to=AttrVar("to")), _domain=DOMAIN, **_norm_attrs())

    def check(self, context, x, to, **_):
        if x.dtype is None or int(x.dtype) != to:
            return MatchResult().fail(f"Cast changes the type of '{x.name}' ({x.dtype} to {to}); "
                                      "RMSNorm in another precision than the model is not fused")
        return MatchResult()

    def rewrite(self, op, x, axis, epsilon, **_):
        return op.RMSNorm(x, _domain=DOMAIN, axis=axis, epsilon=epsilon)


_FAMILIES = {**{r.name: "layernorm" for r in LAYERNORM_CORE},
             **{r.name: "rmsnorm" for r in RMSNORM_CORE},
             **{r.name: "skip_layernorm" for r in SKIP_LAYERNORM},
             **{r.name: "from_onnx" for r in (LayerNormFromOnnx, LayerNormFromOnnxNoBias)}}


@register_pass
class FuseLayerNorm(FusionRuleSet):
    """LayerNorm, SkipLayerNorm and RMSNorm from their decomposed forms, as canonical passctl ops.

    Rules (see each class): 1 ``layernorm-*`` (8 variants), 2 ``rmsnorm-*`` (8 variants),
    3 ``layernorm-scale``, 4 ``rmsnorm-scale``, 5 ``layernorm-bias``, 6 ``layernorm-from-onnx``,
    7 ``skip-layernorm-*`` (6 variants), 8 ``rmsnorm-cast-noop``. The rules build up the fused op
    step by step (core, then scale, then bias, then residual), so a model's scale or bias that does not
    broadcast to ``[D]`` leaves a correct LayerNorm without it, and ``passctl explain RULE`` says why.
    The output is canonical (``passctl::`` ops, :mod:`passctl.passes.fusion.canonical`): run
    ``lower-onnxruntime`` or ``lower-standard`` before emitting.

    Statistics: ``layernorm`` (decomposed LayerNorms fused), ``rmsnorm``, ``skip_layernorm`` (residual
    Adds fused), ``from_onnx`` (standard LayerNormalization adopted), and the count per rule.
    """

    name = "fuse-layernorm"
    summary = "Fuse decomposed LayerNorm / SkipLayerNorm / RMSNorm into canonical passctl ops"
    RULES = (*LAYERNORM_CORE, *RMSNORM_CORE, LayerNormScale, RMSNormScale, LayerNormBias,
             LayerNormFromOnnx, LayerNormFromOnnxNoBias, *SKIP_LAYERNORM, RMSNormCastIn)
    FAMILIES = _FAMILIES


__all__ = ["FuseLayerNorm", "LAYERNORM_CORE", "RMSNORM_CORE", "SKIP_LAYERNORM"]
