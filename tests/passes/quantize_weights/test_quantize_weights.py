"""quantize-weights (MatMulNBits) and quantize-dynamic (DynamicQuantizeMatMul / MatMulInteger).

References are computed here, independently of the pass: the emitted MatMulNBits initializers are
unpacked by this file's own reading of ONNX Runtime's layout (ContribOperators.md) and multiplied in
numpy; ONNX Runtime runs the emitted model; the dynamic form is simulated in numpy with
DynamicQuantizeLinear's formula.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from passctl.ir import from_onnx, to_onnx
from passctl.ir.errors import UserError
from passctl.passes.quantize.dynamic import QuantizeDynamic
from passctl.passes.quantize.weights import QuantizeWeights
from passctl.support.check import cpu_session


def _mlp(k=96, n=40, n2=24, gemm=False, seed=0, shape=(2, 5)):
    """x [*shape, k] -> MatMul W1 [k, n] (+ bias Add) -> Relu -> MatMul W2 [n, n2] (or Gemm
    transB=1 with bias and alpha=0.5 over 2-D x)."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((k, n)).astype(np.float32)
    b1 = rng.standard_normal(n).astype(np.float32)
    w2 = rng.standard_normal((n, n2)).astype(np.float32)
    inits = [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(b1, "B1")]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
             helper.make_node("Add", ["h", "B1"], ["hb"], name="bias1"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu")]
    if gemm:
        shape = (shape[0],)
        inits += [numpy_helper.from_array(w2.T.copy(), "W2"),
                  numpy_helper.from_array(np.arange(n2, dtype=np.float32), "C2")]
        nodes.append(helper.make_node("Gemm", ["r", "W2", "C2"], ["y"], name="gemm2", transB=1,
                                      alpha=0.5))
    else:
        inits.append(numpy_helper.from_array(w2, "W2"))
        nodes.append(helper.make_node("MatMul", ["r", "W2"], ["y"], name="mm2"))
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      [*shape, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*shape, n2])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), (w1, b1, w2)


def _unpack(proto: onnx.ModelProto, node: onnx.NodeProto) -> np.ndarray:
    """float64 [K, N] weight a MatMulNBits node computes with, read from its initializers."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    k, n, bits, block = attrs["K"], attrs["N"], attrs["bits"], attrs["block_size"]
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    packed = inits[node.input[1]]
    kb = -(-k // block)
    assert packed.shape == (n, kb, block * bits // 8)
    if bits == 4:
        codes = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, kb, block)
    else:
        codes = packed
    scales = inits[node.input[2]].reshape(n, kb).astype(np.float64)
    if len(node.input) > 3 and node.input[3]:
        z = inits[node.input[3]]
        if z.dtype == np.float32:
            zp = z.reshape(n, kb).astype(np.float64)
        elif bits == 4:
            rows = z.reshape(n, -1)
            zp = np.stack([rows & 0x0F, rows >> 4], axis=-1).reshape(n, -1)[:, :kb]
        else:
            zp = z.reshape(n, kb)
    else:
        zp = np.full((n, kb), 2 ** (bits - 1))
    w = (codes.astype(np.float64) - zp[..., None]) * scales[..., None]
    return w.reshape(n, kb * block)[:, :k].T


CASES = [dict(bits=4, block=32), dict(bits=4, block=64, symmetric=False),
         dict(bits=4, block=128, symmetric=False, float_zero_points=True),
         dict(bits=8), dict(bits=8, block=32, symmetric=False), dict(bits=4, block=16)]


@pytest.mark.parametrize("opts", CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("gemm", [False, True])
def test_matmulnbits_matches_numpy_dequantized_matmul(opts, gemm):
    proto, (w1, b1, w2) = _mlp(k=100, n=40, gemm=gemm)
    model = from_onnx(proto)
    result = QuantizeWeights(accuracy_level=0, **opts).run(model)
    out = to_onnx(model)
    nbits = [n for n in out.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == 2 and result.stats["quantized_layers"] == 2
    x = np.random.default_rng(1).standard_normal((2, 100) if gemm else (2, 5, 100)).astype(np.float32)
    wq1, wq2 = (_unpack(out, n) for n in nbits)
    # round to nearest: every weight within half a step of its code's value (clipped values aside)
    rel = np.linalg.norm(wq1 - w1) / np.linalg.norm(w1)
    assert rel < (0.12 if opts["bits"] == 4 else 0.01)
    h = np.maximum(x.astype(np.float64) @ wq1 + b1, 0)
    ref = h @ wq2  # a Gemm's alpha (0.5) is folded into its quantized weight
    if gemm:
        assert np.linalg.norm(wq2 - 0.5 * w2) / np.linalg.norm(0.5 * w2) < 0.12
        ref = ref + np.arange(24)
    got = cpu_session(out.SerializeToString()).run(None, {"x": x})[0]
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


def test_accuracy_level_4_is_int8_compute_close_to_float():
    proto, (w1, b1, w2) = _mlp()
    model = from_onnx(proto)
    QuantizeWeights(bits=4, block=32).run(model)  # default accuracy_level=4
    out = to_onnx(model)
    assert all(helper.get_attribute_value(a) == 4 for n in out.graph.node
               if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "accuracy_level")
    exact = from_onnx(proto)
    QuantizeWeights(bits=4, block=32, accuracy_level=0).run(exact)
    x = np.random.default_rng(2).standard_normal((2, 5, 96)).astype(np.float32)
    a = cpu_session(out.SerializeToString()).run(None, {"x": x})[0]
    b = cpu_session(to_onnx(exact).SerializeToString()).run(None, {"x": x})[0]
    err = np.abs(a - b).sum() / np.abs(b).sum()
    assert 0 < err < 2e-2  # activations rounded to int8 per block: close, not equal


def test_budget_returns_layers_to_float_and_meets_it():
    proto, _ = _mlp(seed=3)
    model = from_onnx(proto)
    budget = 1e-3  # int4 alone gives ~5e-2 mean-rel here: some layer must stay float
    stats = QuantizeWeights(bits=4, block=32, budget=budget, samples=2).run(model).stats
    assert stats["float_layers"] >= 1
    out = to_onnx(model)
    from passctl.passes.precision.sensitivity import calibration_inputs

    feeds = calibration_inputs(from_onnx(proto), samples=2)
    ref = [cpu_session(proto.SerializeToString()).run(None, f)[0] for f in feeds]
    got = [cpu_session(out.SerializeToString(), optimize=True).run(None, f)[0] for f in feeds]
    err = max(np.abs(g - r).sum() / np.abs(r).sum() for g, r in zip(got, ref))
    assert err <= budget
    assert stats["within_budget"] is True
    assert {r["name"]: r["bits"] for r in stats["layers"]}.values() != {4}


def test_tied_weight_keeps_float_copy_for_other_readers():
    rng = np.random.default_rng(4)
    emb = rng.standard_normal((50, 32)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Gather", ["E", "ids"], ["h"], axis=0),
         helper.make_node("Gemm", ["h", "E"], ["y"], transB=1)], "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 50])],
        [numpy_helper.from_array(emb, "E")])
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model = from_onnx(proto)
    QuantizeWeights(bits=8, accuracy_level=0).run(model)
    out = to_onnx(model)
    assert [n.op_type for n in out.graph.node] == ["Gather", "MatMulNBits"]
    assert "E" in {t.name for t in out.graph.initializer}
    ids = np.array([1, 7, 49], np.int64)
    got = cpu_session(out.SerializeToString()).run(None, {"ids": ids})[0]
    ref = emb[ids].astype(np.float64) @ _unpack(out, out.graph.node[1])
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize("bad", [dict(bits=3), dict(block=48), dict(bits=4, block=0),
                                 dict(accuracy_level=7), dict(method="awq"),
                                 dict(float_zero_points=True), dict(budget=-1.0)])
def test_bad_options_are_one_line_user_errors(bad):
    with pytest.raises(UserError) as e:
        QuantizeWeights(**bad)
    assert "\n" not in str(e.value) and "quantize-weights" in str(e.value)


def test_gpu_target_without_tensorrt_is_refused():
    proto, _ = _mlp()
    with pytest.raises(UserError, match="quantize-weights: target a10 / emitter onnxruntime has no "
                                        "form; use --target cpu"):
        QuantizeWeights(target="a10").run(from_onnx(proto))


def _dynamic_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """DynamicQuantizeLinear(x) (uint8, asymmetric per tensor, ONNX opset 11 formula) times
    symmetric per-column int8 w (max |w| / 127), integer dot products, rescaled."""
    lo, hi = min(0.0, float(x.min())), max(0.0, float(x.max()))
    s = (hi - lo) / 255.0
    zp = np.clip(np.rint(-lo / s), 0, 255)
    xq = np.clip(np.rint(x / s) + zp, 0, 255)
    ws = np.abs(w).max(0) / 127.0
    wq = np.clip(np.rint(w / ws), -127, 127)
    return ((xq - zp) @ wq) * s * ws


@pytest.mark.parametrize("form", ["dqmm", "integer"])
def test_dynamic_int8_matches_numpy_simulation(form):
    proto, (w1, b1, w2) = _mlp(seed=5)
    model = from_onnx(proto)
    stats = QuantizeDynamic(form=form, budget=1.0).run(model).stats
    assert stats["quantized_layers"] == 2 and stats["bias_absorbed"] == 1
    out = to_onnx(model)
    ops = [n.op_type for n in out.graph.node]
    if form == "dqmm":
        assert ops == ["DynamicQuantizeMatMul", "Relu", "DynamicQuantizeMatMul"]
    else:
        assert ops.count("MatMulInteger") == 2 and "MatMul" not in ops
    x = np.random.default_rng(6).uniform(-1, 1, (2, 5, 96)).astype(np.float32)
    got = cpu_session(out.SerializeToString(), optimize=True).run(None, {"x": x})[0]
    h = np.maximum(_dynamic_reference(x.reshape(-1, 96).astype(np.float64), w1) + b1, 0)
    ref = _dynamic_reference(h, w2).reshape(2, 5, 24)
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()


def test_dynamic_budget_keeps_the_sensitive_layers_float():
    proto, _ = _mlp(seed=7)
    model = from_onnx(proto)
    stats = QuantizeDynamic(budget=1e-4, samples=2).run(model).stats
    assert stats["quantized_layers"] < 2 and stats["within_budget"]
    assert any(r["precision"] == "fp32" and "rank" in r.get("why", "") for r in stats["layers"])


def _ln_block(post_ln: bool, seed: int = 11, k: int = 48, n: int = 32, shape=(2, 6)):
    """x -> LayerNormalization(gamma, beta) -> {q = MatMul Wq, v = MatMul Wv}; with ``post_ln``
    the LN output also feeds a residual Add (BERT's post-LN block), else only the MatMuls.
    Channel 3 of x is an outlier (x 40), as in BERT's LayerNorm outputs."""
    rng = np.random.default_rng(seed)
    gamma = rng.uniform(0.5, 1.5, k).astype(np.float32)
    gamma[3] = 20.0
    beta = rng.standard_normal(k).astype(np.float32)
    wq = rng.standard_normal((k, n)).astype(np.float32) * 0.1
    wv = rng.standard_normal((k, n)).astype(np.float32) * 0.1
    inits = [numpy_helper.from_array(gamma, "gamma"), numpy_helper.from_array(beta, "beta"),
             numpy_helper.from_array(wq, "Wq"), numpy_helper.from_array(wv, "Wv")]
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln"], name="ln",
                              axis=-1, epsilon=1e-5),
             helper.make_node("MatMul", ["ln", "Wq"], ["q"], name="mm_q"),
             helper.make_node("MatMul", ["ln", "Wv"], ["v"], name="mm_v")]
    outs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, [*shape, n]),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, [*shape, n])]
    if post_ln:
        nodes.append(helper.make_node("Add", ["ln", "x"], ["res"], name="residual"))
        outs.append(helper.make_tensor_value_info("res", TensorProto.FLOAT, [*shape, k]))
    g = helper.make_graph(nodes, "ln_block", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [*shape, k])], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _ln_feeds(seed: int, count: int = 2, shape=(2, 6), k: int = 48):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((*shape, k)).astype(np.float32)} for _ in range(count)]


@pytest.mark.parametrize("post_ln", [False, True])
@pytest.mark.parametrize("alpha", [0.5, 0.8])
def test_smoothing_is_exact_in_fp32_against_onnxruntime_on_the_original(post_ln, alpha):
    """SmoothQuant's rewrite alone (no quantization): folded into gamma/beta when only the
    MatMuls read the LayerNorm, a Mul when the residual reads it too; every output of ONNX
    Runtime on the rewritten model within 1e-5 relative of ONNX Runtime on the original."""
    from passctl.passes.quantize.smooth import (activation_absmax, apply_smoothing,
                                                layernorm_groups)

    proto = _ln_block(post_ln)
    model = from_onnx(proto)
    groups = layernorm_groups(model, [i for i, n in enumerate(model.graph)
                                      if n.op_type == "MatMul"])
    assert len(groups) == 1 and len(groups[0].members) == 2
    activation_absmax(model, groups, _ln_feeds(1))
    assert groups[0].amax.argmax() == 3  # the outlier channel
    folded, muls = apply_smoothing(model, groups, alpha)
    assert (folded, muls) == ((0, 1) if post_ln else (1, 0))
    out = to_onnx(model)
    ops = [n.op_type for n in out.graph.node]
    assert ops.count("Mul") == (1 if post_ln else 0)
    assert {i.name for i in out.graph.initializer}.isdisjoint({"Wq", "Wv"})
    if not post_ln:
        assert "gamma" not in {i.name for i in out.graph.initializer}
    ref_s = cpu_session(proto.SerializeToString())
    got_s = cpu_session(out.SerializeToString())
    for f in _ln_feeds(2):
        for r, g in zip(ref_s.run(None, f), got_s.run(None, f)):
            assert np.abs(g - r).max() <= 1e-5 * np.abs(r).max()
    # the weights really moved: the outlier row of Wq grew by s_3 > 1
    wq = numpy_helper.to_array(next(i for i in out.graph.initializer
                                    if i.name.startswith("Wq")))
    assert np.abs(wq[3]).max() > np.abs(numpy_helper.to_array(proto.graph.initializer[2])[3]).max()


def _output_error(ref_outs, got_outs) -> float:
    """Worst 1 - cosine over outputs and feeds (float64), computed here independently."""
    worst = 0.0
    for rs, gs in zip(ref_outs, got_outs):
        for r, g in zip(rs, gs):
            a, b = r.ravel().astype(np.float64), g.ravel().astype(np.float64)
            worst = max(worst, 1.0 - float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)))
    return worst


def test_smoothed_dynamic_int8_error_is_the_reported_one_and_lower(tmp_path):
    """quantize-dynamic with smoothing on a post-LN block with an outlier channel: the error the
    pass reports is the one ONNX Runtime gives on the calibration feeds against the original,
    and it is below the unsmoothed all-int8 error (also measured here)."""
    proto = _ln_block(True, seed=12)
    feeds = _ln_feeds(3, count=2)
    for i, f in enumerate(feeds):
        np.savez(tmp_path / f"c{i}.npz", **f)
    ref = [cpu_session(proto.SerializeToString()).run(None, f) for f in feeds]
    errors = {}
    for smooth in ("off", "0.8"):
        model = from_onnx(proto)
        stats = QuantizeDynamic(metric="cosine", budget=1.0, calib=str(tmp_path),
                                smooth=smooth).run(model).stats
        assert stats["quantized_layers"] == 2
        out = to_onnx(model)
        s = cpu_session(out.SerializeToString(), optimize=True)
        errors[smooth] = _output_error(ref, [s.run(None, f) for f in feeds])
        assert errors[smooth] == pytest.approx(stats["error"], rel=1e-3, abs=1e-9)
        if smooth == "off":
            assert stats["smoothing"]["alpha"] == "off"
        else:
            assert stats["smoothing"]["alpha"] == 0.8 and stats["smoothing"]["muls"] == 1
    assert errors["0.8"] < errors["off"]


def test_smooth_search_keeps_the_lowest_error():
    proto = _ln_block(True, seed=13)
    model = from_onnx(proto)
    stats = QuantizeDynamic(metric="cosine", budget=1.0, samples=2).run(model).stats
    tried = stats["smoothing"]["tried"]
    assert [t[0] for t in tried] == ["off", 0.5, 0.6, 0.7, 0.8, 0.9]
    best = min(tried, key=lambda t: t[1])
    assert stats["smoothing"]["alpha"] == best[0] and stats["error"] == best[1]


@pytest.mark.parametrize("bad", ["1.5", "-0.1", "smoothquant"])
def test_bad_smooth_option_is_a_one_line_user_error(bad):
    with pytest.raises(UserError, match=r"quantize-dynamic: smooth=.*use search, off or a number"):
        QuantizeDynamic(smooth=bad)
