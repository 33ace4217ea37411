"""fuse-projections: sibling MatMuls of one input with constant weights -> one MatMul + Split."""

from __future__ import annotations

from typing import Dict, List

import numpy as np

from passctl.ir import Builder, Graph, Model, Node, Value
from passctl.passes.base import Pass, PassResult
from passctl.passes.common.constants import constant_array
from passctl.passes.registry import register_pass


@register_pass
class FuseProjections(Pass):
    """Fuse the projections that read one activation (Q/K/V, gate/up) into one MatMul.

    Rule: two or more ``MatMul(x, W_i)`` of the same ``x`` whose ``W_i`` are constant 2-D
    ``[K, N_i]`` matrices of x's element type become ``Split(MatMul(x, Concat(W_1 .. W_n,
    axis=1)), [N_1 .. N_n], axis=-1)``, the Split's outputs replacing the MatMuls' in the order of
    the graph (column block i of the product is exactly x . W_i). One weight read and one kernel
    call instead of n: what a decoder's batch-1 step, bound by reading weights, wants; it is the
    layout of onnxruntime-genai's and passctl's own decoders (``qkv_proj``, ``gate_up_proj``).

    Statistics: ``groups`` (fused MatMuls written), ``matmuls`` (MatMuls they replace).
    """

    name = "fuse-projections"
    summary = "Fuse MatMuls of one input with constant weights (Q/K/V, gate/up) into one MatMul + Split"

    def run(self, model: Model) -> PassResult:
        stats = {"groups": 0, "matmuls": 0}
        for graph in model.graphs():
            groups: Dict[Value, List[Node]] = {}
            for node in graph:
                if node.op_type == "MatMul" and node.domain == "" and _weight(node) is not None:
                    groups.setdefault(node.inputs[0], []).append(node)
            for x, nodes in groups.items():
                if len(nodes) > 1 and len({_weight(n).shape[0] for n in nodes}) == 1:
                    _fuse(graph, x, nodes)
                    stats["groups"] += 1
                    stats["matmuls"] += len(nodes)
        return PassResult(stats["groups"] > 0, stats)


def _weight(node: Node):
    """The constant 2-D weight of ``MatMul(x, W)`` in x's element type, else None."""
    w = constant_array(node.inputs[1])
    x = node.inputs[0]
    if w is None or w.ndim != 2 or x.dtype is None or w.dtype != x.dtype.numpy():
        return None
    return w


def _fuse(graph: Graph, x: Value, nodes: List[Node]) -> None:
    weights = [_weight(n) for n in nodes]
    b = Builder(graph, insert=False)
    packed = graph.add_constant(np.concatenate(weights, axis=1), "fused_projection_weight")
    sizes = graph.add_constant(np.array([w.shape[1] for w in weights], np.int64), "fused_projection_split")
    y = b.op("MatMul", x, packed, output_names=["fused_projection"])
    outs = b.op("Split", y, sizes, axis=-1, outputs=len(nodes))
    for new, node in zip(outs, nodes):
        new.type = node.outputs[0].type
    graph.replace_nodes(nodes, b.nodes, [n.outputs[0] for n in nodes], list(outs))


__all__ = ["FuseProjections"]
