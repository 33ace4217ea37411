"""amp's run_model: large initializers reach ONNX Runtime as OrtValues, results equal a plain session."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper

from passctl.ir import from_onnx
from passctl.passes.precision.sensitivity import INJECT_MIN_BYTES, _external_initializers, run_model
from passctl.support.check import run_onnxruntime


def _model() -> onnx.ModelProto:
    """y = (x @ W + b) @ Cast(Wb, float) + Constant(C): W float32 64x64 and Wb bfloat16 64x64 are
    large enough to be injected, b (64 floats, 256 B) stays embedded, and C is the same 64x64 data as
    a Constant node's value."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    wb = rng.standard_normal((64, 64)).astype(ml_dtypes.bfloat16)
    c = rng.standard_normal((64, 64)).astype(np.float32)
    wb_proto = onnx.TensorProto(name="Wb", data_type=onnx.TensorProto.BFLOAT16, dims=[64, 64],
                                raw_data=wb.view(np.uint16).tobytes())
    nodes = [oh.make_node("MatMul", ["x", "W"], ["xw"]), oh.make_node("Add", ["xw", "b"], ["h"]),
             oh.make_node("Cast", ["Wb"], ["wf"], to=onnx.TensorProto.FLOAT),
             oh.make_node("MatMul", ["h", "wf"], ["hw"]),
             oh.make_node("Constant", [], ["C"], value=onnx.numpy_helper.from_array(c, "C")),
             oh.make_node("Add", ["hw", "C"], ["y"])]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [64, 64])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [64, 64])],
                          [onnx.numpy_helper.from_array(w, "W"), onnx.numpy_helper.from_array(b, "b"),
                           wb_proto])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def test_run_model_injects_large_initializers_and_matches_a_plain_session():
    proto = _model()
    model = from_onnx(proto)
    plan, values, embedded = _external_initializers(model)
    assert sorted(values) == ["W", "Wb"] and len(plan) == 2
    assert embedded == 64 * 4 < INJECT_MIN_BYTES
    feeds = [{"x": np.random.default_rng(k).standard_normal((64, 64)).astype(np.float32)}
             for k in range(2)]
    got = run_model(model, feeds)
    for feed, out in zip(feeds, got):
        ref = run_onnxruntime(proto, feed)["y"]  # the whole proto, weights serialized
        assert np.array_equal(out["y"], ref)
        assert np.abs(ref).max() > 1.0


def test_a_tensor_shared_with_a_constant_node_stays_embedded():
    model = from_onnx(_model())
    constant = next(n for n in model.graph if n.op_type == "Constant")
    model.graph.initializers["W"].const = constant.attributes["value"].value  # same Tensor object
    plan, values, _ = _external_initializers(model)
    assert "W" not in values and sorted(values) == ["Wb"]
    feed = {"x": np.ones((64, 64), np.float32)}
    c = onnx.numpy_helper.to_array(_model().graph.node[4].attribute[0].t)
    assert np.array_equal(run_model(model, [feed])[0]["y"],
                          run_onnxruntime(_shared_w(c), feed)["y"])


def _shared_w(c: np.ndarray) -> onnx.ModelProto:
    proto = _model()
    proto.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(c, "W"))
    return proto


def test_an_unused_large_initializer_stays_embedded():
    """ONNX Runtime drops an initializer no node reads and then refuses its OrtValue ("Failed to find
    existing initializer"): run_model must still run such a model (the quantize pass builds them)."""
    proto = _model()
    unused = np.random.default_rng(5).standard_normal((64, 64)).astype(np.float32)
    proto.graph.initializer.append(onnx.numpy_helper.from_array(unused, "unused"))
    model = from_onnx(proto)
    _, values, _ = _external_initializers(model)
    assert sorted(values) == ["W", "Wb"]
    feed = {"x": np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)}
    assert np.array_equal(run_model(model, [feed])[0]["y"], run_onnxruntime(proto, feed)["y"])
