"""Helpers shared by the CLI tests: file digests, a small Conv+BN model, unused initializers."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def conv_bn_proto() -> onnx.ModelProto:
    """x[1,3,8,8] -> Identity -> Conv(4 out, 3x3, pad 1, bias) -> BatchNormalization(eps 1e-3,
    non-unit statistics) -> Relu -> y[1,4,8,8]."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
        numpy_helper.from_array(rng.uniform(0.5, 2.0, 4).astype(np.float32), "scale"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "bias"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "mean"),
        numpy_helper.from_array(rng.uniform(0.5, 3.0, 4).astype(np.float32), "var"),
    ]
    nodes = [
        helper.make_node("Identity", ["x"], ["xi"], name="id0"),
        helper.make_node("Conv", ["xi", "w", "b"], ["c"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["n"],
                         name="bn0", epsilon=1e-3),
        helper.make_node("Relu", ["n"], ["y"], name="relu0"),
    ]
    graph = helper.make_graph(
        nodes, "conv_bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _used_names(graph: onnx.GraphProto) -> set:
    """Every value name a node of ``graph`` or of its subgraphs reads, and the graph outputs."""
    used = {o.name for o in graph.output}
    for node in graph.node:
        used.update(node.input)
        for attr in node.attribute:
            for sub in list(attr.graphs) + ([attr.g] if attr.HasField("g") else []):
                used |= _used_names(sub)
    return used


def unused_initializers(path) -> list:
    """Names of the initializers of the ONNX model at ``path`` that nothing reads (weights not loaded)."""
    proto = onnx.load(str(path), load_external_data=False)
    used = _used_names(proto.graph)
    return [t.name for t in proto.graph.initializer if t.name not in used]
