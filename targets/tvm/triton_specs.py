"""Tile candidates and kernel specializations for the Triton GEMM and FlashAttention kernels
(:mod:`passctl.targets.tvm.triton_kernels`): what each Relax call needs, compiled through a
:class:`~passctl.targets.tvm.triton_library.TritonLibrary`."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Dict, List, Tuple

from passctl.targets.tvm.triton_library import Kernel, TritonLibrary, _cdiv, _compile_fitting

logger = logging.getLogger(__name__)

TUNE_REP_MS = 100
"""Milliseconds ``triton.testing.do_bench`` times each tile candidate for when tuning. A choice is
made once per specialization (:func:`_once`), so one timing decides every layer that shares it:
long enough that noise does not pick between near-equal tiles (20 ms, when every layer re-timed
its candidates, gave BERT's identical FFN-up GEMMs two different tiles on the H200)."""


# -- GEMM ------------------------------------------------------------------------------------

def _gemm_candidates(dtype: str, precision: str) -> List[Dict[str, int]]:
    # (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages), largest tile first: without tuning the first
    # whose grid fills the SMs is taken
    if dtype == "float32" and precision == "ieee":
        # (32, 128, *) and (64, 64, 16, 4, 3): the fastest on the H200 for BERT's QKV and FFN-up
        # shapes (benchmarks/gpu_gemm_sweep.py, 2026-11-29)
        tiles = [(128, 128, 32, 8, 3), (128, 128, 16, 8, 3), (128, 64, 32, 8, 3), (64, 128, 32, 4, 3),
                 (64, 64, 32, 4, 3), (64, 64, 16, 4, 4), (64, 64, 16, 4, 3), (32, 128, 32, 4, 3),
                 (32, 128, 16, 4, 3), (32, 64, 32, 4, 3)]
    elif dtype == "float32":
        tiles = [(128, 128, 32, 8, 3), (128, 64, 32, 4, 3), (64, 64, 32, 4, 4), (64, 128, 32, 4, 3)]
    else:
        tiles = [(128, 256, 64, 8, 3), (128, 128, 64, 8, 3), (128, 128, 64, 4, 4), (128, 64, 64, 4, 4),
                 (64, 128, 64, 4, 4), (64, 64, 64, 4, 4)]
    return [{"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "num_warps": w, "num_stages": s}
            for m, n, k, w, s in tiles]


@dataclass(frozen=True)
class GemmSpec:
    """``C[z] = act(A[z] @ B + bias) + R[z]`` with A [Z, M, K] and B [K, N] (``b_transposed``:
    B is stored [N, K]); dtypes all ``dtype``."""

    z: int
    m: int
    n: int
    k: int
    dtype: str
    b_transposed: bool = False
    bias: bool = False
    act: int = 0
    residual: bool = False

    def label(self) -> str:
        from passctl.targets.tvm.triton_kernels import ACT_GELU, ACT_GELU_TANH, ACT_RELU

        parts = [f"gemm {self.z * self.m}x{self.k}x{self.n} {self.dtype}"]
        if self.b_transposed:
            parts.append("B^T")
        if self.bias:
            parts.append("+bias")
        parts += [{ACT_GELU: "gelu", ACT_GELU_TANH: "gelu_tanh", ACT_RELU: "relu"}.get(self.act, "")]
        if self.residual:
            parts.append("+residual")
        return " ".join(p for p in parts if p)


def _once(lib: TritonLibrary, key, build):
    """``build()``'s ``(kernel, grid)``, computed once per ``key`` in ``lib``: a model's repeated
    layers share each specialization's compilation and tile tuning (BERT-base's 12 FFN-up GEMMs
    were tuned 12 times, and timing noise gave them two different tiles)."""
    hit = lib.specialized.get(key)
    if hit is None:
        hit = lib.specialized[key] = build()
    return hit


def gemm_kernel_for(lib: TritonLibrary, spec: GemmSpec) -> Tuple[Kernel, Tuple[int, int, int]]:
    """Compile (once per ``spec`` in ``lib``) the GEMM kernel for ``spec``; returns it and its grid.

    Raises:
        ValueError: no tile configuration fits the device's shared memory.
    """
    return _once(lib, ("gemm", spec), lambda: _gemm_kernel_for(lib, spec))


def _gemm_kernel_for(lib: TritonLibrary, spec: GemmSpec) -> Tuple[Kernel, Tuple[int, int, int]]:
    """:func:`gemm_kernel_for` without the cache."""
    from passctl.targets.tvm.triton_kernels import gemm_kernel

    precision = "none" if spec.dtype != "float32" else lib.fp32_precision
    m = spec.z * spec.m  # rows of every z are contiguous: one [Z*M, K] GEMM
    sbk, sbn = (1, spec.k) if spec.b_transposed else (spec.n, 1)

    def constexprs(c):
        return {"M": m, "N": spec.n, "K": spec.k, "stride_am": spec.k, "stride_ak": 1,
                "stride_bk": sbk, "stride_bn": sbn, "stride_ab": 0, "stride_bb": 0,
                "HAS_BIAS": spec.bias, "ACT": spec.act, "HAS_RES": spec.residual,
                "PRECISION": precision, "BLOCK_M": c["BLOCK_M"], "BLOCK_N": c["BLOCK_N"],
                "BLOCK_K": c["BLOCK_K"], "GROUP_M": 8}

    def grid_of(c):
        return _cdiv(m, c["BLOCK_M"]) * _cdiv(spec.n, c["BLOCK_N"])

    def bench(c):
        import torch
        import triton.testing

        dt = getattr(torch, spec.dtype)
        a = torch.randn(m, spec.k, device="cuda", dtype=dt)
        b = torch.randn(*((spec.n, spec.k) if spec.b_transposed else (spec.k, spec.n)),
                        device="cuda", dtype=dt)
        bias = torch.randn(spec.n, device="cuda", dtype=dt)
        out = torch.empty(m, spec.n, device="cuda", dtype=dt)
        args = constexprs(c)
        run = lambda: gemm_kernel[(grid_of(c), 1)](a, b, bias, out, out, **args,  # noqa: E731
                                                   num_warps=c["num_warps"],
                                                   num_stages=c["num_stages"])
        return triton.testing.do_bench(run, warmup=5, rep=TUNE_REP_MS)

    pointers = {p: spec.dtype for p in ("a_ptr", "b_ptr", "bias_ptr", "res_ptr", "c_ptr")}
    kernel, c = _compile_fitting(lib, gemm_kernel, pointers, constexprs,
                                 _gemm_candidates(spec.dtype, precision), grid_of, bench,
                                 spec.label())
    return kernel, (grid_of(c), 1, 1)


# -- attention -------------------------------------------------------------------------------

@dataclass(frozen=True)
class AttentionSpec:
    """Q [B, H, S, D], K [B, KVH, T, D], V [B, KVH, T, DV], optional mask [mb, mh, S, T]
    (``mask_shape`` is its full 4-d broadcast shape; ``mask_kind`` 0 none, 1 additive, 2 boolean).
    ``bshd``: for Q, K, V, whether the buffer is stored [B, S, H, D] (read in place) rather than
    [B, H, S, D]."""

    b: int
    h: int
    kvh: int
    s: int
    t: int
    d: int
    dv: int
    dtype: str
    scale: float
    mask_kind: int = 0
    mask_shape: Tuple[int, ...] = ()
    mask_dtype: str = ""
    causal: bool = False
    nan_to_zero: bool = False
    bshd: Tuple[bool, bool, bool] = (False, False, False)


def _strides(heads: int, seq: int, dim: int, bshd: bool) -> Tuple[int, int, int]:
    """(batch, head, sequence) strides of a contiguous [B, H, S, D] or, ``bshd``, [B, S, H, D]."""
    return (seq * heads * dim, dim, heads * dim) if bshd else (heads * seq * dim, seq * dim, dim)


def _attention_candidates(d: int, precision: str = "none") -> List[Dict[str, int]]:
    if precision == "ieee":
        # fp32 FMA products: smaller query tiles, more programs (S=128 with BLOCK_M=128 gave B*H
        # programs, fewer than the H200's 132 SMs at batch 8, 12 heads)
        tiles = [(64, 64, 4, 3), (64, 32, 4, 3), (32, 64, 4, 3), (32, 64, 2, 3), (32, 32, 2, 3),
                 (16, 64, 2, 3)]
    elif d <= 64:
        tiles = [(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3)]
    else:
        tiles = [(128, 64, 8, 3), (64, 64, 4, 3), (128, 32, 4, 3)]
    return [{"BLOCK_M": m, "BLOCK_N": n, "num_warps": w, "num_stages": s} for m, n, w, s in tiles]


def attention_kernel_for(lib: TritonLibrary, spec: AttentionSpec) -> Tuple[Kernel, Tuple[int, int, int]]:
    """Compile (once per ``spec`` in ``lib``) the FlashAttention kernel for ``spec``; returns it
    and its grid.

    Raises:
        ValueError: the mask broadcasts over the key axis, or no tile configuration fits the
            device's shared memory (the caller falls back to TVM's kernels).
    """
    return _once(lib, ("attention", spec), lambda: _attention_kernel_for(lib, spec))


def _attention_kernel_for(lib: TritonLibrary, spec: AttentionSpec) -> Tuple[Kernel, Tuple[int, int, int]]:
    """:func:`attention_kernel_for` without the cache."""
    from passctl.targets.tvm.triton_kernels import attention_kernel

    precision = "none" if spec.dtype != "float32" else lib.fp32_precision
    if spec.mask_kind:
        mb, mh, ms, mt = spec.mask_shape
        smb, smh, sms = (mh * ms * mt if mb > 1 else 0, ms * mt if mh > 1 else 0,
                         mt if ms > 1 else 0)
        if mt != spec.t:  # the key axis must be materialized (unit stride over T)
            raise ValueError("attention mask broadcasts over the key axis")
    else:
        smb = smh = sms = 0

    def constexprs(c):
        sqb, sqh, sqs = _strides(spec.h, spec.s, spec.d, spec.bshd[0])
        skb, skh, sks = _strides(spec.kvh, spec.t, spec.d, spec.bshd[1])
        svb, svh, svs = _strides(spec.kvh, spec.t, spec.dv, spec.bshd[2])
        return {"H": spec.h, "GROUP": spec.h // spec.kvh, "S": spec.s, "T": spec.t, "D": spec.d,
                "DV": spec.dv, "sqb": sqb, "sqh": sqh, "sqs": sqs, "skb": skb, "skh": skh,
                "sks": sks, "svb": svb, "svh": svh, "svs": svs,
                "smb": smb, "smh": smh, "sms": sms, "SCALE": float(spec.scale),
                "MASK": spec.mask_kind, "CAUSAL": spec.causal, "NAN_TO_ZERO": spec.nan_to_zero,
                "PRECISION": precision, "BLOCK_M": c["BLOCK_M"], "BLOCK_N": c["BLOCK_N"],
                "BLOCK_D": max(16, 1 << (spec.d - 1).bit_length()),
                "BLOCK_DV": max(16, 1 << (spec.dv - 1).bit_length())}

    def grid(c):  # one program per BLOCK_M query rows of one (batch, head)
        return _cdiv(spec.s, c["BLOCK_M"]), spec.b * spec.h, 1

    def grid_of(c):
        return math.prod(grid(c))

    def bench(c):
        import torch
        import triton.testing

        dt = getattr(torch, spec.dtype)
        q = torch.randn(spec.b, spec.h, spec.s, spec.d, device="cuda", dtype=dt)
        k = torch.randn(spec.b, spec.kvh, spec.t, spec.d, device="cuda", dtype=dt)
        v = torch.randn(spec.b, spec.kvh, spec.t, spec.dv, device="cuda", dtype=dt)
        q, k, v = (x.transpose(1, 2).contiguous() if t else x for x, t in zip((q, k, v), spec.bshd))
        o = torch.empty(spec.b, spec.h, spec.s, spec.dv, device="cuda", dtype=dt)
        mask = (torch.zeros(spec.mask_shape, device="cuda",
                            dtype=getattr(torch, spec.mask_dtype)) if spec.mask_kind else o)
        args = constexprs(c)
        run = lambda: attention_kernel[grid(c)](  # noqa: E731
            q, k, v, mask, o, **args, num_warps=c["num_warps"], num_stages=c["num_stages"])
        return triton.testing.do_bench(run, warmup=5, rep=TUNE_REP_MS)

    pointers = {"q_ptr": spec.dtype, "k_ptr": spec.dtype, "v_ptr": spec.dtype,
                "mask_ptr": spec.mask_dtype if spec.mask_kind else spec.dtype, "o_ptr": spec.dtype}
    what = (f"attention B{spec.b} H{spec.h}/{spec.kvh} S{spec.s} T{spec.t} D{spec.d} {spec.dtype}"
            + (" causal" if spec.causal else "") + (" +mask" if spec.mask_kind else "")
            + (" BSHD in" if any(spec.bshd) else ""))
    kernel, c = _compile_fitting(lib, attention_kernel, pointers, constexprs,
                                 _attention_candidates(spec.d, precision), grid_of, bench, what)
    return kernel, grid(c)


__all__ = ["AttentionSpec", "GemmSpec", "attention_kernel_for", "gemm_kernel_for"]
