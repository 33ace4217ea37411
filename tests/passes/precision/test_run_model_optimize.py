"""run_model(optimize=True) runs what an ONNX Runtime artifact ships: ORT_ENABLE_ALL's int8 kernels."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import onnxruntime as ort

from passctl.ir import from_onnx
from passctl.passes.precision.sensitivity import run_model


def _qdq_conv() -> onnx.ModelProto:
    """ONNX Runtime's cpu QDQ form: uint8 activations (zero point 128), int8 per-channel weights
    (16x8x3x3 = 1152 bytes, injected as an OrtValue), ``DQ -> Conv -> Q -> DQ``, which ORT_ENABLE_ALL
    turns into QLinearConv."""
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (16, 8, 3, 3)).astype(np.int8)
    ws = (rng.random(16).astype(np.float32) + 0.5) * 0.01
    init = [nh.from_array(w, "w"), nh.from_array(ws, "ws"), nh.from_array(np.zeros(16, np.int8), "wz"),
            nh.from_array(np.float32(4.0 / 127), "xs"), nh.from_array(np.uint8(128), "xz"),
            nh.from_array(np.float32(6.0 / 127), "ys"), nh.from_array(np.uint8(128), "yz"),
            nh.from_array(rng.standard_normal(16).astype(np.float32) * 0.1, "b")]
    nodes = [oh.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             oh.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             oh.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             oh.make_node("Conv", ["xd", "wd", "b"], ["c"], pads=[1, 1, 1, 1]),
             oh.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"]),
             oh.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["y"])]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                                 [1, 8, 16, 16])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 16, 16, 16])],
                          init)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)])


def _session(proto: onnx.ModelProto, level) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    return ort.InferenceSession(proto.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def test_optimize_runs_the_fused_int8_kernels_a_session_json_session_runs():
    proto = _qdq_conv()
    feeds = [{"x": np.random.default_rng(s).uniform(-4, 4, (1, 8, 16, 16)).astype(np.float32)}
             for s in (1, 2)]
    level = ort.GraphOptimizationLevel
    shipped, plain = _session(proto, level.ORT_ENABLE_ALL), _session(proto, level.ORT_DISABLE_ALL)
    fused = run_model(from_onnx(proto), feeds, optimize=True)
    unfused = run_model(from_onnx(proto), feeds)
    for feed, got_fused, got_plain in zip(feeds, fused, unfused):
        want_fused, want_plain = shipped.run(None, feed)[0], plain.run(None, feed)[0]
        np.testing.assert_array_equal(got_fused["y"], want_fused)
        np.testing.assert_array_equal(got_plain["y"], want_plain)
        # the fused kernel's fixed-point requantization rounds some values to another step
        assert np.count_nonzero(want_fused != want_plain) > 0
