"""fuse-conv-activation: Conv + bias Add + activation / residual Add -> com.microsoft FusedConv."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple, Union

import numpy as np

from passctl.ir import DataType, Model, Node, Value
from passctl.passes.base import PassResult
from passctl.passes.registry import register_pass
from passctl.passes.rewrite import AttrVar, MatchResult, Or, RewriteRule, RuleContext, RuleSet, register_rule

logger = logging.getLogger(__name__)

MS_DOMAIN = "com.microsoft"
# Every attribute of Conv-22 (ONNX spec); FusedConv takes the same ones (ContribOperators.md).
CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
# The activations ONNX Runtime's FusedConv kernel applies (contrib_ops/cpu/fused_activation.cc,
# GetFusedActivationAttr), with the number of activation_params each takes. Measured with ORT 1.32:
# activation="HardSwish" is accepted at session creation but computes wrong values, and "Gelu" or
# "Identity" fail at session creation, so only these six are emitted.
FUSEDCONV_ACTIVATIONS = {"Relu": 0, "Tanh": 0, "Sigmoid": 0, "LeakyRelu": 1, "Clip": 2,
                         "HardSigmoid": 2}
_F32_MAX = float(np.finfo(np.float32).max)



def import_ms_domain(model: Model) -> None:
    """Add the ``com.microsoft`` opset import (version 1) to the model and to every model-local
    function whose body now holds a node of that domain (a function body has its own imports)."""
    if any(n.domain == MS_DOMAIN for n in model.graph.all_nodes()):
        model.opset_imports.setdefault(MS_DOMAIN, 1)
    for fn in model.functions.values():
        if any(n.domain == MS_DOMAIN for n in fn.graph.all_nodes()):
            fn.opset_imports.setdefault(MS_DOMAIN, 1)
            model.opset_imports.setdefault(MS_DOMAIN, 1)


# (activation, activation_params) or a reason why FusedConv cannot express it.
ActParams = Union[Tuple[str, Optional[List[float]]], str]


def _scalar(context: RuleContext, v: Optional[Value], default: float) -> Optional[float]:
    if v is None:
        return default
    arr = context.constant(v)
    if arr is None or arr.size != 1:
        return None
    return float(arr.reshape(()))


def _clip_params(context, lo=None, hi=None, min=None, max=None, **_) -> ActParams:
    lo_v = _scalar(context, lo, -_F32_MAX if min is None else float(min))
    hi_v = _scalar(context, hi, _F32_MAX if max is None else float(max))
    if lo_v is None or hi_v is None:
        return "Clip's min/max is not a scalar constant; FusedConv takes them as fixed activation_params"
    return "Clip", [lo_v, hi_v]


def _no_fusedconv(name: str) -> Callable[..., ActParams]:
    return lambda context, **_: (f"ONNX Runtime's FusedConv has no {name} activation (its kernel "
                                 "applies Relu, Tanh, Sigmoid, LeakyRelu, Clip, HardSigmoid); it stays "
                                 "unfused")


@dataclass(frozen=True)
class Activation:
    """One activation pattern on a convolution output ``c``.

    Attributes:
        key: rule-name part, e.g. ``relu``.
        build: ``build(op, c, v)`` returns the activation's output in the pattern builder.
        params: ``params(context, **bindings)`` -> ``(activation, activation_params)`` for FusedConv,
            or a reason string when FusedConv cannot apply it.
    """

    key: str
    build: Callable
    params: Callable[..., ActParams]


ACTIVATIONS: Tuple[Activation, ...] = (
    Activation("relu", lambda op, c, v: op.Relu(c), lambda context, **_: ("Relu", None)),
    Activation("tanh", lambda op, c, v: op.Tanh(c), lambda context, **_: ("Tanh", None)),
    Activation("sigmoid", lambda op, c, v: op.Sigmoid(c), lambda context, **_: ("Sigmoid", None)),
    Activation("leaky-relu", lambda op, c, v: op.LeakyRelu(c, alpha=AttrVar("alpha", default=0.01)),
               lambda context, alpha, **_: ("LeakyRelu", [float(alpha)])),
    Activation("hard-sigmoid",
               lambda op, c, v: op.HardSigmoid(c, alpha=AttrVar("alpha", default=0.2),
                                            beta=AttrVar("beta", default=0.5)),
               lambda context, alpha, beta, **_: ("HardSigmoid", [float(alpha), float(beta)])),
    # Clip-11+: min and max are inputs (either may be omitted); Clip-6: attributes.
    Activation("clip", lambda op, c, v: op.Clip(c, v["lo"], v["hi"]), _clip_params),
    Activation("clip-min", lambda op, c, v: op.Clip(c, v["lo"]), _clip_params),
    Activation("clip-max", lambda op, c, v: op.Clip(c, None, v["hi"]), _clip_params),
    Activation("clip-attr", lambda op, c, v: op.Clip(c, min=AttrVar("min"), max=AttrVar("max")),
               _clip_params),
    # Activations FusedConv lacks: matched so that `passctl explain` says why they stay unfused.
    Activation("hard-swish", lambda op, c, v: op.HardSwish(c), _no_fusedconv("HardSwish")),
    Activation("hard-swish-mul",
               lambda op, c, v: op.Mul(c, op.HardSigmoid(c, alpha=AttrVar("alpha", default=0.2),
                                                      beta=AttrVar("beta", default=0.5))),
               _no_fusedconv("HardSwish (x * HardSigmoid(x))")),
    Activation("silu", lambda op, c, v: op.Mul(c, op.Sigmoid(c)), _no_fusedconv("SiLU (x * Sigmoid(x))")),
    Activation("gelu", lambda op, c, v: op.Gelu(c), _no_fusedconv("Gelu")),
)


def _conv_attrs():
    return {a: AttrVar(a) for a in CONV_ATTRS}


def _fused_no_act():
    return dict(_conv_attrs(),
                activation=AttrVar("activation", lambda v: v is None, describe="absent"),
                activation_params=AttrVar("activation_params", lambda v: v is None,
                                          describe="absent"))


def _source(op, x, w, b, z):
    """How the convolution feeding the activation is written: Conv with or without bias, or a
    FusedConv without activation made by the residual rule (with or without bias); the matched one
    is the node ``conv``, its label the binding ``source``."""
    return Or(op.Conv(x, w, _name="conv", **_conv_attrs()),
              op.Conv(x, w, b, _name="conv", **_conv_attrs()),
              op.FusedConv(x, w, None, z, _domain=MS_DOMAIN, _name="conv", **_fused_no_act()),
              op.FusedConv(x, w, b, z, _domain=MS_DOMAIN, _name="conv", **_fused_no_act()),
              name="source", labels=("conv", "conv-bias", "conv-add", "conv-bias-add"))


def _is_float32(conv: Node) -> Optional[str]:
    # Conv's X, W and Y share one element type (ONNX Conv spec): the first one known decides.
    dtype = conv.outputs[0].dtype or conv.inputs[0].dtype or conv.inputs[1].dtype
    weight = RuleContext.constant(conv.inputs[1])
    if dtype is None and weight is not None:
        dtype = DataType.FLOAT if weight.dtype == np.float32 else DataType.UNDEFINED
    if dtype != DataType.FLOAT:
        what = "unknown" if dtype is None else dtype.short_name
        return f"FusedConv's CPU kernel is float32 only; the convolution output is {what}"
    return None


class ConvActivationRule(RewriteRule):
    """act(Conv(x, w[, b])) or act(FusedConv(x, w, b, z)) -> FusedConv(x, w, b[, z], activation).

    One rule object per :class:`Activation` (``conv-<activation>``); the four ways the convolution
    is written are alternatives (:func:`_source`) and a fusion counts as ``<source>-<activation>``
    (``conv-bias-relu``, ...), the names of the former one-rule-per-pair classes, which are aliases
    of the rule. The check refuses non-float32 convolutions and activations FusedConv cannot express
    (the activation's ``params`` gives the reason).
    Math (ContribOperators.md, FusedConv): ``Y = activation(Conv(X, W, B) + Z)``.

    Args:
        act: the activation.
    """

    commute = True  # x * Sigmoid(x) and Sigmoid(x) * x

    def __init__(self, act: Activation):
        self.act = act
        self.name = f"conv-{act.key}"
        self.variant = "{source}-" + act.key
        self.summary = f"{act.key}(conv, conv-bias, conv-add or conv-bias-add) -> com.microsoft FusedConv"
        super().__init__()

    def pattern(self, op, x, w, b, z, lo, hi):
        v = {"x": x, "w": w, "b": b, "z": z, "lo": lo, "hi": hi}
        return self.act.build(op, _source(op, x, w, b, z), v)

    def check(self, context: RuleContext, conv, source, **bindings):
        reason = _is_float32(conv)
        if reason is not None:
            return MatchResult().fail(reason, context.root)
        params = self.act.params(context, **bindings)
        if isinstance(params, str):
            return MatchResult().fail(params, context.root)
        return MatchResult()

    def rewrite(self, op, x, w, conv, source, b=None, z=None, **bindings):
        activation, params = self.act.params(RuleContext, **bindings)
        attrs = {k: bindings.get(k) for k in CONV_ATTRS}
        inputs = [x, w, b, z]
        while inputs[-1] is None:
            inputs.pop()
        return op.FusedConv(*inputs, _domain=MS_DOMAIN, activation=activation,
                            activation_params=params, **attrs)


def _weight_shape(w: Value) -> Optional[Tuple[int, ...]]:
    arr = RuleContext.constant(w)
    if arr is not None:
        return arr.shape
    if w.shape is not None and w.shape.is_static():
        return tuple(w.shape.dims)
    return None


class ConvBiasAddRule(RewriteRule):
    """Add(Conv(x, w[, b]), c) -> Conv(x, w, b + c) for a constant ``c`` that is one value per output
    channel (shape ``[C, 1, ..., 1]`` or ``[1, C, 1, ..., 1]``, or a scalar): Conv's bias is added
    per output channel (ONNX Conv spec), so the sum is the same up to float rounding of ``b + c``."""

    commute = True
    with_bias = False

    def pattern(self, op, x, w, b, c):
        conv = op.Conv(x, w, b, **_conv_attrs()) if self.with_bias else op.Conv(x, w, **_conv_attrs())
        return op.Add(conv, c)

    def check(self, context: RuleContext, w, c, b=None):
        bias = context.constant(c)
        if bias is None:
            return MatchResult().fail(f"'{c.name}' is not a constant: not a bias")
        weight_shape = _weight_shape(w)
        if weight_shape is None:
            return MatchResult().fail("the convolution's weight shape is unknown (run infer-shapes)")
        channels, rank = weight_shape[0], len(weight_shape)  # Conv output rank = weight rank
        if bias.ndim > rank:
            return MatchResult().fail(f"bias '{c.name}' has rank {bias.ndim} > the convolution output's "
                                      f"{rank}: the Add broadcasts the output")
        full = (1,) * (rank - bias.ndim) + bias.shape
        if any(d != 1 for i, d in enumerate(full) if i != 1) or full[1] not in (1, channels):
            return MatchResult().fail(f"bias '{c.name}' of shape {list(bias.shape)} is not one value per "
                                      f"output channel ({channels})")
        if b is not None and context.constant(b) is None:
            return MatchResult().fail(f"Conv bias '{b.name}' is not a constant")
        if bias.dtype != np.float32 and bias.dtype != np.float64 and bias.dtype != np.float16:
            return MatchResult().fail(f"bias '{c.name}' is {bias.dtype}, not floating point")
        return MatchResult()

    def rewrite(self, op, x, w, c, b=None, **attrs):
        add = RuleContext.constant(c)
        channels = _weight_shape(w)[0]
        old = RuleContext.constant(b) if b is not None else np.zeros(channels, add.dtype)
        new = (old.astype(np.float64) + np.broadcast_to(add.reshape(-1), (channels,))).astype(old.dtype)
        return op.Conv(x, w, op.constant(new, f"{w.name}_bias"), **{k: attrs.get(k) for k in CONV_ATTRS})


@register_rule
class ConvAddBias(ConvBiasAddRule):
    name = "conv-add-bias"
    summary = "Add(Conv(x, w), c) -> Conv(x, w, c) for a per-channel constant c"


@register_rule
class ConvBiasAddBias(ConvBiasAddRule):
    name = "conv-bias-add-bias"
    summary = "Add(Conv(x, w, b), c) -> Conv(x, w, b + c) for a per-channel constant c"
    with_bias = True


class ConvResidualRule(RewriteRule):
    """Add(Conv(x, w[, b]), z) -> FusedConv(x, w, b, z): ONNX Runtime's Conv kernel adds ``Z`` (the
    "Sum" input) to the output before the activation; ``z`` must have exactly the output's shape."""

    commute = True
    with_bias = False

    def pattern(self, op, x, w, b, z):
        conv = (op.Conv(x, w, b, _name="conv", **_conv_attrs()) if self.with_bias
                else op.Conv(x, w, _name="conv", **_conv_attrs()))
        return op.Add(conv, z)

    def check(self, context: RuleContext, z, conv):
        reason = _is_float32(conv)
        if reason is not None:
            return MatchResult().fail(reason, context.root)
        y, out = conv.outputs[0].shape, context.root.outputs[0].shape
        if y is None or out is None or z.shape is None or None in y.dims or None in z.shape.dims:
            return MatchResult().fail("shapes of the Conv output and the residual are unknown (run "
                                      "infer-shapes); FusedConv's Z must have the output's exact shape")
        if tuple(z.shape.dims) != tuple(y.dims) or tuple(out.dims) != tuple(y.dims):
            return MatchResult().fail(f"residual '{z.name}' has shape {z.shape}, the Conv output {y}: "
                                      "FusedConv's Z does not broadcast")
        if z.dtype != DataType.FLOAT:
            return MatchResult().fail(f"residual '{z.name}' is not float32")
        return MatchResult()

    def rewrite(self, op, x, w, z, conv, b=None, **attrs):
        return op.FusedConv(x, w, b, z, _domain=MS_DOMAIN, **{k: attrs.get(k) for k in CONV_ATTRS})


@register_rule
class ConvAddResidual(ConvResidualRule):
    name = "conv-add"
    summary = "Add(Conv(x, w), z) -> FusedConv(x, w, _, z)"


@register_rule
class ConvBiasAddResidual(ConvResidualRule):
    name = "conv-bias-add"
    summary = "Add(Conv(x, w, b), z) -> FusedConv(x, w, b, z)"
    with_bias = True


conv_relu, conv_tanh, conv_sigmoid, conv_leaky_relu, conv_hard_sigmoid, conv_clip, conv_clip_min, \
    conv_clip_max, conv_clip_attr, conv_hard_swish, conv_hard_swish_mul, conv_silu, conv_gelu = \
    ACTIVATION_RULES = tuple(register_rule(ConvActivationRule(a)) for a in ACTIVATIONS)
# NOTE: bias rules before the residual rules: an Add of a per-channel constant is a bias (kept as
# standard Conv), not a residual. Residual rules before nothing else matter: act(FusedConv(z)) is
# matched by the activation rules with a FusedConv source in the same or the next sweep.
RULES = (ConvAddBias, ConvBiasAddBias) + ACTIVATION_RULES + (ConvAddResidual, ConvBiasAddResidual)


@register_pass
class FuseConvActivation(RuleSet):
    """Fuse Conv + per-channel bias Add + activation and Conv + residual Add (a rule set).

    Rules (the stat keys are the rule names, or the variant names where said):
      1. ``conv-add-bias`` / ``conv-bias-add-bias``: ``Add(Conv(x, w[, b]), c)`` with a per-channel
         constant ``c`` -> ``Conv(x, w, b + c)`` (standard ONNX, any target).
      2. ``conv-<activation>`` (counted as ``<source>-<activation>``, e.g. ``conv-bias-relu``):
         ``act(Conv(...))`` -> ``com.microsoft::FusedConv(...,
         activation, activation_params)`` for Relu, Tanh, Sigmoid, LeakyRelu, HardSigmoid and Clip
         with constant min/max. HardSwish (op or ``x * HardSigmoid(x)``), SiLU (``x * Sigmoid(x)``)
         and Gelu match but their check fails with the reason (FusedConv lacks them).
      3. ``conv-add`` / ``conv-bias-add``: ``Add(Conv(x, w[, b]), z)`` with ``z`` of the output's
         exact shape -> ``FusedConv(x, w, b, z)``; rule 2 then folds a following activation.

    FusedConv is ONNX Runtime's contrib op (domain com.microsoft, float32 CPU kernel), so this pass
    belongs to the ONNX Runtime targets; the pass adds the ``com.microsoft`` opset import when it
    fires. Statistics: ``fused`` (all rewrites) and the count per rule name.
    """

    name = "fuse-conv-activation"
    summary = "Conv + bias + activation / residual Add -> com.microsoft FusedConv (ONNX Runtime)"

    def __init__(self, options=None, **kwargs):
        super().__init__(RULES, options, **kwargs)

    def run(self, model: Model) -> PassResult:
        result = super().run(model)
        if result.modified:
            import_ms_domain(model)
        return PassResult(result.modified, {"fused": sum(result.stats.values()), **result.stats})
