"""Small ONNX graphs that tests in several folders build (tests/ is on sys.path via its conftest)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def conv_relu_conv(path) -> str:
    """x [1, 8, 16, 16] -> Conv(16, 3x3) -> Relu -> Conv(8, 3x3) -> y, weights N(0, 0.3) seeded 0,
    saved as ``path``; returns ``str(path)``."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (16, 8, 3, 3)).astype(np.float32), "W1"),
             numpy_helper.from_array(rng.normal(0, 0.3, (8, 16, 3, 3)).astype(np.float32), "W2")]
    nodes = [helper.make_node("Conv", ["x", "W1"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "W2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(
        nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)
