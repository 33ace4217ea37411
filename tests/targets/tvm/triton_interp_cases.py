"""Numerics of targets/tvm/triton_kernels.py under Triton's interpreter vs numpy (a script)."""

# Run as ``TRITON_INTERPRET=1 python triton_interp_cases.py``: Triton picks its interpreter when
# ``@triton.jit`` decorates, i.e. when ``passctl.targets.tvm.triton_kernels`` is imported, so these
# cases run in their own process (test_triton_kernels.py starts it once) and never share a process
# with tests that import the kernels for compilation. Prints one JSON object:
# ``{"interpreted": bool, "cases": {name: {"rel": float, "nan_match": bool, "nan_rows": int,
# "zero_rows": int}}}``; ``rel`` is max |got - want| / max |want| over the entries where the
# reference is finite.

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np

#: case name -> relative tolerance (fp32 kernels accumulate in float32, fp16 ones round P to fp16).
GEMM_CASES = {
    "gemm_plain": 1e-5, "gemm_bias": 1e-5, "gemm_bias_gelu": 1e-5, "gemm_bias_gelu_tanh": 1e-5,
    "gemm_bias_relu": 1e-5, "gemm_bias_residual": 1e-5, "gemm_residual_only": 1e-5,
    "gemm_k_multiple_of_block": 1e-5, "gemm_b_transposed": 1e-5, "gemm_batched_shared_b": 1e-5,
    "gemm_tf32x3": 1e-5, "gemm_fp16_bias_gelu_residual": 5e-3,
}
ATTENTION_CASES = {
    "attn_no_mask_fp16": 5e-3, "attn_no_mask_fp32": 1e-5, "attn_additive_key_padding": 1e-5,
    "attn_boolean_mask": 5e-3, "attn_causal": 5e-3, "attn_causal_s_gt_t": 5e-3,
    "attn_gqa": 5e-3, "attn_head_80": 5e-3, "attn_dv_differs": 5e-3, "attn_bshd_inputs": 5e-3,
    "attn_fully_masked_row_nan": 1e-5, "attn_nan_to_zero": 1e-5,
}
CASES = {**GEMM_CASES, **ATTENTION_CASES}

_RNG = np.random.default_rng(0)
_erf = np.vectorize(math.erf)


def _compare(got: np.ndarray, want: np.ndarray) -> dict:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    finite = np.isfinite(want)
    rel = float(np.max(np.abs(got[finite] - want[finite])) / np.max(np.abs(want[finite])))
    if np.isnan(got[finite]).any():
        rel = float("inf")
    rows = lambda x: int(np.all(x, axis=-1).sum())  # noqa: E731
    return {"rel": rel, "nan_match": bool(np.array_equal(np.isnan(got), np.isnan(want))),
            "nan_rows": rows(np.isnan(got)), "zero_rows": rows(got == 0)}


def _gemm(torch, kern, dtype="float32", z=1, m=70, n=48, k=40, bias=True, act=0, res=False,
          transposed=False, shared_b=True, precision="ieee", blocks=(32, 32, 16)):
    a = _RNG.standard_normal((z, m, k)).astype(dtype)
    b = (_RNG.standard_normal((k, n)) / math.sqrt(k)).astype(dtype)
    bv = _RNG.standard_normal(n).astype(dtype)
    r = _RNG.standard_normal((z, m, n)).astype(dtype)
    b_store = np.ascontiguousarray(b.T) if transposed else b
    sbk, sbn = (1, k) if transposed else (n, 1)
    c = torch.empty((z, m, n), dtype=getattr(torch, dtype))
    t = lambda x: torch.from_numpy(np.ascontiguousarray(x))  # noqa: E731
    bm, bn, bk = blocks
    grid = (math.ceil(m / bm) * math.ceil(n / bn), z)
    kern.gemm_kernel[grid](t(a), t(b_store), t(bv), t(r), c, M=m, N=n, K=k, stride_am=k,
                           stride_ak=1, stride_bk=sbk, stride_bn=sbn, stride_ab=m * k,
                           stride_bb=0, HAS_BIAS=bias, ACT=act, HAS_RES=res,
                           PRECISION="none" if dtype != "float32" else precision,
                           BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=2)
    want = a.astype(np.float64) @ b.astype(np.float64)
    if bias:
        want = want + bv.astype(np.float64)
    if act == kern.ACT_GELU:
        want = 0.5 * want * (1 + _erf(want / math.sqrt(2)))
    elif act == kern.ACT_GELU_TANH:
        want = 0.5 * want * (1 + np.tanh(math.sqrt(2 / math.pi) * (want + 0.044715 * want ** 3)))
    elif act == kern.ACT_RELU:
        want = np.maximum(want, 0)
    if res:
        want = want + r.astype(np.float64)
    return _compare(c.float().numpy(), want)


def _bhsd_strides(heads, seq, dim, bshd):
    return (seq * heads * dim, dim, heads * dim) if bshd else (heads * seq * dim, seq * dim, dim)


def _attention(torch, kern, dtype="float16", b=2, h=2, kvh=2, s=37, t=45, d=16, dv=None,
               mask=None, causal=False, nan_to_zero=False, bshd=False, blocks=(16, 16)):
    """``mask``: None, "additive" ([B, 1, 1, T], -1e4 on 30 % of keys), "boolean" ([1, 1, S, T],
    key 0 always visible) or "dead_row" (boolean [1, 1, S, T] with query 3 seeing no key)."""
    dv = dv or d
    q = _RNG.standard_normal((b, h, s, d)).astype(dtype)
    k = _RNG.standard_normal((b, kvh, t, d)).astype(dtype)
    v = _RNG.standard_normal((b, kvh, t, dv)).astype(dtype)
    bias = np.zeros((b, 1, s, t))
    kind, smb, smh, sms, mt = 0, 0, 0, 0, q
    if mask == "additive":
        m = np.where(_RNG.random((b, 1, 1, t)) < 0.3, -1e4, 0).astype(dtype)
        kind, smb, mt = 1, t, torch.from_numpy(m)
        bias = bias + m.astype(np.float64)
    elif mask in ("boolean", "dead_row"):
        m = _RNG.random((1, 1, s, t)) < 0.7
        m[..., 0] = True
        if mask == "dead_row":
            m[..., 3, :] = False
        kind, sms, mt = 2, t, torch.from_numpy(m)
        bias = bias + np.where(m, 0, -np.inf)
    if causal:
        bias = bias + np.triu(np.full((s, t), -np.inf), 1)
    store = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3) if bshd else x)  # noqa: E731
    o = torch.empty((b, h, s, dv), dtype=getattr(torch, dtype))
    sq, sk, sv = (_bhsd_strides(h, s, d, bshd), _bhsd_strides(kvh, t, d, bshd),
                  _bhsd_strides(kvh, t, dv, bshd))
    scale = 1 / math.sqrt(d)
    bm, bn = blocks
    kern.attention_kernel[(math.ceil(s / bm), b * h)](
        torch.from_numpy(store(q)), torch.from_numpy(store(k)), torch.from_numpy(store(v)),
        mt if kind else o, o, H=h, GROUP=h // kvh, S=s, T=t, D=d, DV=dv,
        sqb=sq[0], sqh=sq[1], sqs=sq[2], skb=sk[0], skh=sk[1], sks=sk[2],
        svb=sv[0], svh=sv[1], svs=sv[2], smb=smb, smh=smh, sms=sms, SCALE=scale, MASK=kind,
        CAUSAL=causal, NAN_TO_ZERO=nan_to_zero,
        PRECISION="none" if dtype != "float32" else "ieee", BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_D=max(16, 1 << (d - 1).bit_length()), BLOCK_DV=max(16, 1 << (dv - 1).bit_length()))
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    k64, v64 = np.repeat(k64, h // kvh, axis=1), np.repeat(v64, h // kvh, axis=1)
    scores = scale * q64 @ k64.transpose(0, 1, 3, 2) + bias
    with np.errstate(invalid="ignore"):
        p = np.exp(scores - scores.max(-1, keepdims=True))
        want = (p / p.sum(-1, keepdims=True)) @ v64
    if nan_to_zero:
        want = np.nan_to_num(want, nan=0.0)
    return _compare(o.float().numpy(), want)


def run_all() -> dict:
    """Every case of :data:`CASES` (needs TRITON_INTERPRET=1 set before this process imported
    triton)."""
    import torch
    from triton.runtime.interpreter import InterpretedFunction

    from passctl.targets.tvm import triton_kernels as kern

    interpreted = all(isinstance(f, InterpretedFunction)
                      for f in (kern.gemm_kernel, kern.attention_kernel))
    g, a = (lambda **kw: _gemm(torch, kern, **kw)), (lambda **kw: _attention(torch, kern, **kw))
    out = {
        "gemm_plain": g(bias=False),
        "gemm_bias": g(),
        "gemm_bias_gelu": g(act=kern.ACT_GELU),
        "gemm_bias_gelu_tanh": g(act=kern.ACT_GELU_TANH),
        "gemm_bias_relu": g(act=kern.ACT_RELU),
        "gemm_bias_residual": g(res=True),
        "gemm_residual_only": g(bias=False, res=True),
        "gemm_k_multiple_of_block": g(k=64, act=kern.ACT_GELU, res=True),
        "gemm_b_transposed": g(transposed=True, act=kern.ACT_RELU),
        "gemm_batched_shared_b": g(z=2, act=kern.ACT_GELU, res=True),
        "gemm_tf32x3": g(precision="tf32x3"),
        "gemm_fp16_bias_gelu_residual": g(dtype="float16", act=kern.ACT_GELU, res=True),
        "attn_no_mask_fp16": a(),
        "attn_no_mask_fp32": a(dtype="float32"),
        "attn_additive_key_padding": a(dtype="float32", mask="additive"),
        "attn_boolean_mask": a(mask="boolean"),
        "attn_causal": a(s=45, causal=True),
        "attn_causal_s_gt_t": a(s=45, t=30, causal=True),
        "attn_gqa": a(h=4, kvh=2, causal=True),
        "attn_head_80": a(d=80, h=2, kvh=1),
        "attn_dv_differs": a(d=80, dv=48),
        "attn_bshd_inputs": a(h=4, kvh=2, bshd=True, causal=True),
        "attn_fully_masked_row_nan": a(dtype="float32", mask="dead_row"),
        "attn_nan_to_zero": a(dtype="float32", mask="dead_row", nan_to_zero=True),
    }
    assert set(out) == set(CASES), set(out) ^ set(CASES)
    return {"interpreted": interpreted, "cases": out}


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("set TRITON_INTERPRET=1 (Triton's interpreter) before running this script")
    json.dump(run_all(), sys.stdout)
