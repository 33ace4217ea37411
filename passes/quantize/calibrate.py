"""Calibration (activation scales) and per-layer sensitivity, one ONNX Runtime session each."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

import numpy as np

from passctl.ir import Builder, DataType, Model, Node, Shape, TensorType, Value
from passctl.passes._snapshot import clone_model
from passctl.passes.precision.sensitivity import Feeds, error_ratio, run_model
from passctl.passes.quantize.layers import QuantLayer
from passctl.passes.quantize.qdq import (ActivationScales, WeightCache, dequantized_weight,
                                         fake_quantized, quantized_output)
from passctl.passes.quantize.scales import activation_scale

logger = logging.getLogger(__name__)


def _tensors(nodes: List[Node], layers: Sequence[QuantLayer], outputs: bool,
             unsigned: bool = False) -> List[Value]:
    """The values that get activation scales: every layer's data input, and with ``outputs`` its
    first output and the value its output QuantizeLinear may follow instead
    (:func:`passctl.passes.quantize.qdq.quantized_output`: a Relu's output in the unsigned form)."""
    values: List[Value] = []
    for layer in layers:
        node = nodes[layer.position]
        values.append(node.inputs[layer.data_index])
        if outputs:
            values.append(node.outputs[0])
            values.append(quantized_output(node, unsigned))
    return list(dict.fromkeys(values))


def calibrate(model: Model, layers: Sequence[QuantLayer], feeds: Feeds, method: str,
              percentile: float, outputs: bool = False, unsigned: bool = False
              ) -> Tuple[ActivationScales, List[Dict[str, np.ndarray]]]:
    """Activation scales of the layers' data inputs (and first outputs with ``outputs``), and the
    float model's outputs, in one run.

    One ONNX Runtime session (:func:`passctl.passes.precision.sensitivity.run_model`, optimizations
    off) runs a copy of ``model`` whose graph outputs are extended with every layer's data input
    (graph inputs are read from the feeds), for each feed. The scales follow
    :func:`passctl.passes.quantize.scales.activation_scale` over all feeds together.

    Args:
        model: the float model (not modified).
        layers: from :func:`passctl.passes.quantize.layers.find_layers` on ``model.graph``.
        feeds: calibration feeds (arrays by graph input name).
        method: ``minmax`` or ``percentile``; ``percentile`` in (0, 100].

    Returns:
        ``(ActivationScales {activation name: float32 scale} with the names whose values were all
        >= 0 as ``nonnegative``, [per feed {model output name: array}])``.

    Raises:
        Exception: whatever ONNX Runtime raises when the model does not run on the feeds.
    """
    work = clone_model(model)
    nodes = list(work.graph)
    originals = [v.name for v in work.graph.outputs]
    exposed: List[str] = []
    tensors = _tensors(nodes, layers, outputs, unsigned)
    for x in tensors:
        if x.is_graph_input() or x.name in exposed or x.name in originals:
            continue
        if x.type is None:
            x.type = TensorType(DataType.FLOAT, None)
        work.graph.outputs = list(work.graph.outputs) + [x]
        exposed.append(x.name)
    results = run_model(work, feeds, outputs=originals + exposed)
    scales = ActivationScales()
    for name in (x.name for x in tensors):
        if name not in scales:
            samples = [f[name] if name in f else r[name] for f, r in zip(feeds, results)]
            scales[name] = activation_scale(samples, method, percentile)
            if all(np.nanmin(s) >= 0 for s in samples if np.size(s)):
                scales.nonnegative.add(name)
    reference = [{k: r[k] for k in originals} for r in results]
    return scales, reference


@dataclass
class Sensitivity:
    """Each layer's local error with only that layer in int8 (its float inputs exact).

    Attributes:
        max_rel: layer position -> max |q - f| / max |f| of its output over the feeds.
        mean_rel: layer position -> sum |q - f| / sum |f|.
        seconds: wall time including building the session.
    """

    max_rel: Dict[int, float] = field(default_factory=dict)
    mean_rel: Dict[int, float] = field(default_factory=dict)
    seconds: float = 0.0


def sensitivity(model: Model, layers: Sequence[QuantLayer], scales: Dict[str, float], feeds: Feeds,
                cache: WeightCache, unsigned: bool = False, outputs: bool = False) -> Sensitivity:
    """Measure every layer's own quantization error in one ONNX Runtime session.

    The session runs a copy of the float graph extended, for each layer, with a clone of the node
    that reads its data input through QuantizeLinear -> DequantizeLinear and its weight through
    the int8 DequantizeLinear (exactly what :func:`passctl.passes.quantize.qdq.apply_qdq` writes);
    the clone's first output (fake-quantized too with ``outputs``) is compared with the float
    output by scalar reductions (``ReduceMax``
    and ``ReduceSum`` of ``|q - f|`` and of ``|f|``), so one run covers every layer whatever the
    model size (the method of amp's :func:`passctl.passes.precision.sensitivity.measure`).
    """
    start = time.perf_counter()
    work = clone_model(model)
    graph = work.graph
    nodes = list(graph)
    b = Builder(graph)  # appends at the end: every original value is defined before
    scalars: List[Value] = []  # the graph outputs (``outputs`` is the option)
    probes: Dict[int, Tuple[str, str, str, str]] = {}

    def scalar(op: str, v: Value) -> Value:
        out = b.op(op, b.op("Abs", v), keepdims=0)
        out.type = TensorType(DataType.FLOAT, Shape(()))
        scalars.append(out)
        return out

    for layer in layers:
        node = nodes[layer.position]
        ins = list(node.inputs)
        x = ins[layer.data_index]
        ins[layer.data_index] = fake_quantized(b, x, scales[x.name], unsigned,
                                               x.name in getattr(scales, "nonnegative", ()))
        ins[layer.weight_index] = dequantized_weight(b, layer, cache)
        out = Value(graph.fresh_name(f"quant_probe_{layer.position}"), node.outputs[0].type)
        extra = [Value(graph.fresh_name("quant_probe_unused")) for _ in node.outputs[1:]]
        graph.append(Node(node.domain, node.op_type, ins, list(node.attributes.values()),
                          [out, *extra], name=graph.fresh_name(f"quant_probe_{layer.name}")))
        ref = node.outputs[0]
        if outputs and ref.name in scales:
            out = fake_quantized(b, out, scales[ref.name], unsigned,
                                 ref.name in getattr(scales, "nonnegative", ()))
        diff = b.op("Sub", out, ref)
        probes[layer.position] = tuple(v.name for v in (
            scalar("ReduceMax", diff), scalar("ReduceSum", diff), scalar("ReduceMax", ref),
            scalar("ReduceSum", ref)))
    graph.outputs = scalars
    results = run_model(work, feeds) if probes else []
    m = Sensitivity()
    for position, (e_max, e_sum, r_max, r_sum) in probes.items():
        m.max_rel[position] = error_ratio(max(float(r[e_max]) for r in results),
                                     max(float(r[r_max]) for r in results))
        m.mean_rel[position] = error_ratio(sum(float(r[e_sum]) for r in results),
                                      sum(float(r[r_sum]) for r in results))
    m.seconds = time.perf_counter() - start
    logger.info("quantize-int8: measured %d layers in %.2f s", len(probes), m.seconds)
    return m

