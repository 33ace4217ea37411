"""Constant-value helpers shared by the cleanup passes: which values are constants, and their data."""

from __future__ import annotations

from typing import Optional

import numpy as np
import onnx
import onnx.numpy_helper

from passctl.ir import Attr, AttrType, DataType, Node, Tensor, Value

# Default-domain ops whose result is not a function of their inputs: never folded, never merged.
# Source: the ONNX operator list (Random*, Multinomial, Bernoulli draw samples; Dropout in training
# mode draws a mask).
RANDOM_OPS = frozenset({
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
    "Bernoulli", "Dropout",
})

STANDARD_DOMAINS = frozenset({"", "ai.onnx"})


def is_standard_op(node: Node) -> bool:
    """True when ``node`` is a default-domain ONNX operator (``""`` or ``"ai.onnx"``)."""
    return node.domain in STANDARD_DOMAINS


def is_pure(node: Node) -> bool:
    """True when ``node`` is a deterministic default-domain op without subgraphs.

    Custom-domain ops and model-local function calls count as impure: passctl cannot tell what
    they compute.
    """
    return is_standard_op(node) and node.op_type not in RANDOM_OPS and not node.subgraphs()


def constant_node_array(node: Node) -> Optional[np.ndarray]:
    """The value of a ``Constant`` node as a numpy array, or None when it is not one we can read.

    Reads the ``value``, ``value_float(s)``, ``value_int(s)`` and ``value_string(s)`` attributes
    (ONNX Constant-13 spec). Sparse values and attribute references (inside functions) give None.
    """
    if node.op_type != "Constant" or not is_standard_op(node) or len(node.attributes) != 1:
        return None
    (attr,) = node.attributes.values()
    if attr.ref_attr_name:
        return None
    kind = attr.name
    if kind == "value" and isinstance(attr.value, Tensor):
        return attr.value.numpy()
    if kind == "value_float":
        return np.array(attr.value, dtype=np.float32)
    if kind == "value_floats":
        return np.array(attr.value, dtype=np.float32).reshape(-1)
    if kind == "value_int":
        return np.array(attr.value, dtype=np.int64)
    if kind == "value_ints":
        return np.array(attr.value, dtype=np.int64).reshape(-1)
    if kind == "value_string":
        v = attr.value
        return np.array(v.decode() if isinstance(v, bytes) else v, dtype=object)
    if kind == "value_strings":
        return np.array([v.decode() if isinstance(v, bytes) else v for v in attr.value],
                        dtype=object).reshape(-1)
    return None


def constant_tensor(value: Optional[Value]) -> Optional[Tensor]:
    """The constant data behind ``value`` as a :class:`Tensor`, or None when it is not a constant.

    A value is constant when it is an initializer that is not also a graph input (a graph input
    with a default can be overridden at run time), or the output of a readable ``Constant`` node.
    """
    if value is None:
        return None
    if value.const is not None:
        if value.is_graph_input():
            return None
        return value.const
    node = value.producer
    if node is not None and node.op_type == "Constant":
        if node.attributes.get("value") is not None and isinstance(node.attr("value"), Tensor):
            return node.attr("value")
        arr = constant_node_array(node)
        if arr is not None:
            return Tensor(arr)
    return None


def constant_array(value: Optional[Value]) -> Optional[np.ndarray]:
    """Like :func:`constant_tensor` but returns the numpy data (read-only; copy before changing)."""
    t = constant_tensor(value)
    return None if t is None else t.numpy()


def attr_to_proto(attr: Attr) -> onnx.AttributeProto:
    """Convert a non-graph attribute to an ``onnx.AttributeProto`` (for one-node evaluation).

    Raises:
        ValueError: for graph attributes and attribute references, which a one-node model cannot hold.
    """
    if attr.ref_attr_name or attr.type in (AttrType.GRAPH, AttrType.GRAPHS):
        raise ValueError(f"attribute '{attr.name}' cannot be converted on its own")
    if attr.type == AttrType.TENSOR:
        return onnx.helper.make_attribute(attr.name, tensor_to_proto(attr.value))
    if attr.type == AttrType.TENSORS:
        return onnx.helper.make_attribute(attr.name, [tensor_to_proto(t) for t in attr.value])
    if attr.type in (AttrType.FLOATS, AttrType.INTS, AttrType.STRINGS):
        return onnx.helper.make_attribute(attr.name, list(attr.value), attr_type=int(attr.type))
    if attr.type in (AttrType.FLOAT, AttrType.INT, AttrType.STRING):
        return onnx.helper.make_attribute(attr.name, attr.value, attr_type=int(attr.type))
    raise ValueError(f"attribute '{attr.name}' of kind {attr.type.name} is not supported here")


def tensor_to_proto(tensor: Tensor, name: str = "") -> onnx.TensorProto:
    """A ``TensorProto`` with the tensor's data inline (raw bytes; typed fields for strings)."""
    if tensor.source_proto is not None:
        proto = onnx.TensorProto()
        proto.CopyFrom(tensor.source_proto)
        proto.name = name or proto.name
        return proto
    if tensor.dtype == DataType.STRING:
        return onnx.numpy_helper.from_array(np.asarray(tensor.numpy(), dtype=object),
                                            name or tensor.name)
    proto = onnx.TensorProto()
    proto.name = name or tensor.name
    proto.data_type = int(tensor.dtype)
    proto.dims.extend(tensor.dims)
    proto.raw_data = tensor.tobytes()
    return proto
