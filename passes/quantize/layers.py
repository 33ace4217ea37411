"""Which nodes int8 quantization covers: Conv, MatMul with a constant B, Gemm; their weight axis."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from passctl.ir import DataType, Graph, Node, Value
from passctl.passes.common.constants import constant_node_array

#: Op types that may be quantized, as written in the ``exclude`` option and the report.
#: ``FusedConv`` is ONNX Runtime's Conv + activation (``com.microsoft``, from ``fuse`` on CPU
#: targets): same inputs and weight layout as Conv.
QUANTIZABLE = ("Conv", "FusedConv", "MatMul", "Gemm")


@dataclass
class QuantLayer:
    """One node whose data input and weight become int8.

    Attributes:
        position: index of the node in ``list(graph)`` (stable across ``clone_model``).
        name: the node's name; for a nameless node its first source name (``Conv@57``: the
            importer's ``<op>@<index>``) or ``<op>@<position>``.
        op: its op type.
        data_index: input slot of the activation (X / A), quantized per tensor.
        weight_index: input slot of the constant weight (W / B), quantized per channel.
        weight: the weight as stored (float32; float16 with ``float_types``; a memory map for external data) (Conv ``[C_out, C_in/g, kH, kW]``, MatMul ``[K, N]``,
            Gemm ``[K, N]`` or ``[N, K]`` with transB=1).
        axis: the weight's output-channel axis (Conv 0, MatMul 1, Gemm 0 with transB=1 else 1).
    """

    position: int
    name: str
    op: str
    data_index: int
    weight_index: int
    weight: np.ndarray
    axis: int


class Skipped(NamedTuple):
    """A node of a quantizable op that :func:`find_layers` leaves as it is.

    Attributes:
        op: its op type.
        precision: what it computes in: ``int8`` (already quantized: its weight is read through
            DequantizeLinear), else its data input's type (``fp32``, ``fp16``, ``bf16``, ``i32``...).
        why: why it is not quantized.
    """

    op: str
    precision: str
    why: str


def _precision(data: Optional[Value]) -> str:
    if data is None or data.dtype is None or data.dtype == DataType.FLOAT:
        return "fp32"
    return "fp16" if data.dtype == DataType.FLOAT16 else data.dtype.short_name


def constant_array(value: Optional[Value]) -> Optional[np.ndarray]:
    """The data of an initializer or of a ``Constant`` node's output, else None (PP-OCR exports keep
    their weights in Constant nodes)."""
    if value is None:
        return None
    if value.const is not None:
        return value.const.numpy()
    producer = value.producer
    return constant_node_array(producer) if producer is not None else None


def _slots(node: Node) -> Optional[Tuple[int, int, int]]:
    """(data input, weight input, weight channel axis) of a quantizable node, or None."""
    if node.op_type in ("Conv",) and node.domain in ("", "ai.onnx"):
        return 0, 1, 0
    if node.op_type == "FusedConv" and node.domain == "com.microsoft":
        return 0, 1, 0
    if node.op_type == "MatMul" and node.domain in ("", "ai.onnx"):
        return 0, 1, 1
    if node.op_type == "Gemm" and node.domain in ("", "ai.onnx"):
        return 0, 1, 0 if node.attr("transB", 0) else 1
    return None


def _type_word(t: DataType) -> str:
    return {DataType.FLOAT: "float32", DataType.FLOAT16: "float16"}.get(t, t.short_name)


def quantizable_nodes(graph: Graph) -> List[Tuple[str, Node]]:
    """``(layer name, node)`` for every node of a :data:`QUANTIZABLE` op in ``graph`` (main graph),
    named as :class:`QuantLayer` names them, whatever its dtypes."""
    return [(node.name or (node.provenance[0] if node.provenance else f"{node.op_type}@{p}"), node)
            for p, node in enumerate(graph) if _slots(node) is not None]


def find_layers(graph: Graph, exclude: Sequence[str] = (),
                float_types: Sequence[DataType] = (DataType.FLOAT,)
                ) -> Tuple[List[QuantLayer], Dict[str, Skipped]]:
    """The quantizable nodes of ``graph`` (main graph only) and why the other candidates are not.

    A node qualifies when its op is in :data:`QUANTIZABLE`, its data input is a non-constant
    value of one of ``float_types`` (default float32 only; weight-only quantization also takes
    float16), and its weight is a constant array of the same type (initializer or Constant node)
    of rank 2 (MatMul, Gemm) or 3-5 (Conv). ``exclude`` names nodes (name or a provenance name) or
    op types. A weight in external data is a memory map (``Tensor.numpy``), not read here.

    Returns:
        ``(layers, {node name: Skipped})`` for the nodes of a quantizable op that are not layers
        (excluded, already int8, not float32, no constant weight).
    """
    wanted = set(exclude)
    layers: List[QuantLayer] = []
    skipped: Dict[str, Skipped] = {}
    for position, node in enumerate(graph):
        slots = _slots(node)
        if slots is None:
            continue
        source = node.provenance[0] if node.provenance else f"{node.op_type}@{position}"
        name = node.name or source
        data_index, weight_index, axis = slots
        data = node.inputs[data_index] if len(node.inputs) > data_index else None
        w_value = node.inputs[weight_index] if len(node.inputs) > weight_index else None
        precision = _precision(data)

        def skip(why: str, precision: str = precision) -> None:
            skipped[name] = Skipped(node.op_type, precision, why)

        if w_value is not None and w_value.producer is not None \
                and w_value.producer.op_type == "DequantizeLinear":
            skip("already quantized (its weight is read through DequantizeLinear)", "int8")
            continue
        if node.op_type in wanted or name in wanted or wanted.intersection(node.provenance):
            skip("excluded (exclude option)")
            continue
        weight = constant_array(w_value)
        if data is None or constant_array(data) is not None:
            skip("its data input is a constant")
            continue
        if data.dtype is not None and data.dtype not in float_types:
            skip(f"its data input is {data.dtype.short_name}, not "
                 f"{' or '.join(_type_word(t) for t in float_types)}")
            continue
        if weight is None:
            skip("its weight is not a constant")
            continue
        rank_ok = weight.ndim == 2 if node.op_type in ("MatMul", "Gemm") else 3 <= weight.ndim <= 5
        wanted_np = (np.dtype(np.float32),) if data.dtype is None else (data.dtype.numpy(),)
        if weight.dtype not in wanted_np or not rank_ok:
            skip(f"weight {weight.dtype} of rank {weight.ndim} is not supported")
            continue
        layers.append(QuantLayer(position, name, node.op_type, data_index, weight_index,
                                 weight, axis))
    return layers, skipped
