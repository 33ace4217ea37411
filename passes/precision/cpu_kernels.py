"""Which ops ONNX Runtime's CPU execution provider can load in fp16/bf16 (probed once per signature)."""

from __future__ import annotations

import functools
import logging
from typing import Tuple

import onnx
import onnx.helper

from passctl.ir import Node
from passctl.passes.common.constants import attr_to_proto
from passctl.passes.precision.ops import is_compute

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=None)
def _loads(domain: str, op_type: str, opset: int, inputs: Tuple[int, ...], outputs: Tuple[int, ...],
           attrs: Tuple[bytes, ...]) -> bool:
    import onnxruntime as ort

    ins = [onnx.helper.make_tensor_value_info(f"x{i}", t, None) for i, t in enumerate(inputs)]
    outs = [onnx.helper.make_tensor_value_info(f"y{i}", t, None) for i, t in enumerate(outputs)]
    node = onnx.helper.make_node(op_type, [v.name for v in ins], [v.name for v in outs], domain=domain)
    for raw in attrs:
        a = onnx.AttributeProto()
        a.ParseFromString(raw)
        node.attribute.append(a)
    graph = onnx.helper.make_graph([node], "probe", ins, outs)
    imports = [onnx.helper.make_opsetid("", opset)]
    if domain not in ("", "ai.onnx"):
        imports.append(onnx.helper.make_opsetid(domain, 1))
    model = onnx.helper.make_model(graph, opset_imports=imports)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as e:  # NOT_IMPLEMENTED (no kernel) or a type error: either way, no kernel
        logger.debug("ORT CPU cannot load %s-%d with %s: %s", op_type, opset, inputs, e)
        return False
    return True


def ort_cpu_loads(node: Node, opset: int) -> bool:
    """Whether ONNX Runtime's CPU EP loads ``node`` with the element types its inputs and outputs have
    now (a one-node session; cached per op, opset, types and attributes); unknown types: False.

    ORT 1.32 measured here: fp16 loads for the common ops (it adds its own Casts around some),
    bf16 only for data movement (Transpose, Concat, ...), not for MatMul, Add, Mul, Softmax, Erf.
    """
    values = list(node.inputs) + list(node.outputs)
    if any(v is None or v.dtype is None for v in values):
        return False  # omitted optional inputs or unknown types: not probed
    ins = tuple(int(v.dtype) for v in node.inputs)
    outs = tuple(int(o.dtype) for o in node.outputs)
    domain = node.domain or ""
    try:
        attrs = tuple(attr_to_proto(a).SerializeToString() for a in node.attributes.values())
    except ValueError:
        return False
    return _loads(domain, node.op_type, opset, ins, outs, attrs)


def needs_emulation(node: Node, opset: int) -> bool:
    """CPU policy: every op that rounds (COMPUTE_OPS) computes in float32 behind a low-precision
    interface, so the CPU result rounds like a GPU kernel with float32 accumulation whatever kernels
    ORT has; exact ops stay native unless ORT's CPU EP cannot load them with their current types."""
    if is_compute(node):
        return True
    return not ort_cpu_loads(node, opset)
