"""INT8 post-training quantization (the ``quantize`` alias): calibration, QDQ, accuracy budget."""

from passctl.passes.quantize.layers import QuantLayer, find_layers
from passctl.passes.quantize.quantize_int8 import QuantizeInt8
from passctl.passes.quantize.scales import activation_scale, quantize_weight, weight_scales

__all__ = ["QuantLayer", "QuantizeInt8", "activation_scale", "find_layers", "quantize_weight",
           "weight_scales"]
