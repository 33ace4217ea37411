"""The Triton decode step (targets/tvm/triton_decode.py, triton_decoder.py) under Triton's CPU
interpreter (``TRITON_INTERPRET=1``, in a subprocess: the variable must be set before Triton is
imported): greedy tokens and teacher-forced logits against transformers' fp32 Llama on the same
weights, and the GEMV (fp32 / int8 / int4, each prologue, split-K) against numpy. The GPU numbers
(cosine, speed) come from benchmarks/gpu_decode.py on the H200."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")
pytest.importorskip("transformers")

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(mode: str, *extra: str) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, os.path.join(HERE, "triton_decode_check.py"), mode,
                           *extra], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_gemv_matches_numpy_for_every_weight_format_prologue_and_split():
    cases = _run("gemv")["cases"]
    assert {(c["bits"], c["prologue"], c["split_k"]) for c in cases} == {
        (b, p, s) for b in (16, 8, 4) for p in (0, 1, 2) for s in (1, 2)}
    for c in cases:
        # float32 accumulation of 256 products against float64: a few ulps
        assert c["max_rel"] < 2e-6, c


def test_integer_dot_gemv_matches_numpy_and_its_activation_rounding():
    """gemv_a8_kernel against numpy on the same rounded input (exact integer sums: float32 only in
    the per-block scaling), and against the float input within what int8 rounding of each block
    of 128 can cost (relative 1/254 of a block's max per input)."""
    cases = _run("gemv_a8")["cases"]
    assert {(c["bits"], c["prologue"], c["split_k"]) for c in cases} == {
        (b, p, s) for b in (8, 4) for p in (0, 1, 2) for s in (1, 2)}
    for c in cases:
        assert c["max_rel"] < 1e-6, c
        assert 1e-4 < c["vs_float_input"] < 3e-2, c


def test_code_plane_gemv_and_gemm_match_numpy_for_int8_int4_every_prologue_and_split():
    """gemv_planes_kernel (LOP3 + FADD dequantization of codes in place, input slices scaled by
    2^-shift) against numpy's float64 product with the weight read back from the packed words;
    that weight equals quantize_rtn's (pack_planes moves codes, it does not change them)."""
    everything = _run("gemv_planes")["cases"]
    cases = [c for c in everything if not c.get("gemm")]
    assert {(c["bits"], c["prologue"], c["split_k"]) for c in cases} == {
        (b, p, s) for b in (8, 4) for p in (0, 1, 2) for s in (1, 2)}
    for c in cases:
        assert c["unpack_err"] < 1e-6, c
        assert c["max_rel"] < 2e-6, c
    # gemm_planes_kernel (the prefill GEMM over the same words, one dot per code plane) against
    # numpy's float64 A @ W^T (+ residual)
    gemms = [c for c in everything if c.get("gemm")]
    assert {(c["bits"], c["has_res"]) for c in gemms} == {(b, r) for b in (8, 4)
                                                          for r in (False, True)}
    for c in gemms:
        assert c["max_rel"] < 2e-6, c


def test_half2_gemv_matches_numpy_for_int8_int4_every_prologue_split_and_masking():
    """gemv_half2_kernel's f16x2 arithmetic (emulated in Triton operations: the interpreter runs
    no PTX; test_triton_sass.py assembles the PTX itself, benchmarks/gpu_decode.py runs it)
    against numpy's float64 product with quantize_rtn's dequantized weight. The inputs are
    rounded to fp16 and each word's products summed in fp16, so the bound is fp16's (2^-11 =
    4.9e-4 per product), not float32's; a wrong code or input pairing would be off by O(1).
    Tiles with and without masks, and one input of 1000 (the fp16 sums stay in range)."""
    cases = _run("gemv_half2")["cases"]
    assert {(c["bits"], c["prologue"], c["split_k"]) for c in cases} == {
        (b, p, s) for b in (8, 4) for p in (0, 1, 2, "big") for s in (1, 2)}
    assert {c["even"] for c in cases} == {True, False}
    for c in cases:
        assert c["max_rel"] < 2e-3, c


@pytest.mark.slow
def test_decode_step_greedy_tokens_and_logits_equal_transformers():
    res = _run("generate")
    assert set(res) == {"gqa-unfused", "gqa-fused", "mha-unfused", "mha-fused"}
    for name, r in res.items():
        assert r["tokens"] == r["ref_tokens"], name
        assert r["max_rel"] < 1e-5, (name, r["max_rel"])
        assert r["count_reset"] == 0, name  # the fused merge leaves its counters at zero


@pytest.mark.slow
def test_code_plane_decode_step_equals_transformers_on_the_same_quantized_weights():
    """The decode step with int4 weights in code planes (gemv_planes_kernel in decode,
    gemm_planes_kernel in prefill, no float copy of any weight), and in rows read by the f16x2
    GEMV (layout half2), against transformers' fp32 Llama
    holding quantize_rtn's dequantized weights: every teacher-forced step's logits (int8 planes:
    tests/decoder/test_cuda_artifact.py)."""
    res = _run("generate_planes")
    assert set(res) == {"int4-planes", "int4-half2"}
    for name, r in res.items():
        assert r["tokens"] == r["ref_tokens"], name
    planes, half2 = res["int4-planes"], res["int4-half2"]
    assert planes["max_rel"] < 1e-5, planes["max_rel"]
    assert planes["float_copies"] == 0
    # half2: fp16 products and word sums in every decode GEMV (about 1e-3 here, measured)
    assert half2["max_rel"] < 5e-3, half2["max_rel"]
