"""Fusion passes: operator patterns folded or merged into fewer, cheaper nodes (fuse-conv-bn, ...)."""

from passctl.dialect.canonical import SCHEMAS as CANONICAL_OPS
from passctl.passes.fusion.activations import FuseActivations
from passctl.passes.fusion.bn_math import bn_scale_shift, fold_bn_into_conv_weights
from passctl.passes.fusion.fold_batchnorm import FuseConvBatchNorm
from passctl.passes.fusion.gelu import FuseGelu
from passctl.passes.fusion.layernorm import FuseLayerNorm
from passctl.passes.lowering.lower_onnxruntime import LowerOnnxRuntime
from passctl.passes.lowering.lower_standard import LowerStandard
from passctl.passes.lowering.table import register_lowering

__all__ = ["CANONICAL_OPS", "FuseActivations", "FuseConvBatchNorm", "FuseGelu", "FuseLayerNorm",
           "LowerOnnxRuntime", "LowerStandard", "bn_scale_shift", "fold_bn_into_conv_weights",
           "register_lowering"]
