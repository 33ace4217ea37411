"""Writing QDQ: int8 weights read through DequantizeLinear, Q -> DQ pairs on activations."""

from __future__ import annotations

from typing import Dict, Iterable, Mapping, Optional

import numpy as np

from passctl.ir import Builder, DataType, Model, Node, TensorType, Value
from passctl.passes.quantize.layers import QuantLayer
from passctl.passes.quantize.scales import QMAX, quantize_weight, weight_scales

QDQ_MIN_OPSET = 13
"""First opset whose QuantizeLinear / DequantizeLinear take ``axis`` (per-channel scales)."""

class WeightCache:
    """Each layer's ``(int8 codes, scales)``, quantized once per pass run, with codes in
    ``[-qmax, qmax]``: 127, or 63 for a CPU whose int8 kernels saturate
    (:attr:`passctl.support.cpu_isa.CpuIsa.int8_weight_qmax`).

    Args:
        qmax: the largest weight code.
    """

    def __init__(self, qmax: int = QMAX):
        self.qmax = qmax
        self._codes: Dict[int, tuple] = {}

    def get(self, layer: QuantLayer) -> tuple:
        """``(int8 codes, float32 scales [C])`` of ``layer.weight`` (:func:`weight_scales`,
        :func:`quantize_weight`), by layer position."""
        if layer.position not in self._codes:
            scales = weight_scales(layer.weight, layer.axis, self.qmax)
            self._codes[layer.position] = (
                quantize_weight(layer.weight, scales, layer.axis, self.qmax), scales)
        return self._codes[layer.position]


def quantized_weight(layer: QuantLayer, cache: Optional[WeightCache] = None) -> tuple:
    """``(int8 codes, float32 scales [C])`` of ``layer.weight`` from ``cache`` (a new 8-bit
    :class:`WeightCache` when None)."""
    return (cache if cache is not None else WeightCache()).get(layer)


def _typed(value: Value, dtype: DataType, like: Optional[Value]) -> Value:
    value.type = TensorType(dtype, like.shape if like is not None else None)
    return value


def dequantized_weight(b: Builder, layer: QuantLayer, cache: Optional[WeightCache] = None) -> Value:
    """``DequantizeLinear(int8 W, scale [C], zero point int8 0 [C], axis)`` built with ``b``; the
    int8 codes are a new initializer named after the layer.

    Returns:
        the float32 weight value (shape of ``layer.weight``) the layer reads instead.
    """
    codes, scales = quantized_weight(layer, cache)
    graph = b.graph
    base = layer.name.replace("/", "_")
    q = graph.add_constant(codes, f"{base}_w_int8")
    s = graph.add_constant(scales, f"{base}_w_scale")
    z = graph.add_constant(np.zeros(scales.shape, np.int8), f"{base}_w_zero_point")
    out = b.op("DequantizeLinear", q, s, z, axis=layer.axis, name=f"{base}_w_dq",
               output_names=[f"{base}_w_dq"])
    out.type = TensorType(DataType.FLOAT, q.shape)
    return out


class ActivationScales(dict):
    """Activation name -> symmetric per-tensor scale (``max |x| / 127``, or the percentile's), plus
    ``nonnegative``: the names whose calibration values were all >= 0 (ReLU outputs, pooled ReLU
    outputs), which the unsigned cpu form codes on [0, 255] with zero point 0."""

    def __init__(self, *args, nonnegative=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.nonnegative = set(nonnegative)


UNSIGNED_ABSORBED = ("Relu",)
"""Ops between a quantized layer and its output QuantizeLinear that ONNX Runtime drops when the
QuantizeLinear's uint8 zero point is 0 (its ``ReluQuantFusion``: the Q clamps at 0 already), so
``DQ -> Conv -> Relu -> Q`` still becomes one QLinearConv."""


def quantized_output(node: Node, unsigned: bool) -> Value:
    """The value whose QuantizeLinear ends ``node``'s int8 unit in the cpu form: the output of a
    Relu that is the only reader of ``node``'s first output (unsigned form only; ONNX Runtime then
    folds the Relu into the Q, see :data:`UNSIGNED_ABSORBED`), else that output itself."""
    y = node.outputs[0]
    uses = y.uses()
    if unsigned and len(uses) == 1 and not y.is_graph_output():
        reader = uses[0][0]
        if reader.op_type in UNSIGNED_ABSORBED and reader.domain in ("", "ai.onnx"):
            return reader.outputs[0]
    return y


def fake_quantized(b: Builder, x: Value, scale: float, unsigned: bool = False,
                   nonnegative: bool = False) -> Value:
    """``DequantizeLinear(QuantizeLinear(x, s, zp), s, zp)`` built with ``b``: ``x`` rounded to the
    symmetric int8 grid of step ``s`` (per tensor), float32 again.

    ``unsigned=False``: int8 codes, zero point 0 (TensorRT). ``unsigned=True``: uint8 codes with
    zero point 128, the same grid (``q_u8 = q_i8 + 128``, saturating at [0, 255] exactly where int8
    saturates at [-128, 127]), the activation type of ONNX Runtime's x86 U8S8 int8 kernels; with
    ``nonnegative`` too (a tensor calibrated >= 0), uint8 codes with zero point 0 and step
    ``s * 127 / 255``: the same range [0, max], twice the resolution, and the zero point at
    which ONNX Runtime drops a Relu before the QuantizeLinear (ONNX Runtime's quantizer codes
    such tensors the same way: asymmetric uint8, min 0).
    """
    graph = b.graph
    base = x.name.replace("/", "_")
    half = unsigned and nonnegative
    s = graph.add_constant(np.array(scale * 127.0 / 255.0 if half else scale, np.float32),
                           f"{base}_scale")
    z = graph.add_constant(np.array(0 if half else 128, np.uint8) if unsigned
                           else np.array(0, np.int8), f"{base}_zero_point")
    q = _typed(b.op("QuantizeLinear", x, s, z, name=f"{base}_q", output_names=[f"{base}_int8"]),
               DataType.UINT8 if unsigned else DataType.INT8, x)
    return _typed(b.op("DequantizeLinear", q, s, z, name=f"{base}_dq", output_names=[f"{base}_dq"]),
                  DataType.FLOAT, x)


def apply_qdq(model: Model, layers: Iterable[QuantLayer], act_scales: Mapping[str, float],
              cache: Optional[WeightCache] = None, unsigned: bool = False,
              outputs: bool = False) -> int:
    """Quantize ``layers`` of ``model`` in place (QDQ format).

    For each layer (by position in ``list(model.graph)``): the weight input reads
    :func:`dequantized_weight`, the data input reads one shared :func:`fake_quantized` copy of the
    activation (scale ``act_scales[name]``), built before the first quantized consumer. Bias inputs
    (Conv's B, Gemm's C) stay float32. With ``outputs``, the layer's first output is quantized too
    (its readers get the fake-quantized copy; a graph output is left as is): ONNX Runtime's QDQ
    node units ``DQ -> Conv/MatMul/Gemm -> Q`` become QLinearConv / QLinearMatMul / QGemm; and
    every later reader of a quantized data input reads its fake-quantized copy too (a ResNet skip
    connection reads the block input as the Conv does), so a Relu before the QuantizeLinear has
    no other reader and is dropped, and ``DQ, DQ -> Add -> Q`` becomes ONNX Runtime's QLinearAdd
    (its own quantizer writes the same; ResNet-50 on an AVX2 EPYC: 1.66x fp32 instead of 1.46x). TensorRT
    (explicit quantization) folds the input-side patterns into its int8 kernels.

    Returns:
        the number of QuantizeLinear / DequantizeLinear nodes added.
    """
    graph = model.graph
    nodes = list(graph)
    shared: Dict[Value, Value] = {}
    added = 0
    for layer in sorted(layers, key=lambda l: l.position):
        node: Node = nodes[layer.position]
        b = Builder(graph, before=node, provenance=node.provenance)
        x = node.inputs[layer.data_index]
        if x in shared.values():  # already the quantized output of an earlier layer
            pass
        else:
            if x not in shared:
                shared[x] = fake_quantized(b, x, act_scales[x.name], unsigned, _nonneg(act_scales, x))
                added += 2
                if outputs:  # cpu form: every later reader takes the int8 copy (docstring)
                    order = {n: k for k, n in enumerate(graph)}
                    dq = shared[x].producer
                    for reader, i in x.uses():
                        if order.get(reader, -1) > order[dq]:
                            reader.set_input(i, shared[x])
            node.set_input(layer.data_index, shared[x])
        old = node.inputs[layer.weight_index]
        node.set_input(layer.weight_index, dequantized_weight(b, layer, cache))
        added += 1
        _drop_if_unused(model, old)
        y = quantized_output(node, unsigned) if outputs else node.outputs[0]
        if y is not node.outputs[0] and y.name not in act_scales:
            y = node.outputs[0]
        if (outputs and not y.is_graph_output() and y.uses() and y.name in act_scales
                and y not in shared):
            readers = y.uses()
            after = Builder(graph, before=y.producer.next, provenance=node.provenance)
            shared[y] = fake_quantized(after, y, act_scales[y.name], unsigned, _nonneg(act_scales, y))
            added += 2
            for reader, i in readers:
                reader.set_input(i, shared[y])
    return added


def _nonneg(act_scales: Mapping[str, float], x: Value) -> bool:
    return x.name in getattr(act_scales, "nonnegative", ())


def _drop_if_unused(model: Model, weight: Value) -> None:
    """Remove the float weight a layer no longer reads when nothing else does (initializer or
    Constant node), so the graph handed to ONNX Runtime holds no dead initializers (ONNX Runtime
    drops those at load, and ``run_model`` hands initializers over by name)."""
    if weight.uses() or weight.is_graph_output():
        return
    graph = model.graph
    if (weight.is_initializer() and not weight.is_graph_input()
            and weight.name in graph.initializers):
        graph.remove_initializer(weight.name)
    elif weight.producer is not None and weight.producer.op_type == "Constant":
        graph.remove(weight.producer)
