"""amp's Cast writer: weights converted once, interface types kept, no Cast ping-pong, typed graphs run."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser

from amp_graphs import layernorm_model, run_amp
from passctl.ir import from_onnx, to_onnx
from passctl.passes.common import InferShapes
from passctl.passes.precision import simplify_casts
from passctl.support.check import run_onnxruntime


def _shared_weight_model() -> onnx.ModelProto:
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    two (float[4,32] x) => (float[4,32] y)
    {
      a = MatMul(x, w)
      r = Relu(a)
      b = MatMul(r, w)
      t = Transpose <perm=[1,0]> (b)
      u = Transpose <perm=[1,0]> (t)
      y = Add(u, x)
    }
    """)
    w = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32) / 6
    model.graph.initializer.append(onnx.numpy_helper.from_array(w, "w"))
    return model


def _ops(proto):
    return [n.op_type for n in proto.graph.node]


def test_weight_converted_once_and_interface_kept():
    proto = _shared_weight_model()
    x = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)
    reference = run_onnxruntime(proto, {"x": x})["y"]
    out, stats = run_amp(proto, "amp{dtype=fp16,measure=false}", "a100")
    inits = {i.name: i for i in out.graph.initializer}
    assert [i.data_type for i in inits.values()] == [onnx.TensorProto.FLOAT16]  # one copy, fp16
    assert np.array_equal(onnx.numpy_helper.to_array(next(iter(inits.values()))),
                          onnx.numpy_helper.to_array(proto.graph.initializer[0]).astype(np.float16))
    assert stats["weights_converted"] == 1 and stats["weight_bytes_saved"] == 32 * 32 * 2
    assert out.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert out.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert out.graph.output[0].name == "y"
    # a100: the real typed graph, one Cast in (x) and one out (y); the Transposes follow in fp16
    assert _ops(out).count("Cast") == 2 and stats["emulated"] is False
    assert all(e["precision"] == "fp16" for e in stats["nodes"])
    got = run_onnxruntime(out, {"x": x})["y"]  # ORT's CPU EP runs fp16 graphs (its own kernels/casts)
    assert np.abs(got - reference).max() / np.abs(reference).max() < 5e-3


def test_cpu_target_emulates_and_rounds_like_fp16():
    proto = _shared_weight_model()
    x = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)
    out, stats = run_amp(proto, "amp{dtype=bf16,measure=false}", "cpu")
    assert stats["emulated"] is True and stats["emulated_nodes"] == 4  # 2 MatMul, Add; Relu: no bf16 CPU kernel
    got = run_onnxruntime(out, {"x": x})["y"]
    # numpy emulation of the same rounding: bf16 storage of every node output, float32 compute
    import ml_dtypes
    bf = lambda v: np.asarray(v, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)  # noqa
    w = bf(onnx.numpy_helper.to_array(proto.graph.initializer[0]))
    a = bf(bf(x) @ w)
    b = bf(bf(np.maximum(a, 0)) @ w)
    expected = bf(b + bf(x))
    assert np.allclose(got, expected, rtol=0, atol=np.abs(expected).max() * 2 ** -7)


def test_keep_io_false_makes_the_interface_low():
    out, _ = run_amp(_shared_weight_model(), "amp{dtype=fp16,measure=false,keep_io=false}", "t4")
    assert out.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    assert out.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    assert "Cast" not in _ops(out)
    x = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float16)
    assert run_onnxruntime(out, {"x": x})["y"].dtype == np.float16


def test_simplify_casts_removes_ping_pong_and_keeps_rounding():
    model = from_onnx(onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    casts (float16[8] h, float[8] f, bool[8] m) => (float16[8] y1, float[8] y2, float16[8] y3, float[8] y4)
    {
      h32 = Cast <to=1> (h)
      y1 = Cast <to=10> (h32)
      f16 = Cast <to=10> (f)
      y2 = Cast <to=1> (f16)
      m32 = Cast <to=1> (m)
      y3 = Cast <to=10> (m32)
      same = Cast <to=1> (f)
      y4 = Relu(same)
    }
    """))
    InferShapes().run(model)
    removed = simplify_casts(model.graph)
    nodes = {n.outputs[0].name: n for n in model.graph}
    assert nodes["y1"].op_type == "Cast" and nodes["y1"].inputs[0].name == "h"  # f16 -> f32 -> f16: exact
    assert nodes["y2"].inputs[0].name == "f16"  # f32 -> f16 -> f32 is a rounding: kept
    assert nodes["y3"].inputs[0].name == "m"  # bool -> f32 -> f16 == bool -> f16
    assert nodes["y4"].inputs[0].name == "f"  # Cast to its own type is gone
    assert removed == 3 and sorted(n.op_type for n in model.graph) == ["Cast"] * 4 + ["Relu"]
    h = np.arange(8).astype(np.float16) / 3
    f = np.linspace(-1, 1, 8).astype(np.float32) / 3
    m = np.array([0, 1] * 4, bool)
    got = run_onnxruntime(to_onnx(model), {"h": h, "f": f, "m": m})
    assert np.array_equal(got["y1"], h) and np.array_equal(got["y2"], f.astype(np.float16).astype(np.float32))
    assert np.array_equal(got["y3"], m.astype(np.float16)) and np.array_equal(got["y4"], np.maximum(f, 0))


def test_values_read_by_a_subgraph_stay_float32():
    proto = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    branch (float[4,32] x, bool c) => (float[4,32] y, float[4,32] z)
    {
      a = MatMul(x, w)
      h = Relu(a)
      z = MatMul(h, w)
      y = If(c) <then_branch = g1 () => (float[4,32] t) { t = Mul(a, a) },
                 else_branch = g2 () => (float[4,32] e) { e = Add(h, h) }>
    }
    """)
    w = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32) / 6
    proto.graph.initializer.append(onnx.numpy_helper.from_array(w, "w"))
    out, stats = run_amp(proto, "amp{dtype=fp16,measure=false}", "a100")
    why = [(e["op"], e["precision"], e.get("why")) for e in stats["nodes"]]
    assert why[:3] == [("MatMul", "fp32", "read-by-subgraph"), ("Relu", "fp32", "read-by-subgraph"),
                       ("MatMul", "fp16", None)]
    x = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)
    for c in (True, False):
        feed = {"x": x, "c": np.array(c)}
        got, want = run_onnxruntime(out, feed), run_onnxruntime(proto, feed)
        assert np.array_equal(got["y"], want["y"])
        assert np.abs(got["z"] - want["z"]).max() <= 5e-3 * np.abs(want["z"]).max()


def test_keep_io_false_with_a_float32_node_on_the_input():
    proto = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[8] x) => (float[8] y)
    {
      e = Exp(x)
      y = Mul(e, x)
    }
    """)
    out, stats = run_amp(proto, "amp{dtype=fp16,measure=false,keep_io=false}", "t4")
    assert [(e["op"], e["precision"]) for e in stats["nodes"]] == [("Exp", "fp32"), ("Mul", "fp16")]
    x = np.linspace(-2, 2, 8).astype(np.float16)
    got = run_onnxruntime(out, {"x": x})["y"]
    assert got.dtype == np.float16
    want = np.exp(x.astype(np.float32)).astype(np.float16).astype(np.float32) * x.astype(np.float32)
    assert np.allclose(got.astype(np.float32), want, rtol=1e-3)


def test_after_fuse_the_fused_norm_runs_in_fp16():
    proto = layernorm_model()
    out, stats = run_amp(proto, "cleanup,fuse,amp{dtype=fp16,samples=1}", "a100")
    ops = {(e["op"], e["precision"]) for e in stats["nodes"]}
    assert ops == {("LayerNormalization", "fp16"), ("MatMul", "fp16")}, ops
    x = (np.random.default_rng(4).standard_normal((2, 64)) * 300).astype(np.float32)
    x[0, 0] = 800.0  # LayerNormalization keeps its statistics in float32 (stash_type=1)
    got, want = run_onnxruntime(out, {"x": x})["y"], run_onnxruntime(proto, {"x": x})["y"]
    assert np.isfinite(got).all() and np.abs(got - want).max() <= 5e-3 * np.abs(want).max()
    assert [n.op_type for n in out.graph.node].count("Cast") == 2  # in and out, nothing between


def test_onnxruntime_contrib_norm_runs_in_fp16_with_its_float_outputs_kept():
    proto = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
    skip (float[2,8,32] x, float[2,8,32] s) => (float[2,8,32] y, float[2,8,1] mean)
         <float[2,8,32] n, float[2,8,1] inv, float[2,8,32] total>
    {
      h = MatMul(x, w)
      n, mean, inv, total = com.microsoft.SkipLayerNormalization <epsilon=1e-5> (h, s, gamma, beta)
      y = MatMul(n, w)
    }
    """)
    rng = np.random.default_rng(5)
    for name, arr in (("w", rng.standard_normal((32, 32)) / 6), ("gamma", 1 + 0.1 * rng.standard_normal(32)),
                      ("beta", 0.1 * rng.standard_normal(32))):
        proto.graph.initializer.append(onnx.numpy_helper.from_array(arr.astype(np.float32), name))
    out, stats = run_amp(proto, "amp{dtype=fp16,measure=false}", "a100")
    assert [(e["op"], e["precision"]) for e in stats["nodes"]] == [
        ("MatMul", "fp16"), ("SkipLayerNormalization", "fp16"), ("MatMul", "fp16")]
    skip_node = next(n for n in out.graph.node if n.op_type == "SkipLayerNormalization")
    assert list(skip_node.output[1:3]) == ["mean", "inv"]  # float32 statistics outputs not retyped
    feed = {"x": rng.standard_normal((2, 8, 32)).astype(np.float32),
            "s": rng.standard_normal((2, 8, 32)).astype(np.float32)}
    got, want = run_onnxruntime(out, feed), run_onnxruntime(proto, feed)
    assert got["mean"].dtype == np.float32
    assert np.abs(got["y"] - want["y"]).max() <= 5e-3 * np.abs(want["y"]).max()
