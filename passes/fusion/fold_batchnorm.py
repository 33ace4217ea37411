"""fuse-conv-bn: fold inference BatchNormalization into the Conv / ConvTranspose that feeds it."""

from __future__ import annotations

import logging

from passctl.ir import Model
from passctl.passes.base import PassResult
from passctl.passes.fusion.bn_math import fold_bn_into_conv_weights
from passctl.passes.registry import register_pass
from passctl.passes.rewrite import AttrVar, MatchResult, Opt, RewriteRule, RuleContext, RuleSet, register_rule

logger = logging.getLogger(__name__)

# Every attribute of Conv-22 / ConvTranspose-22 (ONNX spec), in the order the new node gets them.
_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
_ATTRS = {"Conv": _CONV_ATTRS, "ConvTranspose": _CONV_ATTRS + ("output_padding", "output_shape")}


class FoldBatchNorm(RewriteRule):
    """``BatchNormalization(Conv(x, w[, b]))`` -> ``Conv(x, w', b')``, one rule object per
    convolution op type (``Conv``, ``ConvTranspose``); the convolution's bias is an optional input.

    Check: the convolution weight (floating point) and bias, and the BN's scale, B, mean and var are
    constants whose channel counts agree. (The rewrite-rule engine already refuses a match whose
    Conv output has another consumer or is a graph output.)

    Rewrite: a new convolution with the same attributes reading NEW initializers
    ``W' = W * s``, ``b' = (b - mean) * s + B``, ``s = scale / sqrt(var + epsilon)`` (each BN's own
    epsilon; :func:`passctl.passes.fusion.bn_math.fold_bn_into_conv_weights`, group-aware for
    ConvTranspose). The old weight is never changed, so another node using it keeps working.
    A fold counts as ``fold-conv-bn`` / ``fold-conv-bias-bn`` (``fold-conv-transpose-...`` likewise):
    the names of the former four rules, the ``-bias-`` ones being aliases of these two.

    Args:
        op_type: ``"Conv"`` or ``"ConvTranspose"``.
    """

    def __init__(self, op_type: str):
        self.op_type = op_type
        self.transpose = op_type == "ConvTranspose"
        stem = "conv-transpose" if self.transpose else "conv"
        self.name = f"fold-{stem}-bn"
        self.bias_name = f"fold-{stem}-bias-bn"
        self.aliases = (self.bias_name,)
        self.summary = f"BatchNormalization({op_type}(x, w[, b])) -> {op_type}(x, w', b')"
        super().__init__()

    def pattern(self, op, x, w, conv_b, scale, b, mean, var):
        conv = op.op(self.op_type, x, w, Opt(conv_b), _name="conv")
        return op.BatchNormalization(conv, scale, b, mean, var,
                                     epsilon=AttrVar("epsilon", default=1e-5),
                                     training_mode=AttrVar("training_mode", lambda v: not v, 0,
                                                           describe="0 (inference)"),
                                     spatial=AttrVar("spatial", lambda v: v in (None, 1),
                                                     describe="1 or absent"))

    def reported_name(self, bindings):
        return self.name if bindings["conv_b"] is None else self.bias_name

    def check(self, context: RuleContext, conv, w, conv_b, scale, b, mean, var):
        weight = context.constant(w)
        if weight is None:
            return MatchResult().fail(f"weight '{w.name}' of the convolution is not a constant "
                                      "(run fold-constants first to lift Constant weights)")
        if weight.dtype.kind != "f" and weight.dtype.name != "bfloat16":
            return MatchResult().fail(f"weight '{w.name}' has non-float element type {weight.dtype}")
        if conv_b is not None and context.constant(conv_b) is None:
            return MatchResult().fail(f"bias '{conv_b.name}' of the convolution is not a constant")
        for v in (scale, b, mean, var):
            if context.constant(v) is None:
                return MatchResult().fail(f"BatchNormalization parameter '{v.name}' is not a constant")
        g = conv.attr("group") or 1
        c_out = weight.shape[1] * g if self.transpose else weight.shape[0]
        params = [context.constant(v) for v in (scale, b, mean, var)]
        if conv_b is not None:
            params.append(context.constant(conv_b))
        if weight.ndim < 3 or any(p.size != c_out for p in params):
            return MatchResult().fail(f"channel counts disagree: the convolution has {c_out} output "
                                      "channels")
        return MatchResult()

    def rewrite(self, op, conv, x, w, conv_b, scale, b, mean, var, epsilon, **_):
        const = RuleContext.constant
        attrs = {k: conv.attr(k) for k in _ATTRS[self.op_type]}
        new_w, new_b = fold_bn_into_conv_weights(
            const(w), None if conv_b is None else const(conv_b), const(scale), const(b), const(mean),
            const(var), float(epsilon), transpose=self.transpose, group=attrs.get("group") or 1)
        w2 = op.constant(new_w, f"{w.name}_bn")
        b2 = op.constant(new_b, f"{w.name}_bn_bias")
        return op.op(self.op_type, x, w2, b2, **attrs)


fold_conv_bn = register_rule(FoldBatchNorm("Conv"))
fold_conv_transpose_bn = register_rule(FoldBatchNorm("ConvTranspose"))
_RULES = (fold_conv_bn, fold_conv_transpose_bn)


@register_pass
class FuseConvBatchNorm(RuleSet):
    """Fold ``BatchNormalization`` into a preceding ``Conv`` or ``ConvTranspose`` (a rule set).

    Rules: ``fold-conv-bn`` and ``fold-conv-transpose-bn``, each with an optional convolution bias
    (see :class:`FoldBatchNorm` for the check and the math). The
    BN's output name is kept when it is a graph output; the new node's provenance is the union of
    the Conv's and the BN's. ``passctl explain fold-conv-bn MODEL`` tells why a pair did not fold.

    Statistics: ``fused`` (pairs folded, all rules) and the count per kind: ``fold-conv-bn``,
    ``fold-conv-bias-bn``, ``fold-conv-transpose-bn``, ``fold-conv-transpose-bias-bn``.
    """

    name = "fuse-conv-bn"
    summary = "Fold inference BatchNormalization into the preceding Conv or ConvTranspose"

    def __init__(self, options=None, **kwargs):
        super().__init__(_RULES, options, **kwargs)

    def run(self, model: Model) -> PassResult:
        result = super().run(model)
        stats = {"fused": sum(result.stats.values()), **result.stats}
        return PassResult(result.modified, stats)
