"""amp rules: decomposed LayerNorm statistics and float32-min masks stay float32 and stay finite."""

from __future__ import annotations

import numpy as np
import pytest

from amp_graphs import F32_MIN, layernorm_model, masked_attention_model, run_amp
from passctl.ir import DataType, from_onnx, to_onnx
from passctl.passes.common import InferShapes
from passctl.passes.precision import apply_precision, layernorm_chains, rule_fp32_nodes
from passctl.passes.precision.ops import convertible
from passctl.passes.precision.rules import becomes_inf
from passctl.support.check import run_onnxruntime


def _naive_all_low(proto, low=DataType.FLOAT16):
    """Every convertible node in low precision, no rules: what the rules protect against."""
    model = from_onnx(proto)
    InferShapes().run(model)
    apply_precision(model, [n for n in model.graph if convertible(n)], low,
                    emulate=lambda n: n.op_type not in ("Transpose", "Cast"))
    return to_onnx(model)


def _rel(got, reference) -> float:
    return float(np.abs(got - reference).max() / np.abs(reference).max())


def test_becomes_inf_matches_numpy_rounding():
    assert not becomes_inf(65504.0, DataType.FLOAT16)
    assert not becomes_inf(65519.0, DataType.FLOAT16)  # rounds down to 65504
    assert becomes_inf(65520.0, DataType.FLOAT16)
    assert becomes_inf(-F32_MIN, DataType.BFLOAT16)  # float32 max rounds up to inf in bf16
    assert not becomes_inf(3.0e38, DataType.BFLOAT16)


def test_layernorm_chain_found():
    model = from_onnx(layernorm_model())
    InferShapes().run(model)
    graph = model.graph
    ops = sorted(n.op_type for n in layernorm_chains(graph))
    assert ops == ["Add", "Add", "Div", "Mul", "Pow", "ReduceMean", "ReduceMean", "Sqrt", "Sub"]
    reasons = rule_fp32_nodes(graph, DataType.FLOAT16)
    assert {n.op_type for n in reasons} == set(ops)
    assert all(r == "layernorm-statistics" for r in reasons.values())


def test_layernorm_input_800_stays_finite_in_fp16():
    proto = layernorm_model()
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((2, 64)) * 300).astype(np.float32)
    x[0, 0], x[1, 5] = 800.0, -800.0
    reference = run_onnxruntime(proto, {"x": x})["y"]
    naive = run_onnxruntime(_naive_all_low(proto), {"x": x})["y"]
    # (x - mean)**2 > 65504 is inf in fp16: the variance is inf and every normalized value 0
    assert not np.isfinite(naive).all() or _rel(naive, reference) > 0.5
    for target in ("cpu", "a100"):  # emulated, and the real fp16 typed graph (ORT's fp16 kernels)
        candidate, stats = run_amp(proto, "amp{dtype=fp16,budget=1e-2,samples=1}", target)
        got = run_onnxruntime(candidate, {"x": x})["y"]
        assert np.isfinite(got).all()
        assert _rel(got, reference) < 5e-3
        matmul = next(e for e in stats["nodes"] if e["op"] == "MatMul")
        assert matmul["precision"] == "fp16"
        assert {e["op"] for e in stats["nodes"] if e.get("why") == "layernorm-statistics"} == {
            "ReduceMean", "Sub", "Pow", "Add", "Sqrt", "Div", "Mul"}
        assert [e["op"] for e in stats["nodes"] if e["precision"] == "fp16"] == ["MatMul"]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_float32_min_mask_gives_no_nan(dtype):
    # In both low types float32 min is -inf, and (1 - 1) * -inf is NaN: the mask ops must not be low.
    low = DataType.FLOAT16 if dtype == "fp16" else DataType.BFLOAT16
    with np.errstate(over="ignore"):
        assert np.isneginf(np.float32(F32_MIN).astype(low.numpy()))
    proto = masked_attention_model()
    candidate, stats = run_amp(proto, f"amp{{dtype={dtype},budget=5e-2,samples=1}}")
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((8, 16)) * 4).astype(np.float32)
    tol = 5e-3 if dtype == "fp16" else 3e-2
    for mask in ([1, 1, 1, 1, 1, 0, 0, 0], [0] * 8):  # the second masks every key (uniform attention)
        feed = {"x": x, "mask": np.array(mask, np.int64)}
        reference = run_onnxruntime(proto, feed)["y"]
        got = run_onnxruntime(candidate, feed)["y"]
        assert np.isfinite(reference).all() and not np.isnan(got).any()
        assert _rel(got, reference) < tol
    assert stats["clamped"] == 0
    mask_nodes = [e for e in stats["nodes"] if e.get("why", "").startswith("mask-constant")]
    assert [e["op"] for e in mask_nodes] == ["Mul"]
    assert [e["precision"] for e in stats["nodes"] if e["op"] == "Softmax"] == ["fp32"]
    assert all(e["precision"] == dtype for e in stats["nodes"] if e["op"] == "MatMul")
