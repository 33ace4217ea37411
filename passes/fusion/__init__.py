"""Fusion passes: operator patterns folded or merged into fewer, cheaper nodes (fuse-conv-bn, ...)."""

from passctl.passes.fusion.bn_math import bn_scale_shift, fold_bn_into_conv_weights
from passctl.passes.fusion.fold_batchnorm import FuseConvBatchNorm

__all__ = ["FuseConvBatchNorm", "bn_scale_shift", "fold_bn_into_conv_weights"]
