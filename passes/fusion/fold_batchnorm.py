"""fuse-conv-bn: fold inference BatchNormalization into the Conv / ConvTranspose that feeds it."""

from __future__ import annotations

import logging

from passctl.ir import Model
from passctl.passes.base import PassResult
from passctl.passes.fusion.bn_math import fold_bn_into_conv_weights
from passctl.passes.registry import register_pass
from passctl.passes.rewrite import AttrVar, MatchResult, RewriteRule, RuleContext, RuleSet, register_rule

logger = logging.getLogger(__name__)

# Every attribute of Conv-22 / ConvTranspose-22 (ONNX spec), bound so the rewrite copies them as is.
_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
_CONV_TRANSPOSE_ATTRS = _CONV_ATTRS + ("output_padding", "output_shape")


def _attr_vars(names):
    return {a: AttrVar(a) for a in names}


def _bn(op, conv_out, scale, b, mean, var):
    """The inference BatchNormalization pattern (one output, training_mode 0, spatial 1)."""
    return op.BatchNormalization(conv_out, scale, b, mean, var,
                                 epsilon=AttrVar("epsilon", default=1e-5),
                                 training_mode=AttrVar("training_mode", lambda v: not v, 0,
                                                       describe="0 (inference)"),
                                 spatial=AttrVar("spatial", lambda v: v in (None, 1),
                                                 describe="1 or absent"))


class _FoldBnRule(RewriteRule):
    """Shared check and rewrite of the four Conv/ConvTranspose (with or without bias) + BN rules.

    Check: the convolution weight (floating point) and bias, and the BN's scale, B, mean and var are
    constants whose channel counts agree. (The rewrite-rule engine already refuses a match whose
    Conv output has another consumer or is a graph output.)

    Rewrite: a new convolution with the same attributes reading NEW initializers
    ``W' = W * s``, ``b' = (b - mean) * s + B``, ``s = scale / sqrt(var + epsilon)`` (each BN's own
    epsilon; :func:`passctl.passes.fusion.bn_math.fold_bn_into_conv_weights`, group-aware for
    ConvTranspose). The old weight is never changed, so another node using it keeps working.
    """

    transpose = False

    def check(self, context: RuleContext, w, scale, b, mean, var, group=None, conv_b=None):
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
        g = group or 1
        c_out = weight.shape[1] * g if self.transpose else weight.shape[0]
        params = [context.constant(v) for v in (scale, b, mean, var)]
        if conv_b is not None:
            params.append(context.constant(conv_b))
        if weight.ndim < 3 or any(p.size != c_out for p in params):
            return MatchResult().fail(f"channel counts disagree: the convolution has {c_out} output "
                                      "channels")
        return MatchResult()

    def _fold(self, op, x, w, scale, b, mean, var, epsilon, conv_b, attrs):
        const = RuleContext.constant
        group = attrs.get("group") or 1
        new_w, new_b = fold_bn_into_conv_weights(
            const(w), None if conv_b is None else const(conv_b), const(scale), const(b), const(mean),
            const(var), float(epsilon), transpose=self.transpose, group=group)
        w2 = op.constant(new_w, f"{w.name}_bn")
        b2 = op.constant(new_b, f"{w.name}_bn_bias")
        return op.op("ConvTranspose" if self.transpose else "Conv", x, w2, b2, **attrs)


@register_rule
class FoldConvBn(_FoldBnRule):
    name = "fold-conv-bn"
    summary = "BatchNormalization(Conv(x, w)) -> Conv(x, w', b')"

    def pattern(self, op, x, w, scale, b, mean, var):
        return _bn(op, op.Conv(x, w, **_attr_vars(_CONV_ATTRS)), scale, b, mean, var)

    def rewrite(self, op, x, w, scale, b, mean, var, epsilon, **attrs):
        attrs = {k: attrs.get(k) for k in _CONV_ATTRS}
        return self._fold(op, x, w, scale, b, mean, var, epsilon, None, attrs)


@register_rule
class FoldConvBiasBn(_FoldBnRule):
    name = "fold-conv-bias-bn"
    summary = "BatchNormalization(Conv(x, w, b)) -> Conv(x, w', b')"

    def pattern(self, op, x, w, conv_b, scale, b, mean, var):
        return _bn(op, op.Conv(x, w, conv_b, **_attr_vars(_CONV_ATTRS)), scale, b, mean, var)

    def rewrite(self, op, x, w, conv_b, scale, b, mean, var, epsilon, **attrs):
        attrs = {k: attrs.get(k) for k in _CONV_ATTRS}
        return self._fold(op, x, w, scale, b, mean, var, epsilon, conv_b, attrs)


@register_rule
class FoldConvTransposeBn(_FoldBnRule):
    name = "fold-conv-transpose-bn"
    summary = "BatchNormalization(ConvTranspose(x, w)) -> ConvTranspose(x, w', b')"
    transpose = True

    def pattern(self, op, x, w, scale, b, mean, var):
        conv = op.ConvTranspose(x, w, **_attr_vars(_CONV_TRANSPOSE_ATTRS))
        return _bn(op, conv, scale, b, mean, var)

    def rewrite(self, op, x, w, scale, b, mean, var, epsilon, **attrs):
        attrs = {k: attrs.get(k) for k in _CONV_TRANSPOSE_ATTRS}
        return self._fold(op, x, w, scale, b, mean, var, epsilon, None, attrs)


@register_rule
class FoldConvTransposeBiasBn(_FoldBnRule):
    name = "fold-conv-transpose-bias-bn"
    summary = "BatchNormalization(ConvTranspose(x, w, b)) -> ConvTranspose(x, w', b')"
    transpose = True

    def pattern(self, op, x, w, conv_b, scale, b, mean, var):
        conv = op.ConvTranspose(x, w, conv_b, **_attr_vars(_CONV_TRANSPOSE_ATTRS))
        return _bn(op, conv, scale, b, mean, var)

    def rewrite(self, op, x, w, conv_b, scale, b, mean, var, epsilon, **attrs):
        attrs = {k: attrs.get(k) for k in _CONV_TRANSPOSE_ATTRS}
        return self._fold(op, x, w, scale, b, mean, var, epsilon, conv_b, attrs)


_RULES = (FoldConvBn, FoldConvBiasBn, FoldConvTransposeBn, FoldConvTransposeBiasBn)


@register_pass
class FuseConvBatchNorm(RuleSet):
    """Fold ``BatchNormalization`` into a preceding ``Conv`` or ``ConvTranspose`` (a rule set).

    Rules: ``fold-conv-bn``, ``fold-conv-bias-bn``, ``fold-conv-transpose-bn``,
    ``fold-conv-transpose-bias-bn`` (see :class:`_FoldBnRule` for the check and the math). The
    BN's output name is kept when it is a graph output; the new node's provenance is the union of
    the Conv's and the BN's. ``passctl explain fold-conv-bn MODEL`` tells why a pair did not fold.

    Statistics: ``fused`` (pairs folded, all rules) and the count per rule name.
    """

    name = "fuse-conv-bn"
    summary = "Fold inference BatchNormalization into the preceding Conv or ConvTranspose"

    def __init__(self, options=None, **kwargs):
        super().__init__(_RULES, options, **kwargs)

    def run(self, model: Model) -> PassResult:
        result = super().run(model)
        stats = {"fused": sum(result.stats.values()), **result.stats}
        return PassResult(result.modified, stats)
