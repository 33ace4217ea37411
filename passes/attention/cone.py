"""A computation of a few graph nodes as its own ONNX model, to evaluate it on chosen inputs
(fuse-rotary's cos/sin tables, fuse-attention-past's mask probes)."""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np
import onnx

from passctl.ir import Model, Node, Value
from passctl.passes.common.constants import attr_to_proto, constant_tensor, tensor_to_proto


def subgraph_model(model: Model, nodes: Sequence[Node], inputs: Sequence[Value],
                   outputs: Sequence[Value]) -> onnx.ModelProto:
    """``nodes`` (in graph order) as a model reading ``inputs`` (their element types, every dim
    dynamic) and returning ``outputs``; the constants the nodes read are initializers."""
    inits, protos, done = [], [], set()
    for node in nodes:
        for v in node.inputs:
            t = constant_tensor(v) if v is not None and v.producer is None else None
            if t is not None and v.name not in done:
                done.add(v.name)
                inits.append(tensor_to_proto(t, v.name))
        proto = onnx.helper.make_node(node.op_type, [v.name if v is not None else "" for v in node.inputs],
                                      [v.name for v in node.outputs], domain=node.domain)
        proto.attribute.extend(attr_to_proto(a) for a in node.attributes.values())
        protos.append(proto)
    ins = [onnx.helper.make_tensor_value_info(
        v.name, int(v.dtype), [None] * (v.shape.rank if v.shape is not None and v.shape.rank else 0))
        for v in inputs]
    graph = onnx.helper.make_graph(protos, "subgraph", ins,
                                   [onnx.ValueInfoProto(name=v.name) for v in outputs], inits)
    opsets = [onnx.helper.make_opsetid(k, v) for k, v in model.opset_imports.items()]
    return onnx.helper.make_model(graph, opset_imports=opsets, ir_version=10)


def run_subgraph(proto: onnx.ModelProto, feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
    """Run :func:`subgraph_model`'s model on ONNX Runtime's CPU provider (optimizations off)."""
    from passctl.support.check import cpu_session

    session = cpu_session(proto.SerializeToString(), optimize=False, threads=1)
    return [np.asarray(a) for a in session.run(None, feeds)]


__all__ = ["run_subgraph", "subgraph_model"]
