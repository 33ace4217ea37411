"""fuse-attention on hand-built layers: forms that fuse (all lowerings vs ORT), and refusals with reasons."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Dict, Tuple

import numpy as np
import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from graphs import attention_model, feeds, fp16_cast_attention  # noqa: E402

from passctl.ir import from_onnx, to_onnx  # noqa: E402
from passctl.passes.manager import PassManager  # noqa: E402
from passctl.passes.pipeline_text import build_pipeline  # noqa: E402
from passctl.support.check import compare, run_onnxruntime  # noqa: E402

RTOL = 1e-4


def run(proto: onnx.ModelProto, pipeline: str, target=None) -> Tuple[Dict, onnx.ModelProto]:
    model = from_onnx(proto)
    result = PassManager(build_pipeline(pipeline, target)).run(model)
    stats = {r.name: dict(r.stats) for r in result.records}
    return stats, to_onnx(model)


def ops(proto: onnx.ModelProto):
    return [f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in proto.graph.node]


def assert_same(original: onnx.ModelProto, candidate: onnx.ModelProto) -> None:
    inputs = feeds(original)
    ref = run_onnxruntime(original, inputs)
    result = compare(ref, run_onnxruntime(candidate, inputs))
    assert result.ok(RTOL), result.failures(RTOL)
    assert not np.isnan(ref["y"]).any()


FUSING = {
    "div-after": dict(),
    "mul-after+add-mask": dict(scale_form="mul-after", mask="add"),
    "split-scale+bool-mask": dict(scale_form="split", mask="bool"),
    "k-bthd-0231": dict(k_layout="bthd"),
    "gqa-4-2+add": dict(kv_heads=2, mask="add"),
    "mqa-4-1": dict(kv_heads=1),
    "causal-trilu": dict(causal=True),
    "causal+bool+gqa": dict(causal=True, mask="bool", kv_heads=2),
    "causal+gqa": dict(causal=True, kv_heads=2),
}


@pytest.mark.parametrize("case", list(FUSING))
@pytest.mark.parametrize("lowering", ["lower-onnxruntime", "lower-standard"])
def test_fuses_and_lowers_exactly(case, lowering):
    proto = attention_model(**FUSING[case])
    stats, out = run(proto, f"infer-shapes,fuse-attention,{lowering},dce")
    fuse = stats["fuse-attention"]
    assert fuse["attention"] == 1 and fuse["unfused_softmax"] == 0, fuse["unfused"]
    assert fuse["causal"] == int(FUSING[case].get("causal", False))
    assert fuse["grouped_query"] == int(FUSING[case].get("kv_heads", 4) != 4)
    got = ops(out)
    assert "passctl" not in {o.domain for o in out.opset_import}
    if lowering == "lower-onnxruntime":
        # causal grouped-query attention with a -inf mask -> GroupQueryAttention, else MHA
        kernel = ("GroupQueryAttention" if FUSING[case].get("causal") and FUSING[case].get("kv_heads")
                  else "MultiHeadAttention")
        assert f"com.microsoft::{kernel}" in got and "Softmax" not in got, got
    else:
        assert got.count("Softmax") == 1
    assert_same(proto, out)


@pytest.mark.parametrize("case", ["div-after", "causal+bool+gqa", "gqa-4-2+add"])
def test_opset23_lowers_to_attention_op(case):
    proto = attention_model(opset=23, **FUSING[case])
    for lowering in ("lower-onnxruntime", "lower-standard"):
        stats, out = run(proto, f"infer-shapes,fuse-attention,{lowering},dce")
        assert stats[lowering]["Attention->Attention-23"] == 1
        assert "Attention" in ops(out) and "Softmax" not in ops(out)
        assert_same(proto, out)


def test_flash_attn_alias_per_target():
    proto = attention_model(mask="add")
    _, cpu = run(proto, "flash-attn")
    assert "com.microsoft::MultiHeadAttention" in ops(cpu)
    assert_same(proto, cpu)
    _, tvm = run(proto, "flash-attn", target="tvm")
    assert "passctl::Attention" in ops(tvm)
    _, trt = run(proto, "flash-attn", target="tensorrt")
    assert "Softmax" in ops(trt) and "passctl::Attention" not in ops(trt)  # opset 17: decomposed
    assert_same(proto, trt)


def test_canonical_attributes():
    proto = attention_model(kv_heads=2, scale_form="split", mask="bool", head_size=16)
    model = from_onnx(proto)
    PassManager(build_pipeline("infer-shapes,fuse-attention")).run(model)
    (node,) = [n for n in model.graph if n.op_type == "Attention"]
    assert node.domain == "passctl"
    assert node.attr("num_heads") == 4 and node.attr("kv_num_heads") == 2
    assert node.attr("mask_kind") == "boolean" and node.attr("is_causal") == 0
    assert math.isclose(node.attr("scale"), 1 / 4, rel_tol=1e-6)
    assert [v.shape.dims[1] for v in node.inputs[:3]] == [4, 2, 2]  # K/V before repeat_kv


# Negative cases: each stays unfused and the report names the Softmax with the guard's reason.
NEGATIVE = {
    "scale sqrt(8), head size 64": (dict(head_size=64, scale=1 / math.sqrt(8)),
                                    "not 1/sqrt(head size 64)"),
    "K (B,H,T,D) permuted (0,2,3,1)": (dict(k_layout="bhtd-0231", heads=6, seq=6),
                                       "K has layout (B, S, H, D)"),
    "softmax over axis 2 of 4": (dict(softmax_axis=2, seq=6), "normalizes axis 2 of a rank-4"),
    "mask added after softmax": (dict(mask="add", mask_after_softmax=True), "reaches no MatMul"),
}


@pytest.mark.parametrize("case", list(NEGATIVE))
def test_refused_with_reason(case):
    kwargs, reason = NEGATIVE[case]
    proto = attention_model(**kwargs)
    stats, out = run(proto, "infer-shapes,fuse-attention")
    fuse = stats["fuse-attention"]
    assert fuse["attention"] == 0 and fuse["unfused_softmax"] == 1
    (line,) = fuse["unfused"]
    assert line.startswith("Softmax") and reason in line, line
    assert "passctl::Attention" not in ops(out)


def test_any_scale_option_accepts_a_model_specific_scale():
    proto = attention_model(head_size=64, scale=1 / math.sqrt(8))
    stats, out = run(proto, "infer-shapes,fuse-attention{any_scale=true},lower-onnxruntime,dce")
    assert stats["fuse-attention"]["attention"] == 1
    assert_same(proto, out)


def test_k_bthd_permutation_0231_is_the_correct_transpose():
    # (0,2,3,1) from (B,T,H,D) gives (B,H,D,T) = K^T per head (the legacy exporter's form in MiniLM):
    # it fuses; the same permutation of a (B,H,T,D) key is refused above.
    stats, _ = run(attention_model(k_layout="bthd", heads=6, seq=6), "infer-shapes,fuse-attention")
    assert stats["fuse-attention"]["attention"] == 1


def test_fp32_casts_around_softmax():
    proto = fp16_cast_attention()
    stats, out = run(proto, "infer-shapes,fuse-attention,lower-standard,dce")
    fuse = stats["fuse-attention"]
    assert fuse["attention"] == 1 and fuse["attention-37-mul-after-nomask-fp32"] == 1, fuse
    assert ops(out).count("Cast") == 2  # the decomposed form keeps the float32 softmax
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal((1, 2, 5, 8)).astype(np.float16) for n in "qkv"}
    ref = run_onnxruntime(proto, inputs)["y"].astype(np.float32)
    got = run_onnxruntime(out, inputs)["y"].astype(np.float32)
    assert np.array_equal(ref, got)  # the same ops in the same order: bit-identical


def test_fp16_attention_through_multi_head_attention():
    proto = fp16_cast_attention()
    _, out = run(proto, "flash-attn")
    assert "com.microsoft::MultiHeadAttention" in ops(out) and "Softmax" not in ops(out)
    rng = np.random.default_rng(1)
    inputs = {n: rng.standard_normal((1, 2, 5, 8)).astype(np.float16) for n in "qkv"}
    ref = run_onnxruntime(proto, inputs)["y"].astype(np.float32)
    got = run_onnxruntime(out, inputs)["y"].astype(np.float32)
    assert np.abs(ref - got).max() <= 2e-3 * np.abs(ref).max()  # fp16 rounding


def test_upper_triangle_mask_is_not_marked_causal():
    # Trilu(upper=1) keeps keys j >= i: a valid mask (it fuses, exactly), but not causal.
    proto = attention_model(causal=True, triangle_upper=1)
    stats, out = run(proto, "infer-shapes,fuse-attention,lower-onnxruntime,dce")
    fuse = stats["fuse-attention"]
    assert fuse["attention"] == 1 and fuse["causal"] == 0
    assert_same(proto, out)
