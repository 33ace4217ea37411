"""quantize-weights' TensorRT form: ``DequantizeLinear -> MatMul`` (int8 per output channel, int4
blocked at opset 21) for a GPU target with ``--emit tensorrt``.

References are computed here, independently of the pass: the emitted initializers are read with
``onnx.numpy_helper`` (onnx's own INT4 unpacking), dequantized in numpy (``code * scale``, the
scale repeated over its block of K) and multiplied in float64; ONNX Runtime (CPU, optimizations
off, as the TensorRT artifact is checked) and ``onnx.reference`` run the emitted model. The
MatMulNBits comparison unpacks that form's nibbles by its layout (ContribOperators.md).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from passctl.ir import from_onnx, to_onnx
from passctl.ir.errors import UserError
from passctl.passes.quantize.weights import QuantizeWeights
from passctl.support.check import cpu_session
from passctl.support.context import CompileContext
from passctl.support.profiles import get_target


def _mlp(k=128, n=64, n2=24, gemm=False, seed=0, dtype=np.float32, opset=17):
    """x [2, 5, k] (2-D [2, k] with gemm) -> MatMul W1 [k, n] -> Add B1 -> Relu -> MatMul W2
    [n, n2] (or Gemm transB=1, alpha=0.5, C [n2]); every value typed."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((k, n)).astype(dtype)
    b1 = rng.standard_normal(n).astype(dtype)
    w2 = rng.standard_normal((n, n2)).astype(dtype)
    t = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    lead = [2] if gemm else [2, 5]
    inits = [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(b1, "B1")]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
             helper.make_node("Add", ["h", "B1"], ["hb"], name="bias1"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu")]
    if gemm:
        inits += [numpy_helper.from_array(w2.T.copy(), "W2"),
                  numpy_helper.from_array(np.arange(n2).astype(dtype), "C2")]
        nodes.append(helper.make_node("Gemm", ["r", "W2", "C2"], ["y"], name="gemm2", transB=1,
                                      alpha=0.5))
    else:
        inits.append(numpy_helper.from_array(w2, "W2"))
        nodes.append(helper.make_node("MatMul", ["r", "W2"], ["y"], name="mm2"))
    info = [helper.make_tensor_value_info(v, t, lead + [n]) for v in ("h", "hb", "r")]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", t, lead + [k])],
                          [helper.make_tensor_value_info("y", t, lead + [n2])], inits,
                          value_info=info)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), (w1, b1, w2)


def _quantize(proto, target="a10", emitter="tensorrt", **opts):
    model = from_onnx(proto)
    p = QuantizeWeights(**opts)
    p.configure(CompileContext(target=get_target(target), emitter=emitter))
    return model, p.run(model).stats


def _dq_weights(proto):
    """``{MatMul node name: (codes int64 [K, N], scales float64, axis, block, weight float64)}``
    for each DequantizeLinear -> MatMul pair, read with onnx.numpy_helper."""
    inits = {t.name: t for t in proto.graph.initializer}
    producer = {o: n for n in proto.graph.node for o in n.output}
    found = {}
    for mm in proto.graph.node:
        dq = producer.get(mm.input[1]) if mm.op_type == "MatMul" else None
        if dq is None or dq.op_type != "DequantizeLinear":
            continue
        assert len(dq.input) == 2  # no zero point
        attrs = {a.name: helper.get_attribute_value(a) for a in dq.attribute}
        q = numpy_helper.to_array(inits[dq.input[0]]).astype(np.int64)
        s = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float64)
        block = attrs.get("block_size", 0)
        if block:
            assert attrs["axis"] == 0 and s.shape == (q.shape[0] // block, q.shape[1])
            w = q * np.repeat(s, block, axis=0)
        else:
            assert attrs["axis"] == 1 and s.shape == (q.shape[1],)
            w = q * s[None, :]
        found[mm.name] = (q, s, attrs["axis"], block, w, inits[dq.input[0]].data_type)
    return found


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


CASES = [dict(bits=4, block=64), dict(bits=4, block=128), dict(bits=4), dict(bits=8),
         dict(bits=8, block=0), dict(bits=4, block=64, method="mse")]


@pytest.mark.parametrize("opts", CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("gemm", [False, True])
def test_tensorrt_form_matches_numpy_dequantized_matmul(opts, gemm):
    k, n = 256, 128  # both K's multiples of 128: every layer quantized
    proto, (w1, b1, w2) = _mlp(k=k, n=n, gemm=gemm)
    model, stats = _quantize(proto, **opts)
    out = to_onnx(model)
    bits = opts["bits"]
    assert out.opset_import[0].version == (21 if bits == 4 else 17)
    onnx.checker.check_model(out, full_check=True)  # at the model's opset
    ops = [nd.op_type for nd in out.graph.node]
    assert ops.count("DequantizeLinear") == 2 and "MatMulNBits" not in ops and "Gemm" not in ops
    assert all(nd.domain in ("", "ai.onnx") for nd in out.graph.node)
    assert stats["form"] == "DequantizeLinear+MatMul" and stats["quantized_layers"] == 2
    dq = _dq_weights(out)
    assert len(dq) == 2
    wq = {}
    for name, (q, s, axis, block, w, dtype) in dq.items():
        assert dtype == (TensorProto.INT4 if bits == 4 else TensorProto.INT8)
        assert block == (opts.get("block") or 128 if bits == 4 else 0)
        assert np.all(s > 0)  # TensorRT: "Scale coefficients must all be positive"
        assert q.min() >= -(2 ** (bits - 1)) and q.max() <= 2 ** (bits - 1) - 1
        wq["1" if name.startswith("mm1") else "2"] = w
    ref_w2 = 0.5 * w2 if gemm else w2  # Gemm's alpha folded into its quantized weight
    rows = {r["name"]: r for r in stats["layers"]}
    for key, want, w in (("1", w1, wq["1"]), ("2", ref_w2, wq["2"])):
        row = rows["mm1" if key == "1" else ("gemm2" if gemm else "mm2")]
        err = _rel(w, want.astype(np.float64))
        assert err == pytest.approx(row["weight_error"], rel=1e-3)  # what the pass reports
        assert err < (0.13 if bits == 4 else 0.01)
    x = np.random.default_rng(1).standard_normal((2, k) if gemm else (2, 5, k)).astype(np.float32)
    ref = np.maximum(x.astype(np.float64) @ wq["1"] + b1, 0) @ wq["2"]
    if gemm:
        ref = ref + np.arange(24)
    got = cpu_session(out.SerializeToString()).run(None, {"x": x})[0]
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
    evaluated = onnx.ModelProto()
    evaluated.CopyFrom(out)
    if bits == 8:  # onnx.reference implements DequantizeLinear from opset 19 on; MatMul, Add,
        evaluated.opset_import[0].version = 19  # Relu, Gemm and DQ (int8) are the same at 17
    got = ReferenceEvaluator(evaluated).run(None, {"x": x})[0]
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


def test_float16_layers_get_float16_scales():
    proto, (w1, b1, w2) = _mlp(dtype=np.float16)
    model, stats = _quantize(proto, bits=4, block=64)
    out = to_onnx(model)
    onnx.checker.check_model(out, full_check=True)
    dq = _dq_weights(out)
    scales = [t for t in out.graph.initializer if t.name.endswith("_scales")]
    assert len(dq) == 2 and all(t.data_type == TensorProto.FLOAT16 for t in scales)
    x = np.random.default_rng(2).standard_normal((2, 5, 128)).astype(np.float16)
    w = {name[:3]: v[4] for name, v in dq.items()}
    ref = np.maximum(x.astype(np.float64) @ w["mm1"] + b1, 0) @ w["mm2"]
    got = cpu_session(out.SerializeToString()).run(None, {"x": x})[0]
    assert got.dtype == np.float16
    assert np.abs(got - ref).max() <= 1e-2 * np.abs(ref).max()  # float16 arithmetic


def _nbits_codes(proto, node):
    """(codes uint8 [N, k_blocks, block], scales [N, k_blocks]) of a MatMulNBits node."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    n, bits, block = attrs["N"], attrs["bits"], attrs["block_size"]
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    packed = inits[node.input[1]]
    kb = packed.shape[1]
    codes = (np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, kb, block)
             if bits == 4 else packed)
    assert len(node.input) < 4 or not node.input[3]  # symmetric: zero point 2^(bits-1)
    return codes.astype(np.int64), inits[node.input[2]].reshape(n, kb)


@pytest.mark.parametrize("opts", [dict(bits=4, block=64), dict(bits=4, block=128, method="mse"),
                                  dict(bits=8, block=0)],
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_codes_and_scales_equal_the_matmulnbits_path(opts):
    """Same quantizer (the absmax grid), two layouts: MatMulNBits' unsigned codes minus 8 (128)
    and its scales are the INT4 (int8) initializer and scales of the DequantizeLinear form."""
    proto, _ = _mlp(k=256, n=128)
    trt_model, trt_stats = _quantize(proto, **opts)
    cpu_model, cpu_stats = _quantize(proto, target="cpu", emitter="onnxruntime", absmax=True,
                                     accuracy_level=0, **opts)
    trt, cpu = to_onnx(trt_model), to_onnx(cpu_model)
    dq = _dq_weights(trt)
    nbits = [nd for nd in cpu.graph.node if nd.op_type == "MatMulNBits"]
    assert len(nbits) == 2 and len(dq) == 2
    half = 2 ** (opts["bits"] - 1)
    for node, name in zip(nbits, ("mm1", "mm2")):
        codes, scales = _nbits_codes(cpu, node)
        q, s = next(v[:2] for key, v in dq.items() if key.startswith(name))
        k = q.shape[0]
        n_, kb, size = codes.shape
        assert np.array_equal(codes.reshape(n_, kb * size)[:, :k].T - half, q)
        got_s = s.T if opts["bits"] == 4 else s[:, None]
        assert np.array_equal(scales, got_s)
    assert [r["weight_error"] for r in trt_stats["layers"]] == \
        [r["weight_error"] for r in cpu_stats["layers"]]


def test_layer_whose_k_is_not_a_multiple_of_the_block_stays_float():
    proto, _ = _mlp(k=128, n=96)  # mm2's K = 96: not whole blocks of 64
    model, stats = _quantize(proto, bits=4, block=64)
    rows = {r["name"]: r for r in stats["layers"]}
    assert rows["mm2"]["bits"] == 32 and "K=96 is not a multiple of block 64" in rows["mm2"]["why"]
    assert rows["mm1"]["bits"] == 4 and stats["quantized_layers"] == 1
    out = to_onnx(model)
    assert [nd.op_type for nd in out.graph.node].count("DequantizeLinear") == 1


def test_budget_search_measures_the_dequantize_form():
    proto, _ = _mlp(k=128, n=128, seed=3)
    model, stats = _quantize(proto, bits=4, block=64, budget=1e-3, samples=2)
    assert stats["float_layers"] >= 1 and stats["within_budget"] is True
    out = to_onnx(model)
    from passctl.passes.precision.sensitivity import calibration_inputs

    feeds = calibration_inputs(from_onnx(proto), samples=2)
    ref = [cpu_session(proto.SerializeToString()).run(None, f)[0] for f in feeds]
    got = [cpu_session(out.SerializeToString()).run(None, f)[0] for f in feeds]
    assert max(np.abs(g - r).sum() / np.abs(r).sum() for g, r in zip(got, ref)) <= 1e-3


@pytest.mark.parametrize("opts, message", [
    (dict(symmetric=False), "symmetric=false writes zero points, and TensorRT takes "
                            "DequantizeLinear with zero points of 0 only"),
    (dict(symmetric=False, float_zero_points=True), "symmetric=false writes zero points"),
    (dict(absmax=False), "absmax=false is the Q4_0 grid, whose scales can be negative"),
    (dict(accuracy_level=4), "accuracy_level is MatMulNBits' attribute"),
    (dict(bits=8, block=64), "bits=8 with block=64: TensorRT's int8 DequantizeLinear is per "
                             "channel"),
    (dict(bits=4, block=32), "bits=4 with block=32: TensorRT's INT4 block sizes are 64 and 128"),
])
def test_options_tensorrt_cannot_take_are_one_line_errors(opts, message):
    proto, _ = _mlp()
    with pytest.raises(UserError) as e:
        _quantize(proto, **opts)
    assert "quantize-weights for --emit tensorrt (target a10): " + message in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("target, emitter", [("a10", "onnxruntime"), ("h100", "tvm"),
                                             ("cpu", "tvm")])
def test_pairs_without_a_form_are_refused(target, emitter):
    proto, _ = _mlp()
    with pytest.raises(UserError, match=f"quantize-weights: target {target} / emitter {emitter} "
                                        "has no form"):
        _quantize(proto, target=target, emitter=emitter)



@pytest.mark.parametrize("options, message", [
    ("bits=4,symmetric=false", "symmetric=false writes zero points"),
    ("bits=4,block=256", "TensorRT's INT4 block sizes are 64 and 128"),
    ("bits=8,block=32", "TensorRT's int8 DequantizeLinear is per channel"),
])
def test_cli_refuses_before_the_passes_with_exit_2(options, message, tmp_path, cli):
    proto, _ = _mlp()
    onnx.save(proto, str(tmp_path / "m.onnx"))
    rc, _, err = cli(tmp_path / "m.onnx", "--pipeline", f"quantize-weights{{{options}}}",
                     "--target", "a10", "--emit", "tensorrt{build=false}", "-o", tmp_path / "o",
                     "-q")
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err and not (tmp_path / "o").exists()


def test_cli_writes_a_tensorrt_artifact_with_int4_weights(tmp_path, cli):
    """``passctl m.onnx --pipeline quantize-weights{bits=4,block=64} --target a10 --emit
    tensorrt``: the artifact passes the emitter's support table, holds INT4 DequantizeLinear with
    block_size 64 before each MatMul, records them in precision.json, and ONNX Runtime runs it to
    numpy's dequantize-then-matmul of its own initializers."""
    proto, (w1, b1, w2) = _mlp()
    onnx.save(proto, str(tmp_path / "m.onnx"))
    rc, _, err = cli(tmp_path / "m.onnx", "--pipeline", "quantize-weights{bits=4,block=64}",
                     "--target", "a10", "--emit", "tensorrt{build=false}", "-o", tmp_path / "o",
                     "-q")
    assert rc == 0, err
    out = onnx.load(str(tmp_path / "o" / "model.onnx"))
    onnx.checker.check_model(out, full_check=True)
    dq = _dq_weights(out)
    assert len(dq) == 2 and {v[3] for v in dq.values()} == {64}
    assert {v[5] for v in dq.values()} == {TensorProto.INT4}
    table = json.load(open(tmp_path / "o" / "precision.json"))
    dq_rows = [r for r in table["layers"] if r["op"] == "DequantizeLinear"]
    assert len(dq_rows) == 2 and {r["precision"] for r in dq_rows} == {"float32"}
    w = {name[:3]: v[4] for name, v in dq.items()}
    x = np.random.default_rng(3).standard_normal((2, 5, 128)).astype(np.float32)
    ref = np.maximum(x.astype(np.float64) @ w["mm1"] + b1, 0) @ w["mm2"]
    got = cpu_session(str(tmp_path / "o" / "model.onnx")).run(None, {"x": x})[0]
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
    report = json.load(open(tmp_path / "o" / "report.json"))
    text = json.dumps(report)
    assert "DequantizeLinear+MatMul" in text


@pytest.mark.parametrize("bits", [4, 8])
def test_external_weights_are_spilled_and_saved_packed(bits, tmp_path):
    """Weights in external data: the codes go to the spill file (INT4 packed two per byte, as
    ONNX stores it), and the saved model's initializers, read by onnx, run in ONNX Runtime to
    numpy's dequantize-then-matmul."""
    from passctl.ir import load, save

    proto, (w1, b1, w2) = _mlp(k=256, n=128)
    src = tmp_path / "src"
    src.mkdir()
    onnx.save(proto, str(src / "m.onnx"), save_as_external_data=True, location="m.onnx.data",
              size_threshold=0)
    model = load(str(src / "m.onnx"))
    p = QuantizeWeights(bits=bits, block=64 if bits == 4 else None)
    p.configure(CompileContext(target=get_target("a10"), emitter="tensorrt"))
    assert p.run(model).stats["quantized_layers"] == 2
    codes = [v.const for v in model.graph.initializers.values() if v.name.endswith(f"_q{bits}")]
    assert len(codes) == 2 and all(c.external is not None for c in codes)
    assert sorted(c.external.length for c in codes) == sorted(
        [128 * 24 * bits // 8, 256 * 128 * bits // 8])
    save(model, str(tmp_path / "q.onnx"), external_data=True, size_threshold=0)
    out = onnx.load(str(tmp_path / "q.onnx"))
    onnx.checker.check_model(str(tmp_path / "q.onnx"), full_check=True)
    w = {name[:3]: v[4] for name, v in _dq_weights(out).items()}
    assert _rel(w["mm1"], w1.astype(np.float64)) < (0.13 if bits == 4 else 0.01)
    x = np.random.default_rng(4).standard_normal((2, 5, 256)).astype(np.float32)
    ref = np.maximum(x.astype(np.float64) @ w["mm1"] + b1, 0) @ w["mm2"]
    got = cpu_session(str(tmp_path / "q.onnx")).run(None, {"x": x})[0]
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
