"""lower-standard: canonical passctl ops as standard ONNX ops of the model's opset (TVM, TensorRT)."""

from __future__ import annotations

import math
from typing import Optional, Tuple

from passctl.dialect.canonical import optional_input
from passctl.ir import Node, Value
from passctl.passes.lowering.table import LowerContext, Lowering, register_lowering, typed_like
from passctl.passes.registry import register_pass

TARGET = "standard"


def layernorm(ctx: LowerContext, x: Value, scale: Optional[Value], bias: Optional[Value],
              epsilon: float) -> Value:
    """LayerNormalization-17 when the opset has it, else its decomposition (ONNX op spec function
    body: mean, centred square, mean, Add epsilon, Sqrt, Div, Mul scale, Add bias)."""
    b = ctx.b
    if ctx.opset >= 17:
        ctx.form = ctx.form or "LayerNorm->LayerNormalization"
        scale = scale if scale is not None else ctx.ones_scale(x)
        ins = [x, scale] + ([bias] if bias is not None else [])
        return b.op("LayerNormalization", *ins, axis=-1, epsilon=epsilon)
    ctx.form = ctx.form or "LayerNorm->decomposed"
    d = b.op("Sub", x, ctx.reduce_mean_last(x))
    var = ctx.reduce_mean_last(b.op("Mul", d, d))
    y = b.op("Div", d, b.op("Sqrt", b.op("Add", var, ctx.scalar(epsilon, x, "epsilon"))))
    if scale is not None:
        y = b.op("Mul", y, scale)
    if bias is not None:
        y = b.op("Add", y, bias)
    return y


def lower_layernorm(ctx: LowerContext, node: Node) -> Value:
    return layernorm(ctx, node.inputs[0], optional_input(node, 1), optional_input(node, 2), float(node.attr("epsilon")))


def lower_skip_layernorm(ctx: LowerContext, node: Node) -> Value:
    """Add(Add(X, Bias), Skip), then LayerNorm (the canonical op's math)."""
    x, skip, bias = node.inputs[0], node.inputs[1], optional_input(node, 4)
    s = x
    if bias is not None:
        s = typed_like(ctx.b.op("Add", s, bias), x)
    s = typed_like(ctx.b.op("Add", s, skip), x)
    ctx.form = "SkipLayerNorm->Add+" + ("LayerNormalization" if ctx.opset >= 17 else "decomposed")
    return layernorm(ctx, s, optional_input(node, 2), optional_input(node, 3), float(node.attr("epsilon")))


def lower_rmsnorm(ctx: LowerContext, node: Node) -> Value:
    """RMSNormalization-23 when the opset has it, else x / sqrt(mean(x*x) + eps) * scale."""
    return rmsnorm(ctx, node.inputs[0], optional_input(node, 1), float(node.attr("epsilon")))


def lower_skip_rmsnorm(ctx: LowerContext, node: Node) -> Tuple[Value, ...]:
    """``S = Add(X, Skip)`` then RMSNorm(S) (the canonical op's math); returns ``(Y, S)``, or
    ``(Y,)`` when the node has one output."""
    x, skip = node.inputs[0], node.inputs[1]
    s = typed_like(ctx.b.op("Add", x, skip), x)
    ctx.form = "SkipRMSNorm->Add+" + ("RMSNormalization" if ctx.opset >= 23 else "decomposed")
    y = rmsnorm(ctx, s, optional_input(node, 2), float(node.attr("epsilon")))
    return (y, s) if len(node.outputs) > 1 else (y,)


def rmsnorm(ctx: LowerContext, x: Value, scale: Optional[Value], eps: float) -> Value:
    """RMSNormalization-23 when the opset has it, else x / sqrt(mean(x*x) + eps) * scale
    (Zhang & Sennrich 2019; the ONNX op spec's function body)."""
    b = ctx.b
    if ctx.opset >= 23:
        ctx.form = ctx.form or "RMSNorm->RMSNormalization"
        return b.op("RMSNormalization", x, scale if scale is not None else ctx.ones_scale(x),
                    axis=-1, epsilon=eps)
    ctx.form = ctx.form or "RMSNorm->decomposed"
    ms = ctx.reduce_mean_last(b.op("Mul", x, x))
    y = b.op("Div", x, b.op("Sqrt", b.op("Add", ms, ctx.scalar(eps, x, "epsilon"))))
    return b.op("Mul", y, scale) if scale is not None else y


def gelu(ctx: LowerContext, v: Value, approximate: str) -> Value:
    """Gelu-20 when the opset has it, else the erf or tanh formula (Hendrycks & Gimpel 2016)."""
    b = ctx.b
    if ctx.opset >= 20:
        ctx.form = ctx.form or "Gelu->Gelu"
        return b.op("Gelu", v, approximate=approximate)
    ctx.form = ctx.form or f"Gelu->decomposed-{approximate}"
    if approximate == "tanh":
        cube = b.op("Mul", b.op("Mul", v, v), v)
        inner = b.op("Add", v, b.op("Mul", cube, ctx.scalar(0.044715, v, "gelu_kappa")))
        t = b.op("Tanh", b.op("Mul", inner, ctx.scalar(math.sqrt(2 / math.pi), v, "gelu_beta")))
    else:
        t = b.op("Erf", b.op("Div", v, ctx.scalar(math.sqrt(2), v, "sqrt2")))
    one_plus = b.op("Add", t, ctx.scalar(1.0, v, "one"))
    return b.op("Mul", b.op("Mul", v, ctx.scalar(0.5, v, "half")), one_plus)


def lower_gelu(ctx: LowerContext, node: Node) -> Value:
    v, bias = node.inputs[0], optional_input(node, 1)
    if bias is not None:
        v = typed_like(ctx.b.op("Add", v, bias), node.inputs[0])
    return gelu(ctx, v, node.attr("approximate", "none"))


def lower_silu(ctx: LowerContext, node: Node) -> Value:
    """Swish-24 when the opset has it, else x * Sigmoid(x) (x * Sigmoid(alpha * x) for alpha != 1)."""
    x, alpha = node.inputs[0], float(node.attr("alpha", 1.0))
    if ctx.opset >= 24:
        ctx.form = "SiLU->Swish"
        return ctx.b.op("Swish", x, alpha=None if alpha == 1.0 else alpha)
    ctx.form = "SiLU->Mul+Sigmoid"
    inner = x if alpha == 1.0 else ctx.b.op("Mul", x, ctx.scalar(alpha, x, "swish_alpha"))
    return ctx.b.op("Mul", x, ctx.b.op("Sigmoid", inner))


def lower_hardswish(ctx: LowerContext, node: Node) -> Value:
    """HardSwish-14 when the opset has it, else x * HardSigmoid(x, alpha=1/6, beta=0.5) (opset 6)."""
    x = node.inputs[0]
    if ctx.opset >= 14:
        ctx.form = "HardSwish->HardSwish"
        return ctx.b.op("HardSwish", x)
    ctx.form = "HardSwish->Mul+HardSigmoid"
    return ctx.b.op("Mul", x, ctx.b.op("HardSigmoid", x, alpha=1.0 / 6.0, beta=0.5))


for _op, _fn in [("LayerNorm", lower_layernorm), ("SkipLayerNorm", lower_skip_layernorm),
                 ("RMSNorm", lower_rmsnorm), ("SkipRMSNorm", lower_skip_rmsnorm), ("Gelu", lower_gelu),
                 ("SiLU", lower_silu), ("HardSwish", lower_hardswish)]:
    register_lowering(TARGET, _op, _fn)


@register_pass
class LowerStandard(Lowering):
    """Turn canonical ``passctl::`` ops into standard ONNX ops of the model's opset.

    Forms: LayerNorm -> LayerNormalization (opset >= 17) or decomposed; SkipLayerNorm -> Add (+ bias
    Add) + LayerNorm; RMSNorm -> RMSNormalization (>= 23) or decomposed; SkipRMSNorm -> Add +
    that RMSNorm form (the Add's result replaces the sum output); Gelu -> (bias Add +) Gelu
    (>= 20) or the erf / tanh formula; SiLU -> Swish (>= 24) or x * Sigmoid(x); HardSwish ->
    HardSwish (>= 14) or x * HardSigmoid(x). The result uses only the ``""`` domain, for emitters
    whose importers know the standard ops (TVM's ONNX frontend, TensorRT's parser).

    Statistics: see :class:`passctl.passes.lowering.table.Lowering`.
    """

    name = "lower-standard"
    summary = "Lower canonical passctl ops to standard ONNX ops of the model's opset"
    TARGET = TARGET


PASSCTL_DOMAINS = ("passctl",)


def has_passctl_ops(model) -> bool:
    """Whether ``model``'s main graph holds passctl-only ops (domain ``passctl``: no runtime has
    kernels for them)."""
    return any(n.domain in PASSCTL_DOMAINS for n in model.graph)


def make_runnable(model) -> bool:
    """Replace ``model``'s passctl-only ops (modified in place) through their standard lowering
    (``lower-standard``; lowered nodes keep the canonical node's provenance), so ONNX Runtime
    can run a stage that still has them (``--check-each``, ``passctl compare`` and ``bisect``).

    Returns:
        Whether anything was lowered.

    Raises:
        passctl.passes.manager.PassFailure: the lowering failed (an op with no standard form).
    """
    if not has_passctl_ops(model):
        return False
    from passctl.passes.manager import PassManager

    PassManager([LowerStandard()]).run(model)
    return True


__all__ = ["LowerStandard", "PASSCTL_DOMAINS", "has_passctl_ops", "make_runnable", "gelu", "layernorm", "lower_gelu", "lower_hardswish", "lower_layernorm",
           "lower_rmsnorm", "lower_silu", "lower_skip_layernorm", "lower_skip_rmsnorm", "rmsnorm"]
