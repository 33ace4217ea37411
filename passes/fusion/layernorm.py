"""fuse-layernorm: LayerNorm, SkipLayerNorm and RMSNorm from their decomposed forms (canonical ops)."""

from __future__ import annotations

import logging

from passctl.ir import Value
from passctl.dialect.canonical import DOMAIN
from passctl.passes.fusion.fusion_set import FusionRuleSet
from passctl.passes.fusion.norm_checks import check_epsilon, check_param, check_reductions
from passctl.passes.fusion.norm_checks import param_vector as _param
from passctl.passes.registry import register_pass
from passctl.passes.rewrite import AttrVar, MatchResult, Opt, Or, RewriteRule, RuleContext, register_rule

logger = logging.getLogger(__name__)

def _mean(op, v, axes):
    """ReduceMean over ``axes``: an attribute (opset < 18) or a second input (opset >= 18); every
    ReduceMean of one match is written alike (the alternatives share the name ``axes``)."""
    return Or(op.ReduceMean(v), op.ReduceMean(v, axes), name="axes", labels=("axes-attr", "axes-input"))


def _square(op, v):
    return Or(op.Pow(v, 2.0), op.Mul(v, v), name="square", labels=("pow", "mul"))


def _normalize(op, v, var_eps):
    """``v / sqrt(var_eps)`` as exporters write it: ``Div(v, Sqrt(.))``; ``Mul(v, Reciprocal(Sqrt(.)))``
    (the dynamo exporter's ``rsqrt``); ``Mul(v, Div(1, Sqrt(.)))`` (the legacy TorchScript
    exporter's ``rsqrt``); ``Mul(v, Pow(., -0.5))`` (``torch.pow(var + eps, -0.5)``)."""
    std = op.Sqrt(var_eps)
    return Or(op.Div(v, std), op.Mul(v, op.Reciprocal(std)), op.Mul(v, op.Div(1.0, std)),
              op.Mul(v, op.Pow(var_eps, -0.5)),
              name="normalize", labels=("div", "reciprocal", "div-one", "pow-half"))


def _float_eps(context: RuleContext, eps: Value, what: str):
    value, ok = check_epsilon(context, eps, what)
    if ok and context.constant(eps).dtype.kind != "f":
        return None, MatchResult().fail(f"{what}: epsilon '{eps.name}' is not floating point")
    return value, ok


@register_rule
class LayerNormDecomposed(RewriteRule):
    """Rule 1: ``(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps)`` -> ``passctl::LayerNorm(x,
    epsilon=eps)``.

    Alternatives (the exporters' ways; a fusion counts as ``layernorm-<square>-<normalize>-<axes>``,
    the names of the former one-rule-per-variant classes): the square as ``Pow(d, 2)`` or
    ``Mul(d, d)``; the division as ``Div(d, std)``, ``Mul(d, Reciprocal(std))`` or
    ``Mul(d, Div(1, std))`` (``div-one``, the legacy exporter's rsqrt) or ``Mul(d, Pow(var + eps,
    -0.5))`` (``pow-half``); ReduceMean's axes
    as attribute (opset < 18) or input (>= 18).
    Check: both ReduceMeans keep dims and reduce the last axis only; eps is a scalar float constant.
    Math: Ba et al. 2016 (Layer Normalization), biased variance as in ONNX LayerNormalization-17.
    """

    name = "layernorm-decomposed"
    summary = "decomposed LayerNorm -> passctl::LayerNorm (counted as layernorm-<square>-<normalize>-<axes>)"
    variant = "layernorm-{square}-{normalize}-{axes}"
    commute = True

    def pattern(self, op, x, eps, axes1, axes2):
        d = op.Sub(x, _mean(op, x, axes1))
        var = _mean(op, _square(op, d), axes2)
        return _normalize(op, d, op.Add(var, eps))

    def check(self, context, x, eps, **_):
        ok = check_reductions(context, x, "LayerNorm")
        if not ok:
            return ok
        return _float_eps(context, eps, "LayerNorm")[1]

    def rewrite(self, op, x, eps, **_):
        value = float(RuleContext.constant(eps).reshape(-1)[0])
        return op.LayerNorm(x, _domain=DOMAIN, axis=-1, epsilon=value)


@register_rule
class RMSNormDecomposed(RewriteRule):
    """Rule 2: ``x / sqrt(mean(x^2) + eps)`` -> ``passctl::RMSNorm(x)``.

    LLaMA's ``x * rsqrt(mean(x^2) + eps)`` exports as ``Mul(x, Reciprocal(Sqrt(...)))`` (dynamo) or
    ``Mul(x, Div(1, Sqrt(...)))`` (the legacy TorchScript exporter). Alternatives (counted as
    ``rmsnorm-<square>-<normalize>-<axes>``) and check as rule 1. Math: Zhang & Sennrich
    2019 (Root Mean Square Layer Normalization).
    """

    name = "rmsnorm-decomposed"
    summary = "decomposed RMSNorm -> passctl::RMSNorm (counted as rmsnorm-<square>-<normalize>-<axes>)"
    variant = "rmsnorm-{square}-{normalize}-{axes}"
    commute = True

    def pattern(self, op, x, eps, axes1):
        ms = _mean(op, _square(op, x), axes1)
        return _normalize(op, x, op.Add(ms, eps))

    def check(self, context, x, eps, **_):
        ok = check_reductions(context, x, "RMSNorm")
        if not ok:
            return ok
        return _float_eps(context, eps, "RMSNorm")[1]

    def rewrite(self, op, x, eps, **_):
        value = float(RuleContext.constant(eps).reshape(-1)[0])
        return op.RMSNorm(x, _domain=DOMAIN, axis=-1, epsilon=value)


def _norm_attrs():
    return {"axis": AttrVar("axis"), "epsilon": AttrVar("epsilon")}


@register_rule
class NormScale(RewriteRule):
    """Rules 3 and 4: ``Mul(passctl::LayerNorm(x), scale)`` -> ``passctl::LayerNorm(x, scale)`` and
    ``Mul(passctl::RMSNorm(x), weight)`` -> ``passctl::RMSNorm(x, weight)`` (counted as
    ``layernorm-scale`` / ``rmsnorm-scale``); the scale must broadcast to the normalized shape ``[D]``
    only (``[D]``, ``[1, D]``, ``[1]``...)."""

    name = "norm-scale"
    summary = "Mul by a [D] scale absorbed into passctl::LayerNorm / RMSNorm (layernorm-scale, rmsnorm-scale)"
    aliases = ("layernorm-scale", "rmsnorm-scale")
    commute = True

    def pattern(self, op, x, scale):
        norm = Or(op.LayerNorm(x, _domain=DOMAIN, _name="norm", **_norm_attrs()),
                  op.RMSNorm(x, _domain=DOMAIN, _name="norm", **_norm_attrs()))
        return op.Mul(norm, scale)

    def reported_name(self, bindings):
        return f"{bindings['norm'].op_type.lower()}-scale"

    def check(self, context, x, scale, norm):
        return check_param(context, x, scale, "scale", norm.op_type)[1]

    def rewrite(self, op, x, scale, norm, axis, epsilon):
        return op.op(norm.op_type, x, _param(op, x, scale), _domain=DOMAIN, axis=axis, epsilon=epsilon)


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
    a residual Add into it. Lowering writes it back as ``LayerNormalization``. Counted as
    ``layernorm-from-onnx``, or ``layernorm-from-onnx-no-bias`` without a bias."""

    name = "layernorm-from-onnx"
    summary = "standard LayerNormalization -> passctl::LayerNorm"
    aliases = ("layernorm-from-onnx-no-bias",)

    def pattern(self, op, x, scale, bias):
        return op.LayerNormalization(x, scale, Opt(bias), axis=AttrVar("axis", default=-1),
                                     epsilon=AttrVar("epsilon", default=1e-5),
                                     stash_type=AttrVar("stash_type", default=1))

    def reported_name(self, bindings):
        return self.name if bindings["bias"] is not None else "layernorm-from-onnx-no-bias"

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
        ins = [x, scale] if bias is None else [x, scale, bias]
        return op.LayerNorm(*ins, _domain=DOMAIN, axis=-1, epsilon=float(epsilon))


def _same_shape(a: Value, b: Value) -> bool:
    """Ranks equal and no dimension known to differ (a static 1 against another size differs)."""
    if a.shape is None or b.shape is None or a.shape.rank != b.shape.rank:
        return False
    return all(x == y or (x is None and y != 1) or (y is None and x != 1) for x, y in zip(a.shape, b.shape))


@register_rule
class SkipLayerNorm(RewriteRule):
    """Rule 7: ``passctl::LayerNorm(Add(Add(x, bias), skip), ...)`` or ``passctl::LayerNorm(Add(x,
    skip), ...)`` -> ``passctl::SkipLayerNorm(x, skip, scale, B, bias)``.

    Alternatives: with or without the bias Add, and the LayerNorm's arity (``x``; ``x, scale``;
    ``x, scale, B``); counted as ``skip-layernorm-<bias|nobias>-<arity>``. Check: x and skip have the
    same shape (a residual connection), bias broadcasts to ``[D]``. The Add's output must have no
    other consumer (the rule engine refuses that match: a pre-norm residual stream keeps its Add).
    """

    name = "skip-layernorm"
    summary = ("residual Add (+ bias Add) + passctl::LayerNorm -> passctl::SkipLayerNorm "
               "(counted as skip-layernorm-<bias|nobias>-<arity>)")
    variant = "skip-layernorm-{with_bias}-{arity}"
    commute = True

    def pattern(self, op, x, skip, bias, scale, beta):
        s = Or(op.Add(op.Add(x, bias), skip), op.Add(x, skip), name="with_bias", labels=("bias", "nobias"))
        return Or(op.LayerNorm(s, _domain=DOMAIN, **_norm_attrs()),
                  op.LayerNorm(s, scale, _domain=DOMAIN, **_norm_attrs()),
                  op.LayerNorm(s, scale, beta, _domain=DOMAIN, **_norm_attrs()),
                  name="arity", labels=("1", "2", "3"))

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


_FAMILIES = {**{n: "layernorm" for n in LayerNormDecomposed().variant_names()},
             **{n: "rmsnorm" for n in RMSNormDecomposed().variant_names()},
             **{n: "skip_layernorm" for n in SkipLayerNorm().variant_names()},
             **{n: "from_onnx" for n in ("layernorm-from-onnx", "layernorm-from-onnx-no-bias")}}


@register_pass
class FuseLayerNorm(FusionRuleSet):
    """LayerNorm, SkipLayerNorm and RMSNorm from their decomposed forms, as canonical passctl ops.

    Rules (see each class): 1 ``layernorm-decomposed`` (16 variants as alternatives), 2
    ``rmsnorm-decomposed`` (16), 3 and 4 ``norm-scale``, 5 ``layernorm-bias``, 6
    ``layernorm-from-onnx``, 7 ``skip-layernorm`` (6), 8 ``rmsnorm-cast-noop``. The rules build up the
    fused op step by step (core, then scale, then bias, then residual), so a model's scale or bias
    that does not broadcast to ``[D]`` leaves a correct LayerNorm without it, and ``passctl explain
    RULE`` says why (the variant names, e.g. ``layernorm-pow-div-axes-attr``, name their rule there).
    The output is canonical (``passctl::`` ops, :mod:`passctl.dialect.canonical`): run
    ``lower-onnxruntime`` or ``lower-standard`` before emitting.

    Statistics: ``layernorm`` (decomposed LayerNorms fused), ``rmsnorm``, ``skip_layernorm`` (residual
    Adds fused), ``from_onnx`` (standard LayerNormalization adopted), and the count per variant
    (``layernorm-pow-div-axes-attr``, ``layernorm-scale``, ``skip-layernorm-bias-3``, ...).
    """

    name = "fuse-layernorm"
    summary = "Fuse decomposed LayerNorm / SkipLayerNorm / RMSNorm into canonical passctl ops"
    RULES = (LayerNormDecomposed, RMSNormDecomposed, NormScale, LayerNormBias, LayerNormFromOnnx,
             SkipLayerNorm, RMSNormCastIn)
    FAMILIES = _FAMILIES


__all__ = ["FuseLayerNorm", "LayerNormDecomposed", "LayerNormFromOnnx", "NormScale", "RMSNormDecomposed",
           "SkipLayerNorm"]
