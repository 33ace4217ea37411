"""Triton kernels the TVM emitter embeds in CUDA artifacts: a GEMM with a fused epilogue and a
FlashAttention-2 forward kernel.

TVM 0.27's wheel has no cuBLAS / cuDNN / CUTLASS dispatch and its tensor-core (WMMA) matmul
schedule crashes on fp16 (docs/tvm.md), so DLight's GEMMs run on CUDA cores and attention
materializes the [B, H, S, T] scores. These kernels are compiled by Triton to PTX ahead of time and
embedded in the artifact as a TVM CUDA module (``targets/tvm/triton_dispatch.py``); the artifact
needs neither Triton nor torch at run time. Triton lowers ``tl.dot`` to tensor-core instructions
(``mma.sync`` on sm_80/sm_89, ``wgmma`` on sm_90).

Every size and stride is a ``tl.constexpr``: TVM artifacts have static shapes, and constant
strides let Triton prove alignment and drop masks.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: ``ACT`` values of :func:`gemm_kernel`'s epilogue.
ACT_NONE, ACT_GELU, ACT_GELU_TANH, ACT_RELU = 0, 1, 2, 3


@triton.jit
def grouped_tile(pid, M: tl.constexpr, N: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """``(pid_m, pid_n)``: the output tile of program ``pid`` of a GEMM, program ids grouped by
    ``GROUP_M`` rows of tiles so neighbouring programs share B tiles in L2 (Triton's matmul
    tutorial ordering)."""
    num_m: tl.constexpr = (M + BLOCK_M - 1) // BLOCK_M
    num_n: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    width: tl.constexpr = GROUP_M * num_n
    first_m = pid // width * GROUP_M
    rows = min(num_m - first_m, GROUP_M)
    return first_m + (pid % width) % rows, (pid % width) // rows


@triton.jit
def gemm_kernel(a_ptr, b_ptr, bias_ptr, res_ptr, c_ptr,
                M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                stride_am: tl.constexpr, stride_ak: tl.constexpr,
                stride_bk: tl.constexpr, stride_bn: tl.constexpr,
                stride_ab: tl.constexpr, stride_bb: tl.constexpr,
                HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
                PRECISION: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_M: tl.constexpr):
    """``C[z] = act(A[z] @ B[z] + bias) + R[z]`` for z = ``program_id(1)``.

    A: [M, K] at ``a_ptr + z * stride_ab``; B: [K, N] at ``b_ptr + z * stride_bb`` (stride 0: one
    weight for every z); bias: [N]; R and C: [M, N] row-major at ``z * M * N``. Accumulation in
    float32; ``PRECISION`` is ``tl.dot``'s ``input_precision`` for float32 inputs ("ieee": fp32
    FMA, "tf32": tensor cores with a 10-bit mantissa, "tf32x3": three TF32 products per pair,
    error-compensated; "none" for fp16 / bf16). GELU is
    0.5 x (1 + erf(x / sqrt 2)) (Hendrycks & Gimpel 2016), GELU_TANH its tanh form. Program ids are
    grouped by ``GROUP_M`` rows of tiles so neighbouring programs share B tiles in L2 (Triton's
    matmul tutorial ordering).
    """
    z = tl.program_id(1)
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + z * stride_ab + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + z * stride_bb + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    mask_m = offs_m[:, None] < M
    mask_n = offs_n[None, :] < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if K % BLOCK_K == 0:
            a = tl.load(a_ptrs, mask=mask_m, other=0.0)
            b = tl.load(b_ptrs, mask=mask_n, other=0.0)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=mask_m & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & mask_n, other=0.0)
        if PRECISION == "none":
            acc = tl.dot(a, b, acc)
        else:
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    if ACT == 1:
        acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
    elif ACT == 2:
        inner = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
        acc = 0.5 * acc * (1.0 + (2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0))
    elif ACT == 3:
        acc = tl.maximum(acc, 0.0)
    c_offs = z * M * N + offs_m[:, None] * N + offs_n[None, :]
    if HAS_RES:
        acc += tl.load(res_ptr + c_offs, mask=mask_m & mask_n, other=0.0).to(tl.float32)
    tl.store(c_ptr + c_offs, acc.to(c_ptr.dtype.element_ty), mask=mask_m & mask_n)


@triton.jit
def attention_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, o_ptr,
                     H: tl.constexpr, GROUP: tl.constexpr, S: tl.constexpr, T: tl.constexpr,
                     D: tl.constexpr, DV: tl.constexpr,
                     sqb: tl.constexpr, sqh: tl.constexpr, sqs: tl.constexpr,
                     skb: tl.constexpr, skh: tl.constexpr, sks: tl.constexpr,
                     svb: tl.constexpr, svh: tl.constexpr, svs: tl.constexpr,
                     smb: tl.constexpr, smh: tl.constexpr, sms: tl.constexpr,
                     SCALE: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
                     NAN_TO_ZERO: tl.constexpr, PRECISION: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """FlashAttention-2 forward (Dao 2023, Algorithm 1): ``O = softmax(Q K^T * SCALE + M) V`` for
    one [BLOCK_M, DV] tile of one (batch, head) = ``program_id(1)``; K/V tiles stream through with
    an online softmax (running max and sum, float32), so the [S, T] scores are never stored.

    Q: [B, H, S, D], K: [B, H / GROUP, T, D], V: [B, H / GROUP, T, DV], O: [B, H, S, DV]
    (contiguous); Q, K and V are read through their batch / head / sequence strides with unit stride
    over the head dim, so a [B, S, H, D] tensor is read in place (query head h reads KV head
    h // GROUP: grouped-query attention). The mask (``MASK`` 1: additive, any float dtype; 2:
    boolean, True = attend) is [*, *, S, T] with strides ``smb``, ``smh``, ``sms`` (0 where it
    broadcasts) and unit stride over T. ``CAUSAL``: key j is visible to query i when j <= i
    (top-left, the ONNX Attention-23 ``is_causal``). A row with no visible key gives NaN, like the
    decomposed softmax, or 0 with ``NAN_TO_ZERO``. ``PRECISION`` is ``tl.dot``'s input precision
    for float32 inputs ("ieee" or "tf32"; "none" for fp16 / bf16).
    """
    LOG2E: tl.constexpr = 1.4426950408889634
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    kvh = h // GROUP
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q_ptrs = q_ptr + b * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :]
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < S) & (offs_d[None, :] < D), other=0.0)
    k_base = k_ptr + b * skb + kvh * skh
    v_base = v_ptr + b * svb + kvh * svh
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)
    if CAUSAL:
        hi = min(T, (start_m + 1) * BLOCK_M)
    else:
        hi = T
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        kt = tl.load(k_base + cols[None, :] * sks + offs_d[:, None],
                     mask=(cols[None, :] < T) & (offs_d[:, None] < D), other=0.0)
        if PRECISION == "none":
            qk = tl.dot(q, kt) * SCALE
        else:
            qk = tl.dot(q, kt, input_precision=PRECISION) * SCALE
        if MASK == 1:
            mv = tl.load(mask_ptr + b * smb + h * smh + offs_m[:, None] * sms + cols[None, :],
                         mask=(offs_m[:, None] < S) & (cols[None, :] < T), other=0.0)
            qk += mv.to(tl.float32)
        elif MASK == 2:
            mv = tl.load(mask_ptr + b * smb + h * smh + offs_m[:, None] * sms + cols[None, :],
                         mask=(offs_m[:, None] < S) & (cols[None, :] < T), other=0)
            qk = tl.where(mv != 0, qk, float("-inf"))
        keep = cols[None, :] < T
        if CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None])
        qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2((qk - m_safe[:, None]) * LOG2E)
        alpha = tl.math.exp2((m_i - m_safe) * LOG2E)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * svs + offs_dv[None, :],
                    mask=(cols[:, None] < T) & (offs_dv[None, :] < DV), other=0.0)
        if PRECISION == "none":
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out = acc / l_i[:, None]
    if NAN_TO_ZERO:
        out = tl.where(l_i[:, None] == 0.0, 0.0, out)
    o_ptrs = o_ptr + (b * H + h) * S * DV + offs_m[:, None] * DV + offs_dv[None, :]
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=(offs_m[:, None] < S) & (offs_dv[None, :] < DV))


__all__ = ["ACT_GELU", "ACT_GELU_TANH", "ACT_NONE", "ACT_RELU", "attention_kernel", "gemm_kernel"]
