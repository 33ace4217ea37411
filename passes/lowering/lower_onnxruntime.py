"""lower-onnxruntime: canonical passctl ops as ONNX Runtime contrib ops where its CPU has kernels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from passctl.dialect.canonical import MS_DOMAIN, ensure_opset, optional_input
from passctl.ir import Model, Node, Value
from passctl.passes.base import PassResult
from passctl.passes.lowering import lower_standard as std
from passctl.passes.lowering.table import LowerContext, Lowering, register_lowering, typed_like
from passctl.passes.registry import register_pass

TARGET = "onnxruntime"


def layernorm(ctx: LowerContext, node: Node) -> Value:
    """``LayerNormalization`` in the default domain at any opset: ONNX's op from 17, ONNX Runtime's
    own registration of the same name and schema below 17 (its transformers optimizer emits it too)."""
    x, scale, bias = node.inputs[0], optional_input(node, 1), optional_input(node, 2)
    ctx.form = "LayerNorm->LayerNormalization"
    ins = [x, scale if scale is not None else ctx.ones_scale(x)] + ([bias] if bias is not None else [])
    return ctx.b.op("LayerNormalization", *ins, axis=-1, epsilon=float(node.attr("epsilon")))


def skip_layernorm(ctx: LowerContext, node: Node) -> Optional[Value]:
    """``com.microsoft.SkipLayerNormalization(input, skip, gamma, beta, bias)`` (ContribOperators.md:
    input and skip 2-D or 3-D of one shape; gamma, beta, bias ``[hidden]``); None for other ranks."""
    x, skip = node.inputs[0], node.inputs[1]
    rank = None if x.shape is None else x.shape.rank
    if rank not in (2, 3) or skip.shape is None or skip.shape.rank != rank:
        return None
    scale, beta, bias = optional_input(node, 2), optional_input(node, 3), optional_input(node, 4)
    ins = [x, skip, scale if scale is not None else ctx.ones_scale(x), beta, bias]
    while ins[-1] is None:
        ins.pop()
    ctx.form = "SkipLayerNorm->com.microsoft::SkipLayerNormalization"
    return ctx.b.op("SkipLayerNormalization", *ins, domain=MS_DOMAIN, epsilon=float(node.attr("epsilon")))


def skip_layernorm_add(ctx: LowerContext, node: Node) -> Value:
    """``Add(Add(input, bias), skip)`` then ``LayerNormalization``: what ONNX Runtime 1.32's CPU provider
    runs fastest (see the NOTE at the registration below)."""
    x, skip, bias = node.inputs[0], node.inputs[1], optional_input(node, 4)
    s = typed_like(ctx.b.op("Add", x, bias), x) if bias is not None else x
    s = typed_like(ctx.b.op("Add", s, skip), x)
    scale, beta = optional_input(node, 2), optional_input(node, 3)
    ins = [s, scale if scale is not None else ctx.ones_scale(s)] + ([beta] if beta is not None else [])
    ctx.form = "SkipLayerNorm->Add+LayerNormalization"
    return ctx.b.op("LayerNormalization", *ins, axis=-1, epsilon=float(node.attr("epsilon")))


def rmsnorm(ctx: LowerContext, node: Node) -> Value:
    """x / sqrt(mean(x^2) + eps) * scale as one kernel: ``RMSNormalization`` (ONNX, opset >= 23;
    ONNX Runtime 1.32 runs it on the CPU provider), else ``SimplifiedLayerNormalization``, which
    ONNX Runtime registers in the default ONNX domain although ONNX has no such op (the form its
    transformers optimizer writes for LLaMA's RMSNorm; ``com.microsoft`` has no kernel of that
    name): such a model runs in ONNX Runtime only and ``onnx.checker`` refuses it
    (:func:`runtime_only_ops` names it, the report's ``artifact.runtime_only_ops``)."""
    ctx.form = "RMSNorm->" + ("RMSNormalization" if ctx.opset >= RMS_NORMALIZATION_OPSET
                              else "SimplifiedLayerNormalization")
    return _simplified_layernorm(ctx, node.inputs[0], optional_input(node, 1), float(node.attr("epsilon")))


RMS_NORMALIZATION_OPSET = 23
"""The first ONNX opset with ``RMSNormalization``."""


def _simplified_layernorm(ctx: LowerContext, x: Value, scale: Optional[Value], eps: float) -> Value:
    if ctx.opset >= RMS_NORMALIZATION_OPSET:
        scale = scale if scale is not None else ctx.ones_scale(x)
        return ctx.b.op("RMSNormalization", x, scale, axis=-1, epsilon=eps, stash_type=1)
    if getattr(ctx.options, "portable", False):
        # The spelling ONNX Runtime's SimplifiedLayerNormFusion (ORT_ENABLE_EXTENDED and above)
        # turns back into SimplifiedLayerNormalization when the session loads: Pow(x, 2),
        # ReduceMean, Add eps, Sqrt, Div, Mul scale (the fusion needs the Mul: ones without one).
        ctx.form = ctx.form.replace("SimplifiedLayerNormalization", "decomposed")
        b = ctx.b
        ms = ctx.reduce_mean_last(b.op("Pow", x, ctx.scalar(2.0, x, "two")))
        y = b.op("Div", x, b.op("Sqrt", b.op("Add", ms, ctx.scalar(eps, x, "epsilon"))))
        return b.op("Mul", y, scale if scale is not None else ctx.ones_scale(x))
    scale = scale if scale is not None else ctx.ones_scale(x)
    return ctx.b.op("SimplifiedLayerNormalization", x, scale, axis=-1, epsilon=eps, stash_type=1)


def skip_rmsnorm(ctx: LowerContext, node: Node) -> Optional[Tuple[Value, ...]]:
    """``com.microsoft.SkipSimplifiedLayerNormalization(input, skip, gamma)`` (ContribOperators.md:
    input and skip 2-D or 3-D of one shape, gamma ``[hidden]``); its outputs are ``(output, mean,
    inv_std_var, input_skip_bias_sum)``: the sum is written as the 4th output when the node's second
    output is used (mean and inv_std_var omitted). None for other ranks."""
    x, skip = node.inputs[0], node.inputs[1]
    rank = None if x.shape is None else x.shape.rank
    if rank not in (2, 3) or skip.shape is None or skip.shape.rank != rank:
        return None
    scale = optional_input(node, 2)
    y = Value(ctx.graph.fresh_name("skip_simplified_ln_out"))
    outs = [y]
    if len(node.outputs) > 1:
        outs += [Value(""), Value(""), Value(ctx.graph.fresh_name("input_skip_bias_sum"))]
    fused = Node(MS_DOMAIN, "SkipSimplifiedLayerNormalization",
                 [x, skip, scale if scale is not None else ctx.ones_scale(x)],
                 {"epsilon": float(node.attr("epsilon"))}, outs,
                 name=ctx.graph.fresh_name("SkipSimplifiedLayerNormalization"), provenance=node.provenance)
    ctx.b.nodes.append(fused)
    ctx.form = "SkipRMSNorm->com.microsoft::SkipSimplifiedLayerNormalization"
    return (y, outs[3]) if len(node.outputs) > 1 else (y,)


def skip_rmsnorm_add(ctx: LowerContext, node: Node) -> Tuple[Value, ...]:
    """``S = Add(input, skip)`` then RMSNorm's form (:func:`rmsnorm`) of S; returns ``(Y, S)`` (or
    ``(Y,)``): the unfused form, for ranks the contrib op does not take."""
    x, skip, scale = node.inputs[0], node.inputs[1], optional_input(node, 2)
    s = typed_like(ctx.b.op("Add", x, skip), x)
    ctx.form = "SkipRMSNorm->Add+" + ("RMSNormalization" if ctx.opset >= RMS_NORMALIZATION_OPSET
                                      else "SimplifiedLayerNormalization")
    y = _simplified_layernorm(ctx, s, scale, float(node.attr("epsilon")))
    return (y, s) if len(node.outputs) > 1 else (y,)


def gelu(ctx: LowerContext, node: Node) -> Value:
    """Erf form: ``com.microsoft.BiasGelu(A, B)`` with a bias, else ``com.microsoft.Gelu(X)``; tanh
    form: ``com.microsoft.FastGelu(X[, bias])`` (ContribOperators.md)."""
    x, bias = node.inputs[0], optional_input(node, 1)
    if node.attr("approximate", "none") == "tanh":
        ctx.form = "Gelu->com.microsoft::FastGelu"
        return ctx.b.op("FastGelu", *([x] if bias is None else [x, bias]), domain=MS_DOMAIN)
    if bias is not None:
        ctx.form = "Gelu->com.microsoft::BiasGelu"
        return ctx.b.op("BiasGelu", x, bias, domain=MS_DOMAIN)
    ctx.form = "Gelu->com.microsoft::Gelu"
    return ctx.b.op("Gelu", x, domain=MS_DOMAIN)


def silu(ctx: LowerContext, node: Node) -> Value:
    """``com.microsoft.QuickGelu(X, alpha)`` = X * sigmoid(alpha * X): SiLU / Swish in one kernel."""
    ctx.form = "SiLU->com.microsoft::QuickGelu"
    return ctx.b.op("QuickGelu", node.inputs[0], domain=MS_DOMAIN, alpha=float(node.attr("alpha", 1.0)))


# NOTE: SkipLayerNorm lowers to Add + LayerNormalization, not com.microsoft.SkipLayerNormalization:
# on ONNX Runtime 1.32's CPU provider the contrib kernel measured ~6x slower than Add+Add+
# LayerNormalization at BERT/MiniLM shapes (benchmarks/ort_fused_kernels.py) and made BERT-base 5% and
# MiniLM 14% slower end to end (benchmarks/results/ort_cpu-2026-11-29.md). `skip_layernorm` stays for
# a CUDA-provider lowering, where the fused kernel pays.
for _op, _fns in [("LayerNorm", [layernorm]), ("SkipLayerNorm", [skip_layernorm_add]),
                  ("RMSNorm", [rmsnorm]), ("SkipRMSNorm", [skip_rmsnorm, skip_rmsnorm_add]),
                  ("Gelu", [gelu]), ("SiLU", [silu]),
                  ("HardSwish", [std.lower_hardswish])]:
    for _fn in _fns:
        register_lowering(TARGET, _op, _fn)


@register_pass
class LowerOnnxRuntime(Lowering):
    """Turn canonical ``passctl::`` ops into the ops ONNX Runtime 1.32's CPU provider runs fused.

    Forms: LayerNorm -> LayerNormalization; SkipLayerNorm -> Add + LayerNormalization (faster than
    com.microsoft.SkipLayerNormalization on the CPU provider, measured); RMSNorm -> RMSNormalization
    (opset >= 23) or SimplifiedLayerNormalization (ONNX Runtime's default-domain op, below 23);
    SkipRMSNorm -> com.microsoft.SkipSimplifiedLayerNormalization (the sum as its 4th output; Add +
    RMSNorm's form for ranks other than 2 and 3);
    Gelu -> com.microsoft Gelu / BiasGelu / FastGelu; SiLU -> com.microsoft.QuickGelu(alpha);
    HardSwish -> HardSwish (opset >= 14) or x * HardSigmoid(x). ``com.microsoft`` (version 1) is added
    to the opset imports when used. ``onnx.checker`` accepts the ``com.microsoft`` ops (a domain it
    has no schemas for) but refuses SimplifiedLayerNormalization (and LayerNormalization below opset
    17), ONNX Runtime's registrations in the default domain: :func:`runtime_only_ops` lists what
    only ONNX Runtime runs, and statistic ``runtime_only_ops`` counts those nodes. Option
    ``portable`` writes RMSNorm below opset 23 as the decomposition ONNX Runtime fuses back.

    Statistics: see :class:`passctl.passes.lowering.table.Lowering`.
    """

    name = "lower-onnxruntime"
    summary = "Lower canonical passctl ops to ONNX Runtime contrib ops (com.microsoft) and ONNX ops"
    TARGET = TARGET

    @dataclass
    class Options:
        """Options of lower-onnxruntime.

        Attributes:
            portable: below opset 23, write RMSNorm as its decomposition (Pow, ReduceMean, Add,
                Sqrt, Div, Mul) instead of SimplifiedLayerNormalization, so that ``onnx.checker``
                accepts the artifact; ONNX Runtime fuses that spelling back into
                SimplifiedLayerNormalization when the session loads at ORT_ENABLE_EXTENDED or
                above (the shipped level is ORT_ENABLE_ALL), so the kernel is the same there.
        """

        portable: bool = False

    def run(self, model: Model) -> PassResult:
        result = super().run(model)
        if any(n.domain == MS_DOMAIN for n in model.graph.all_nodes()):
            ensure_opset(model, MS_DOMAIN, 1)
        only = runtime_only_ops(model)
        if only:
            result.stats["runtime_only_ops"] = sum(only.values())
        return result


def runtime_only_ops(model: Model) -> Dict[str, int]:
    """``{"domain::op": count}`` of the nodes only ONNX Runtime runs: ops of a domain ONNX does not
    define (``com.microsoft::BiasGelu``...), and default-domain ops with no ONNX schema at the
    model's opset (ONNX Runtime's own registrations: ``::SimplifiedLayerNormalization``,
    ``::LayerNormalization`` below opset 17), which ``onnx.checker`` refuses. Model-local functions
    count as defined. Empty for a portable model."""
    import onnx.defs

    opset = model.opset or 1
    local = {(f.domain, f.name) for f in model.functions.values()} if model.functions else set()
    found: Dict[str, int] = {}
    for n in model.graph.all_nodes():
        if (n.domain, n.op_type) in local:
            continue
        if n.domain in ("", "ai.onnx", "ai.onnx.ml"):
            version = opset if n.domain != "ai.onnx.ml" else model.opset_imports.get("ai.onnx.ml", 1)
            try:
                onnx.defs.get_schema(n.op_type, version, "" if n.domain == "ai.onnx" else n.domain)
                continue
            except onnx.defs.SchemaError:
                pass
        key = f"{n.domain}::{n.op_type}"
        found[key] = found.get(key, 0) + 1
    return dict(sorted(found.items()))


__all__ = ["LowerOnnxRuntime", "runtime_only_ops"]
