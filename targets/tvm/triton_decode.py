"""Triton kernels of a Llama-style decode step at batch 1 (issue 17, build item 3).

Decode at batch 1 reads every weight once per token and does two FLOPs per weight, so its time is
set by memory bandwidth (the weight-streaming floor: weight bytes / bandwidth per token). These
kernels are written for that regime:

* :func:`gemv_kernel` streams a row-major ``[N, K]`` weight (``nn.Linear``'s layout) in
  ``[BLOCK_N, BLOCK_K]`` tiles with float32 accumulation; optional fused prologues (RMSNorm of the
  input vector, SiLU-gated input ``silu(g) * u`` of the MLP) and epilogue (residual add in place),
  so a decoder layer needs no separate norm / activation / add kernels. Weights fp16 / bf16, int8
  with one scale per output channel, or int4 with one scale per block of ``GROUP`` inputs
  (weight-only quantization, issue 18: the weight is dequantized in registers, never in memory).
* :func:`gemv_a8_kernel`: the same GEMV for int8 / int4 weights with the input vector quantized
  to int8 per block of 128 at run time and integer tensor-core dot products (W8A8 / W4A8, as
  ONNX Runtime's MatMulNBits at accuracy_level 4), so no float work is spent per weight.
* :func:`gemv_planes_kernel`: the int8 / int4 GEMV over weights packed in *code planes*
  (:func:`passctl.targets.tvm.triton_decoder.pack_planes`): each int32 word holds 4 (int8) or 8
  (int4) codes whose inputs are ``WG`` apart, so code ``i`` of every word in a tile multiplies one
  contiguous slice of the input, and each weight is dequantized with one LOP3 and one FADD and
  multiplied with one FFMA (no byte extraction, no per-weight scale: int4's group scale is applied
  once per word). The tile's accumulators are one per word, not one per weight, so a program can
  stream 16 KB tiles as the fp16 GEMV does. :func:`gemm_planes_kernel` is the prefill GEMM over
  the same words (each code plane is a contiguous K range: one tensor-core dot per plane).
* :func:`gemv_half2_kernel`: the int8 / int4 GEMV over the byte rows read in 64-bit words, with
  fp16 pair (f16x2) arithmetic in inline PTX: one LOP3 (int4) or PRMT (int8) drops two codes into
  two fp16 mantissas, one HSUB2 / HFMA2 removes the offset and one HFMA2 multiplies two weights by
  two inputs (the "magic number" conversion of FasterTransformer and Marlin); each word's products
  are summed in fp16, the words in float32. About 2.9 (int4) / 3.4 (int8) instructions per weight
  in the loop, against 4.95 / 5.6 for the float32 kernels.
* :func:`rotary_cache_kernel` applies rotary embedding (rotate-half, Su et al. 2021, as
  transformers' ``apply_rotary_pos_emb``) to Q and K at the current position and writes K and V
  into the static KV cache in place.
* :func:`decode_attention_kernel` / :func:`decode_attention_reduce_kernel`: split-KV decode
  attention (flash-decoding, Dao et al. 2023, "Flash-Decoding for long-context inference"): each
  program reduces one chunk of the cache with a local softmax (max, sum, weighted V); a second
  kernel combines the chunks with their max-rescaled sums. Grouped-query attention reads each
  KV head once for its ``GROUP`` query heads.
* :func:`argmax_kernel`: greedy sampling on the device; it also advances the position counter, so
  one step reads its position and token from device memory and a captured CUDA graph replays
  with no host work.

Positions and tokens live in device memory (int32), never in kernel arguments: every launch of a
step is identical, which is what lets the step be captured once as a CUDA graph.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from passctl.targets.tvm.triton_kernels import grouped_tile

def interpreted() -> bool:
    """Triton's CPU interpreter runs the kernels (``TRITON_INTERPRET`` on, as Triton reads it):
    tensors live on the CPU, no CUDA graph, and no inline PTX (``gemv_half2_kernel`` takes its
    ``EMULATE`` path)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")

try:  # grid dependency control (programmatic dependent launch), sm_90+; Triton >= 3.3
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    HAS_PDL = True
except ImportError:  # pragma: no cover - older Triton: the PDL variant is not offered
    HAS_PDL = False

    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass


@triton.jit
def _pdl_enter(PDL: tl.constexpr):
    """With ``PDL`` (the kernel launched with ``launch_pdl=True``): wait until the previous
    kernel of the stream has finished and its writes are visible (``griddepcontrol.wait``), then
    let the next kernel's programs launch early (``griddepcontrol.launch_dependents``) so its
    launch latency and ramp-up overlap this kernel's tail. Every kernel of the decode step
    calls this before touching memory another kernel writes, so the order of the step holds
    transitively (PTX ISA, "griddepcontrol"; CUDA programming guide, "Programmatic Dependent
    Launch")."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def embed_kernel(tok_ptr, emb_ptr, x_ptr, K: tl.constexpr, BLOCK: tl.constexpr,
                 PDL: tl.constexpr = False):
    """``x[r, :] = float32(emb[tok[r], :])`` for row ``r = program_id(0)``: token embeddings
    into the float32 residual stream ``[S, K]``."""
    _pdl_enter(PDL)
    r = tl.program_id(0)
    t = tl.load(tok_ptr + r).to(tl.int64)
    for k0 in range(0, K, BLOCK):
        cols = k0 + tl.arange(0, BLOCK)
        v = tl.load(emb_ptr + t * K + cols, mask=cols < K, other=0.0)
        tl.store(x_ptr + r * K + cols, v.to(tl.float32), mask=cols < K)


@triton.jit
def rmsnorm_kernel(x_ptr, g_ptr, out_ptr, K: tl.constexpr, EPS: tl.constexpr,
                   BLOCK: tl.constexpr):
    """``out[r] = x[r] / sqrt(mean(x[r]^2) + EPS) * g`` for row ``r = program_id(0)`` of
    ``[S, K]`` (prefill; the decode GEMV fuses this into its prologue)."""
    r = tl.program_id(0)
    sq = tl.zeros((BLOCK,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        cols = k0 + tl.arange(0, BLOCK)
        xv = tl.load(x_ptr + r * K + cols, mask=cols < K, other=0.0).to(tl.float32)
        sq += xv * xv
    inv = 1.0 / tl.sqrt(tl.sum(sq, 0) / K + EPS)
    for k0 in range(0, K, BLOCK):
        cols = k0 + tl.arange(0, BLOCK)
        xv = tl.load(x_ptr + r * K + cols, mask=cols < K, other=0.0).to(tl.float32)
        gv = tl.load(g_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
        tl.store(out_ptr + r * K + cols, (xv * inv * gv).to(out_ptr.dtype.element_ty),
                 mask=cols < K)


@triton.jit
def silu_mul_kernel(gu_ptr, out_ptr, K: tl.constexpr, BLOCK: tl.constexpr):
    """``out[r, k] = silu(gu[r, k]) * gu[r, K + k]`` for row ``r = program_id(0)`` (prefill)."""
    r = tl.program_id(0)
    for k0 in range(0, K, BLOCK):
        cols = k0 + tl.arange(0, BLOCK)
        g = tl.load(gu_ptr + r * 2 * K + cols, mask=cols < K, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + r * 2 * K + K + cols, mask=cols < K, other=0.0).to(tl.float32)
        tl.store(out_ptr + r * K + cols, (g / (1.0 + tl.exp(-g)) * u).to(out_ptr.dtype.element_ty),
                 mask=cols < K)


@triton.jit
def heads_to_rows_kernel(src_ptr, dst_ptr, S: tl.constexpr, D: tl.constexpr):
    """``dst[s, h, :] = src[h, s, :]`` for ``(s, h) = program_id(0, 1)``: the prefill attention
    kernel's ``[H, S, D]`` output as the O projection's ``[S, H * D]`` input."""
    s = tl.program_id(0)
    h = tl.program_id(1)
    H = tl.num_programs(1)
    d = tl.arange(0, D)
    tl.store(dst_ptr + (s * H + h) * D + d, tl.load(src_ptr + (h * S + s) * D + d))


@triton.jit
def _ld(ptr, ok):
    """``tl.load`` reading 0 where ``ok`` is False; ``ok`` None: no mask."""
    if ok is None:
        v = tl.load(ptr)
    else:
        v = tl.load(ptr, mask=ok, other=0.0)
    return v


@triton.jit
def _input(x_ptr, norm_ptr, cols, ok, inv_rms, K: tl.constexpr, PROLOGUE: tl.constexpr):
    """The GEMV's input vector at ``cols`` (float32), after its prologue (see gemv_kernel);
    ``ok`` masks the reads (None: all in range)."""
    if PROLOGUE == 1:
        xv = _ld(x_ptr + cols, ok).to(tl.float32) * inv_rms * _ld(norm_ptr + cols, ok).to(tl.float32)
    elif PROLOGUE == 2:
        g = _ld(x_ptr + cols, ok).to(tl.float32)
        u = _ld(x_ptr + K + cols, ok).to(tl.float32)
        xv = g / (1.0 + tl.exp(-g)) * u
    else:
        xv = _ld(x_ptr + cols, ok).to(tl.float32)
    return xv


@triton.jit
def _biased_to_f32(u, BIAS: tl.constexpr):
    """``float32(u - BIAS)`` for small non-negative integers ``u`` (uint32, below 2^23) without
    an int-to-float conversion: OR-ing ``u`` into the mantissa of 2^23 gives the float
    ``2^23 + u`` exactly, and one float subtraction removes the offset (the "magic number"
    dequantization of FasterTransformer and Marlin: conversions run at a quarter of the FMA
    rate on sm_90, integer logic and float adds at full rate)."""
    return (u | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + BIAS)


@triton.jit
def _inv_rms(x_ptr, K: tl.constexpr, EPS: tl.constexpr, BLOCK_K: tl.constexpr,
             PROLOGUE: tl.constexpr):
    """``1 / sqrt(mean(x^2) + EPS)`` of the GEMV's input ``x`` (float32 ``[K]``) for the RMSNorm
    prologue (``PROLOGUE`` 1); 1.0 for the others."""
    inv_rms = 1.0
    if PROLOGUE == 1:
        sq = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            xv = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
            sq += xv * xv
        inv_rms = 1.0 / tl.sqrt(tl.sum(sq, 0) / K + EPS)
    return inv_rms


@triton.jit
def _store_rows(out_ptr, res_ptr, rows, row_ok, y, HAS_RES: tl.constexpr, SPLIT_K: tl.constexpr):
    """The GEMV's epilogue: ``y`` (float32, one per row) added into ``out`` with an atomic (split-K,
    the residual already there) or stored, plus ``res`` with ``HAS_RES``."""
    if SPLIT_K > 1:
        tl.atomic_add(out_ptr + rows, y, mask=row_ok, sem="relaxed")
    else:
        if HAS_RES:
            y += tl.load(res_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def gemv_kernel(w_ptr, scale_ptr, x_ptr, norm_ptr, res_ptr, out_ptr,
                N: tl.constexpr, K: tl.constexpr, EPS: tl.constexpr,
                WBITS: tl.constexpr, GROUP: tl.constexpr,
                PROLOGUE: tl.constexpr, HAS_RES: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr = 1,
                PDL: tl.constexpr = False):
    """``out[n] = sum_k W[n, k] * x'[k] (+ res[n])`` for ``BLOCK_N`` rows n per program.

    Args:
        w_ptr: the weight, row-major ``[N, K]``: fp16 / bf16 (``WBITS`` 16); int8 (``WBITS`` 8,
            passed as a uint8 view of the int8 values, ``scale_ptr`` fp32 ``[N]``:
            ``W = w * scale[n]``); or int4 (``WBITS`` 4: uint8
            ``[N, K / 2]``, element ``2j`` in the low nibble, ``2j + 1`` in the high one, value
            ``nibble - 8``; ``scale_ptr`` fp32 ``[N, K / GROUP]``).
        x_ptr: the input vector. ``PROLOGUE`` 0: ``x'`` = x (any float dtype, ``[K]``);
            1: RMSNorm, ``x' = x / sqrt(mean(x^2) + EPS) * norm[k]`` (x float32 ``[K]``,
            ``norm_ptr`` the gain; Zhang & Sennrich 2019); 2: SiLU-gated, x ``[2K]`` = gate then
            up, ``x' = silu(x[k]) * x[K + k]`` (Shazeer 2020, SwiGLU).
        res_ptr: with ``HAS_RES``, float32 ``[N]`` added to the result (may be ``out_ptr``: each
            program reads and writes only its own rows, so the update is in place).
        out_ptr: ``[N]``, float32 or fp16 (the store casts).
        SPLIT_K: programs per row block along K (grid axis 1), each summing
            ``ceil(K / SPLIT_K)`` inputs (a multiple of ``BLOCK_K``) and adding its partial
            into ``out`` with a float32 atomic add: more bytes in flight for short, wide
            weights (split-K). Requires ``HAS_RES`` with ``res_ptr`` = ``out_ptr`` float32 (the
            residual is already in ``out``); the sum order then varies run to run in the last
            bits of float32.
    """
    _pdl_enter(PDL)
    pid = tl.program_id(0)
    KS: tl.constexpr = ((K + SPLIT_K - 1) // SPLIT_K + BLOCK_K - 1) // BLOCK_K * BLOCK_K
    k_lo = tl.program_id(1) * KS
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    inv_rms = _inv_rms(x_ptr, K, EPS, BLOCK_K, PROLOGUE)
    if WBITS == 4:
        # Tiles of NG groups x GW inputs: one scale per (row, group), loaded once per tile;
        # the packed bytes and x are read contiguously, x split into even / odd elements.
        tl.static_assert((GROUP % BLOCK_K == 0) or (BLOCK_K % GROUP == 0))
        NG: tl.constexpr = BLOCK_K // GROUP if BLOCK_K >= GROUP else 1
        GW: tl.constexpr = GROUP if BLOCK_K >= GROUP else BLOCK_K
        GH: tl.constexpr = GW // 2
        acc = tl.zeros((BLOCK_N, NG, GH), dtype=tl.float32)
        gi = tl.arange(0, NG)
        jj = tl.arange(0, GW)
        jh = tl.arange(0, GH)
        for k0 in range(k_lo, k_lo + KS, BLOCK_K):
            cols = k0 + gi[:, None] * GW + jj[None, :]
            xv = _input(x_ptr, norm_ptr, cols, cols < K, inv_rms, K, PROLOGUE)
            x0, x1 = tl.split(tl.reshape(xv, (NG, GH, 2)))
            half = (k0 + gi[:, None] * GW) // 2 + jh[None, :]
            m3 = row_ok[:, None, None] & (half * 2 < K)[None, :, :]
            b = tl.load(w_ptr + rows[:, None, None] * (K // 2) + half[None, :, :], mask=m3,
                        other=0x88).to(tl.uint32)
            lo = _biased_to_f32(b & 15, 8)
            hi = _biased_to_f32(b >> 4, 8)
            grp = (k0 + gi * GW) // GROUP
            sc = tl.load(scale_ptr + rows[:, None] * (K // GROUP) + grp[None, :],
                         mask=row_ok[:, None] & (grp < K // GROUP)[None, :], other=0.0)
            acc += (lo * x0[None, :, :] + hi * x1[None, :, :]) * sc[:, :, None]
        y = tl.sum(tl.sum(acc, 2), 1)
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(k_lo, k_lo + KS, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            ok = cols < K
            xv = _input(x_ptr, norm_ptr, cols, ok, inv_rms, K, PROLOGUE)
            if WBITS == 8:
                # w_ptr read as uint8: two's complement q; q + 128 = u ^ 0x80
                u = tl.load(w_ptr + rows[:, None] * K + cols[None, :],
                            mask=row_ok[:, None] & ok[None, :], other=0x80).to(tl.uint32)
                acc += _biased_to_f32(u ^ 0x80, 128) * xv[None, :]
            else:
                w = tl.load(w_ptr + rows[:, None] * K + cols[None, :],
                            mask=row_ok[:, None] & ok[None, :], other=0.0)
                acc += w.to(tl.float32) * xv[None, :]
        y = tl.sum(acc, 1)
        if WBITS == 8:
            y = y * tl.load(scale_ptr + rows, mask=row_ok, other=0.0)
    _store_rows(out_ptr, res_ptr, rows, row_ok, y, HAS_RES, SPLIT_K)


#: the bits of the float 2^23, ``gemv_planes_kernel``'s ``magic`` argument
PLANES_MAGIC = 0x4B000000


@triton.jit
def gemv_planes_kernel(w_ptr, scale_ptr, x_ptr, norm_ptr, res_ptr, out_ptr, magic,
                       N: tl.constexpr, K: tl.constexpr, EPS: tl.constexpr,
                       WBITS: tl.constexpr, WG: tl.constexpr,
                       PROLOGUE: tl.constexpr, HAS_RES: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr = 1,
                       PDL: tl.constexpr = False):
    """``out[n] = sum_k W[n, k] * x'[k] (+ res[n])`` for int8 / int4 weights in code planes.

    Args:
        w_ptr: int32 ``[N, K / P]`` with ``P = 32 / WBITS`` codes per word: ``K`` is cut into
            plane blocks of ``P * WG`` inputs; in block ``b``, word ``j`` (``0 <= j < WG``)
            holds in bits ``WBITS * i ..`` the code ``c = q + 2^(WBITS-1)`` (unsigned) of input
            ``k = b * P * WG + i * WG + j``. :func:`~passctl.targets.tvm.triton_decoder.pack_planes`
            writes this layout.
        scale_ptr: float32; int8: ``[N]`` (one per output channel, ``W = q * scale[n]``); int4:
            ``[N, K / (P * WG)]``, one per plane block (the quantization group, ``8 * WG``
            inputs).
        x_ptr, norm_ptr, res_ptr, out_ptr, EPS, PROLOGUE, HAS_RES, SPLIT_K, PDL: as in
            :func:`gemv_kernel`.
        magic: the int32 ``0x4B000000`` (the bits of 2^23; :data:`PLANES_MAGIC`), passed at run
            time so that it sits in a register: with the mask an immediate, ``(w & mask) | magic``
            is then one LOP3 (two immediates take two).
        BLOCK_K: inputs per program and iteration, a multiple of ``P * WG``.

    The next tile's words are loaded before the current one is dequantized (software
    pipelining by hand: the loads of one iteration overlap the arithmetic of the previous).

    The dequantization (the "magic number" trick of :func:`_biased_to_f32`, without shifting
    the code down): for the code in bits ``s .. s + WBITS - 1`` (``s < 16``), OR-ing the masked
    word into the mantissa of 2^23 gives the float ``2^23 + c * 2^s`` exactly, and subtracting
    ``2^23 + 2^(WBITS-1) * 2^s`` leaves ``q * 2^s`` exactly; the input slice of that plane is
    multiplied by ``2^-s`` (exact, a power of two) once per tile. The upper half of the word is
    shifted down once. Per weight: LOP3, FADD, FFMA.
    """
    _pdl_enter(PDL)
    P: tl.constexpr = 32 // WBITS
    HALF_P: tl.constexpr = P // 2
    PB: tl.constexpr = P * WG                     # inputs per plane block
    NB: tl.constexpr = BLOCK_K // PB              # plane blocks per tile
    tl.static_assert(NB * PB == BLOCK_K)
    tl.static_assert(K % PB == 0)
    MASK: tl.constexpr = (1 << WBITS) - 1
    ZERO: tl.constexpr = 1 << (WBITS - 1)
    KW: tl.constexpr = K // P                     # words per row
    pid = tl.program_id(0)
    KS: tl.constexpr = ((K + SPLIT_K - 1) // SPLIT_K + BLOCK_K - 1) // BLOCK_K * BLOCK_K
    k_lo = tl.program_id(1) * KS
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    inv_rms = _inv_rms(x_ptr, K, EPS, BLOCK_K, PROLOGUE)
    bi = tl.arange(0, NB)
    jj = tl.arange(0, WG)
    acc = tl.zeros((BLOCK_N, NB, WG), dtype=tl.float32)
    w_rows = w_ptr + rows[:, None, None] * KW
    widx = (k_lo // PB + bi)[:, None] * WG + jj[None, :]                # [NB, WG]
    w_next = tl.load(w_rows + widx[None, :, :],
                     mask=row_ok[:, None, None] & (widx < KW)[None, :, :], other=0)
    for k0 in range(k_lo, k_lo + KS, BLOCK_K):
        blk = k0 // PB + bi                                           # [NB]
        w = w_next.to(tl.uint32, bitcast=True)
        widx = (blk + NB)[:, None] * WG + jj[None, :]                 # the next tile's words
        w_next = tl.load(w_rows + widx[None, :, :],
                         mask=row_ok[:, None, None] & (widx < KW)[None, :, :]
                         & (k0 + BLOCK_K < k_lo + KS), other=0)
        part = tl.zeros((BLOCK_N, NB, WG), dtype=tl.float32)
        for i in tl.static_range(P):
            if i == HALF_P:
                w = w >> 16
            kk = blk[:, None] * PB + i * WG + jj[None, :]             # [NB, WG]
            xv = _input(x_ptr, norm_ptr, kk, kk < K, inv_rms, K, PROLOGUE) \
                * (1.0 / (1 << ((i % HALF_P) * WBITS)))
            v = ((w & (MASK << ((i % HALF_P) * WBITS))) | magic).to(tl.float32, bitcast=True) \
                - (8388608.0 + ZERO * (1 << ((i % HALF_P) * WBITS)))
            # masked-out words read 0: code 0 stands for -ZERO, but its input is masked to 0
            part += v * xv[None, :, :]
        if WBITS == 4:
            sc = tl.load(scale_ptr + rows[:, None] * (K // PB) + blk[None, :],
                         mask=row_ok[:, None] & (blk < K // PB)[None, :], other=0.0)
            acc += part * sc[:, :, None]
        else:
            acc += part
    y = tl.sum(tl.sum(acc, 2), 1)
    if WBITS == 8:
        y = y * tl.load(scale_ptr + rows, mask=row_ok, other=0.0)
    _store_rows(out_ptr, res_ptr, rows, row_ok, y, HAS_RES, SPLIT_K)


def _word_dot_asm(temps: str, constants: str, dequantize: str, pairs: str) -> str:
    """Inline PTX of one word's dot: ``dequantize`` leaves the fp16 code pairs in the registers
    ``pairs`` (letters, in input-pair order), which one f16x2 chain multiplies with the packed
    input pairs ``$2 ..``; the two halves of the chain are added in float32 into ``$0``."""
    chain = [f"mul.rn.f16x2 acc, {pairs[0]}, $2;"] + [
        f"fma.rn.f16x2 acc, {r}, ${i + 2}, acc;" for i, r in enumerate(pairs) if i]
    return "\n".join([
        "{", f".reg .b32 lo, hi, acc, {temps}, {', '.join(pairs)};", ".reg .f16 h0, h1;",
        ".reg .f32 f0, f1;", constants.strip(), "mov.b64 {lo, hi}, $1;", dequantize.strip(),
        *chain, "mov.b32 {h0, h1}, acc;", "cvt.f32.f16 f0, h0;", "cvt.f32.f16 f1, h1;",
        "add.f32 $0, f0, f1;", "}"])


#: f16x2 dequantize-and-dot of one 64-bit word of int4 codes (16 weights, inputs ``k .. k + 15``;
#: the rows layout: input ``k + t`` in nibble ``t``, code ``c = q + 8``). One LOP3 puts two codes
#: into the mantissas of two fp16 1024s (nibbles ``t`` and ``t + 4`` of a 32-bit half land in
#: the low and high halves); codes in the high nibble of a byte come out as ``1024 + 16 c`` and
#: one HFMA2 (``v / 16 - 72``) turns them into ``q``, the low ones one HSUB2 (``v - 1032``): the
#: "magic number" conversion of Kim et al. 2022 (FasterTransformer) and Frantar et al. 2024
#: (Marlin). The eight pairs multiply the packed input pairs ``$2 .. $9`` (see
#: ``gemv_half2_kernel``) in one f16x2 chain (each half sums 8 products), and the two halves are
#: added in float32.
_INT4_WORD_DOT = tl.constexpr(_word_dot_asm("t, k1032, k16, k72", """
mov.b32 k1032, 0x64086408;
mov.b32 k16, 0x2C002C00;
mov.b32 k72, 0xD480D480;""", """
lop3.b32 a, lo, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 b, lo, 0x00F000F0, 0x64006400, 0xEA;
shr.u32 t, lo, 8;
lop3.b32 c, t, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 d, t, 0x00F000F0, 0x64006400, 0xEA;
lop3.b32 e, hi, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 f, hi, 0x00F000F0, 0x64006400, 0xEA;
shr.u32 t, hi, 8;
lop3.b32 g, t, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 h, t, 0x00F000F0, 0x64006400, 0xEA;
sub.f16x2 a, a, k1032;
fma.rn.f16x2 b, b, k16, k72;
sub.f16x2 c, c, k1032;
fma.rn.f16x2 d, d, k16, k72;
sub.f16x2 e, e, k1032;
fma.rn.f16x2 f, f, k16, k72;
sub.f16x2 g, g, k1032;
fma.rn.f16x2 h, h, k16, k72;""", "abcdefgh"))

#: the same for one 64-bit word of int8 weights (8 weights, inputs ``k .. k + 7``, two's-complement
#: bytes in input order): XOR 0x80 makes the codes ``u = q + 128``, one PRMT puts two bytes into
#: the mantissas of two fp16 1024s, one HSUB2 (``v - 1152``) leaves ``q``; ``$2 .. $5`` are the
#: packed pairs ``(x_0, x_1) .. (x_6, x_7)``, each half sums 4 products.
_INT8_WORD_DOT = tl.constexpr(_word_dot_asm("k1152, m", """
mov.b32 k1152, 0x64806480;
mov.b32 m, 0x64646464;""", """
xor.b32 lo, lo, 0x80808080;
xor.b32 hi, hi, 0x80808080;
prmt.b32 a, lo, m, 0x4140;
prmt.b32 b, lo, m, 0x4342;
prmt.b32 c, hi, m, 0x4140;
prmt.b32 d, hi, m, 0x4342;
sub.f16x2 a, a, k1152;
sub.f16x2 b, b, k1152;
sub.f16x2 c, c, k1152;
sub.f16x2 d, d, k1152;""", "abcd"))


@triton.jit
def _half2_bits(lo, hi):
    """Two float32 tensors as packed fp16 pairs (uint32: ``lo`` in bits 0-15, ``hi`` in 16-31),
    each rounded to fp16."""
    lo16 = lo.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.uint32)
    hi16 = hi.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.uint32)
    return lo16 | (hi16 << 16)


@triton.jit
def _emulated_pair(acc_lo, acc_hi, w, lo: tl.constexpr, hi: tl.constexpr, BITS: tl.constexpr,
                   xp, FIRST: tl.constexpr):
    """One f16x2 multiply-add of :func:`_word_dot`'s chain in Triton operations: the codes at
    code positions ``lo`` and ``hi`` of the 64-bit words ``w`` (``BITS`` wide, zero at
    ``2^(BITS-1)``) times the halves of the packed pairs ``xp``, summed into fp16 ``acc_*``."""
    mask: tl.constexpr = (1 << BITS) - 1
    zero: tl.constexpr = 1 << (BITS - 1)
    q_lo = (((w >> (BITS * lo)) & mask).to(tl.int32) - zero).to(tl.float16)
    q_hi = (((w >> (BITS * hi)) & mask).to(tl.int32) - zero).to(tl.float16)
    x_lo = (xp & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)
    x_hi = (xp >> 16).to(tl.uint16).to(tl.float16, bitcast=True)
    if FIRST:
        return q_lo * x_lo, q_hi * x_hi
    return acc_lo + q_lo * x_lo, acc_hi + q_hi * x_hi


@triton.jit
def _word_dot(w, x0, x1, x2, x3, x4, x5, x6, x7, WBITS: tl.constexpr, EMULATE: tl.constexpr):
    """Float32 dot of each 64-bit word of codes ``w`` (uint64) with its packed input pairs
    (:data:`_INT4_WORD_DOT`: 16 codes and the pairs ``x0 .. x7``; :data:`_INT8_WORD_DOT`: 8
    codes and ``x0 .. x3``). ``EMULATE``: the same arithmetic in Triton operations (fp16
    products and sums in the same order, unfused), for Triton's interpreter, which runs no
    PTX."""
    if EMULATE:
        if WBITS == 4:
            # pairs (t, t + 4) of each 32-bit half (see _INT4_WORD_DOT)
            a_lo, a_hi = _emulated_pair(0.0, 0.0, w, 0, 4, 4, x0, True)
            a_lo, a_hi = _emulated_pair(a_lo, a_hi, w, 1, 5, 4, x1, False)
            a_lo, a_hi = _emulated_pair(a_lo, a_hi, w, 2, 6, 4, x2, False)
            a_lo, a_hi = _emulated_pair(a_lo, a_hi, w, 3, 7, 4, x3, False)
            a_lo, a_hi = _emulated_pair(a_lo, a_hi, w, 8, 12, 4, x4, False)
            a_lo, a_hi = _emulated_pair(a_lo, a_hi, w, 9, 13, 4, x5, False)
            a_lo, a_hi = _emulated_pair(a_lo, a_hi, w, 10, 14, 4, x6, False)
            a_lo, a_hi = _emulated_pair(a_lo, a_hi, w, 11, 15, 4, x7, False)
        else:
            u = w ^ 0x8080808080808080
            a_lo, a_hi = _emulated_pair(0.0, 0.0, u, 0, 1, 8, x0, True)
            a_lo, a_hi = _emulated_pair(a_lo, a_hi, u, 2, 3, 8, x1, False)
            a_lo, a_hi = _emulated_pair(a_lo, a_hi, u, 4, 5, 8, x2, False)
            a_lo, a_hi = _emulated_pair(a_lo, a_hi, u, 6, 7, 8, x3, False)
        return a_lo.to(tl.float32) + a_hi.to(tl.float32)
    if WBITS == 4:
        return tl.inline_asm_elementwise(_INT4_WORD_DOT, "=r,l,r,r,r,r,r,r,r,r",
                                         [w, x0, x1, x2, x3, x4, x5, x6, x7],
                                         dtype=tl.float32, is_pure=True, pack=1)
    return tl.inline_asm_elementwise(_INT8_WORD_DOT, "=r,l,r,r,r,r", [w, x0, x1, x2, x3],
                                     dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _input_pair(x_ptr, norm_ptr, base, lo: tl.constexpr, hi: tl.constexpr, ok, inv_rms,
                K: tl.constexpr, PROLOGUE: tl.constexpr, XS: tl.constexpr):
    """Inputs ``base + lo`` and ``base + hi`` after the prologue, times ``XS``, as packed fp16
    pairs."""
    return _half2_bits(_input(x_ptr, norm_ptr, base + lo, ok, inv_rms, K, PROLOGUE) * XS,
                       _input(x_ptr, norm_ptr, base + hi, ok, inv_rms, K, PROLOGUE) * XS)


@triton.jit
def gemv_half2_kernel(w_ptr, scale_ptr, x_ptr, norm_ptr, res_ptr, out_ptr,
                      N: tl.constexpr, K: tl.constexpr, EPS: tl.constexpr,
                      WBITS: tl.constexpr, GROUP: tl.constexpr,
                      PROLOGUE: tl.constexpr, HAS_RES: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr = 1,
                      PDL: tl.constexpr = False, EMULATE: tl.constexpr = False):
    """``out[n] = sum_k W[n, k] * x'[k] (+ res[n])`` for int8 / int4 weights in
    :func:`gemv_kernel`'s layouts, dequantized and multiplied two weights per instruction
    (f16x2; :func:`_word_dot`).

    Args:
        w_ptr: the weight read in 64-bit words (``int64 [N, K * WBITS / 64]``, a
            ``view(torch.int64)`` of :func:`~passctl.targets.tvm.triton_decoder.quantize_rtn`'s
            bytes, inputs in order): int8, 8 two's-complement bytes per word, scale fp32 ``[N]``;
            int4, 16 nibbles ``c = q + 8`` per word, scale fp32 ``[N, K / GROUP]``. ``K`` a
            multiple of 64 / WBITS, rows 16-byte aligned.
        x_ptr, norm_ptr, res_ptr, out_ptr, EPS, PROLOGUE, HAS_RES, SPLIT_K, PDL: as in
            :func:`gemv_kernel`.
        BLOCK_K: inputs per program and iteration; int4: a multiple of ``GROUP`` or a divisor
            of it (checked at compile time; ``GROUP`` a multiple of 16). Large tiles (2048-4096 inputs for the LLaMA shapes) put every thread along K,
            so each thread converts its inputs to fp16 pairs once per tile and reuses them for
            all ``BLOCK_N`` rows it holds.
        EMULATE: the f16x2 arithmetic in Triton operations instead of inline PTX (Triton's
            interpreter runs no PTX).

    Numerics: the input after its prologue is scaled by ``XS`` (int8 1/16, int4 1/2; exact)
    and rounded to fp16; each word's products are summed in fp16, 4 (int8) or 8 (int4) per
    half, and the words in float32. A half's sum stays in fp16 range (65504) while
    ``|x'| < 2047`` (4 * 128 / 16 and 8 * 8 / 2 times ``|x'|``); beyond it the sum overflows
    to inf (LLaMA-family down projections can see inputs that large; the float32 kernels have
    no such limit). The fp16 rounding adds a
    relative error of about 2^-11 per product: below the int8 / int4 quantization error, above
    :func:`gemv_kernel`'s float32 arithmetic.
    """
    _pdl_enter(PDL)
    P: tl.constexpr = 64 // WBITS                 # inputs per 64-bit word
    KW: tl.constexpr = K // P                     # words per row
    tl.static_assert(KW * P == K)
    tl.static_assert(BLOCK_K % P == 0)
    if WBITS == 4:  # every tile row segment inside one scale group
        tl.static_assert(GROUP % P == 0 and (BLOCK_K % GROUP == 0 or GROUP % BLOCK_K == 0))
    GW: tl.constexpr = ((GROUP if BLOCK_K >= GROUP else BLOCK_K) if WBITS == 4 else BLOCK_K) // P
    NG: tl.constexpr = BLOCK_K // (GW * P)
    tl.static_assert(NG * GW * P == BLOCK_K)
    XS: tl.constexpr = 0.0625 if WBITS == 8 else 0.5
    pid = tl.program_id(0)
    KS: tl.constexpr = ((K + SPLIT_K - 1) // SPLIT_K + BLOCK_K - 1) // BLOCK_K * BLOCK_K
    EVEN: tl.constexpr = (N % BLOCK_N == 0) and (KS * SPLIT_K == K)   # no masks needed
    k_lo = tl.program_id(1) * KS
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    inv_rms = _inv_rms(x_ptr, K, EPS, 1024 if K >= 1024 else 128, PROLOGUE)
    gi = tl.arange(0, NG)
    jj = tl.arange(0, GW)
    acc = tl.zeros((BLOCK_N, NG, GW), dtype=tl.float32)
    shape: tl.constexpr = (BLOCK_N, NG, GW)
    for k0 in range(k_lo, k_lo + KS, BLOCK_K):
        wi = k0 // P + gi[:, None] * GW + jj[None, :]                  # [NG, GW] word index
        if EVEN:
            wok = None
            wmask = None
        else:
            wok = wi < KW
            wmask = row_ok[:, None, None] & wok[None, :, :]
        base = wi * P
        if WBITS == 4:   # pairs (t, t + 4) of each 8-input half word
            x0 = _input_pair(x_ptr, norm_ptr, base, 0, 4, wok, inv_rms, K, PROLOGUE, XS)
            x1 = _input_pair(x_ptr, norm_ptr, base, 1, 5, wok, inv_rms, K, PROLOGUE, XS)
            x2 = _input_pair(x_ptr, norm_ptr, base, 2, 6, wok, inv_rms, K, PROLOGUE, XS)
            x3 = _input_pair(x_ptr, norm_ptr, base, 3, 7, wok, inv_rms, K, PROLOGUE, XS)
            x4 = _input_pair(x_ptr, norm_ptr, base, 8, 12, wok, inv_rms, K, PROLOGUE, XS)
            x5 = _input_pair(x_ptr, norm_ptr, base, 9, 13, wok, inv_rms, K, PROLOGUE, XS)
            x6 = _input_pair(x_ptr, norm_ptr, base, 10, 14, wok, inv_rms, K, PROLOGUE, XS)
            x7 = _input_pair(x_ptr, norm_ptr, base, 11, 15, wok, inv_rms, K, PROLOGUE, XS)
        else:            # pairs (2t, 2t + 1)
            x0 = _input_pair(x_ptr, norm_ptr, base, 0, 1, wok, inv_rms, K, PROLOGUE, XS)
            x1 = _input_pair(x_ptr, norm_ptr, base, 2, 3, wok, inv_rms, K, PROLOGUE, XS)
            x2 = _input_pair(x_ptr, norm_ptr, base, 4, 5, wok, inv_rms, K, PROLOGUE, XS)
            x3 = _input_pair(x_ptr, norm_ptr, base, 6, 7, wok, inv_rms, K, PROLOGUE, XS)
            x4 = x0
            x5 = x0
            x6 = x0
            x7 = x0
        w = _ld(w_ptr + rows[:, None, None] * KW + wi[None, :, :], wmask).to(tl.uint64,
                                                                            bitcast=True)
        part = _word_dot(w, tl.broadcast_to(x0[None, :, :], shape),
                         tl.broadcast_to(x1[None, :, :], shape),
                         tl.broadcast_to(x2[None, :, :], shape),
                         tl.broadcast_to(x3[None, :, :], shape),
                         tl.broadcast_to(x4[None, :, :], shape),
                         tl.broadcast_to(x5[None, :, :], shape),
                         tl.broadcast_to(x6[None, :, :], shape),
                         tl.broadcast_to(x7[None, :, :], shape), WBITS, EMULATE)
        # masked-out words read 0 (int4 code 0 is -8) against inputs masked to 0
        if WBITS == 4:
            grp = (k0 + gi * (GW * P)) // GROUP
            if EVEN:
                sc = tl.load(scale_ptr + rows[:, None] * (K // GROUP) + grp[None, :])
            else:
                sc = tl.load(scale_ptr + rows[:, None] * (K // GROUP) + grp[None, :],
                             mask=row_ok[:, None] & (grp < K // GROUP)[None, :], other=0.0)
            acc += part * sc[:, :, None]
        else:
            acc += part
    y = tl.sum(tl.sum(acc, 2), 1) * (1.0 / XS)
    if WBITS == 8:
        y = y * tl.load(scale_ptr + rows, mask=row_ok, other=0.0)
    _store_rows(out_ptr, res_ptr, rows, row_ok, y, HAS_RES, SPLIT_K)

@triton.jit
def gemm_planes_kernel(a_ptr, w_ptr, scale_ptr, res_ptr, c_ptr,
                       M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                       WBITS: tl.constexpr, WG: tl.constexpr, HAS_RES: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """``C = A @ W^T (+ R)``: the prefill GEMM over int8 / int4 weights in code planes (the
    layout of :func:`gemv_planes_kernel`), dequantized in registers, never in memory.

    A: ``[M, K]`` row-major, fp16 / bf16; W: int32 code-plane words ``[N, K / P]`` with
    ``scale_ptr`` as in :func:`gemv_planes_kernel`; R, C: ``[M, N]`` (C float32 or A's dtype; the
    store casts). Code plane ``i`` of plane block ``b`` is the contiguous K range ``b * P * WG +
    i * WG ..`` of ``WG`` inputs, so each plane is one ``[BLOCK_M, WG] x [WG, BLOCK_N]`` tensor-core
    dot (``WG`` >= 16) with the codes converted to A's dtype (``q`` in [-128, 127] is exact in
    fp16 / bf16) and float32 accumulation; int4's group scale multiplies each block's sum, int8's
    per-channel scale the total. Program ids are grouped by ``GROUP_M``
    (:func:`~passctl.targets.tvm.triton_kernels.grouped_tile`).
    """
    P: tl.constexpr = 32 // WBITS
    HALF_P: tl.constexpr = P // 2
    PB: tl.constexpr = P * WG
    KW: tl.constexpr = K // P
    MASK: tl.constexpr = (1 << WBITS) - 1
    ZERO: tl.constexpr = 1 << (WBITS - 1)
    tl.static_assert(K % PB == 0)
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    jj = tl.arange(0, WG)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for b in range(0, K // PB):
        w = tl.load(w_ptr + offs_n[:, None] * KW + (b * WG + jj)[None, :], mask=n_ok[:, None],
                    other=0).to(tl.uint32, bitcast=True)                       # [BLOCK_N, WG]
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for i in tl.static_range(P):
            if i == HALF_P:
                w = w >> 16
            a = tl.load(a_ptr + offs_m[:, None] * K + (b * PB + i * WG + jj)[None, :],
                        mask=m_ok[:, None], other=0.0)                         # [BLOCK_M, WG]
            q = ((w >> ((i % HALF_P) * WBITS)) & MASK).to(tl.int32) - ZERO
            part = tl.dot(a, tl.trans(q.to(a.dtype)), part)
        if WBITS == 4:
            sc = tl.load(scale_ptr + offs_n * (K // PB) + b, mask=n_ok, other=0.0)
            acc += part * sc[None, :]
        else:
            acc += part
    if WBITS == 8:
        acc = acc * tl.load(scale_ptr + offs_n, mask=n_ok, other=0.0)[None, :]
    c_offs = offs_m[:, None] * N + offs_n[None, :]
    ok = m_ok[:, None] & n_ok[None, :]
    if HAS_RES:
        acc += tl.load(res_ptr + c_offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(c_ptr + c_offs, acc.to(c_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _quantize_block(xv, A8_BLOCK: tl.constexpr):
    """Symmetric int8 codes of one block of the input vector: ``(q, step)`` with
    ``q = round(x / step)`` (half away from zero) in [-127, 127] and ``step = max|x| / 127``
    (1 where the block is zero). One step per block of ``A8_BLOCK`` inputs: the activation half of
    ONNX Runtime's ``MatMulNBits`` at ``accuracy_level`` 4 and of llama.cpp's ``q8_1`` (blocks of
    32 there)."""
    step = _a8_step(tl.max(tl.abs(xv), 0))
    return _a8_codes(xv, step), step


@triton.jit
def _a8_step(amax):
    """The int8 step of a block whose largest magnitude is ``amax`` (1 for an all-zero block)."""
    return tl.where(amax > 0, amax / 127.0, 1.0)


@triton.jit
def _a8_codes(xv, step):
    """``round(x / step)``, half away from zero, as int32."""
    v = xv / step
    return tl.where(v >= 0, v + 0.5, v - 0.5).to(tl.int32)


@triton.jit
def gemv_a8_kernel(w_ptr, scale_ptr, x_ptr, norm_ptr, res_ptr, out_ptr,
                   N: tl.constexpr, K: tl.constexpr, EPS: tl.constexpr,
                   WBITS: tl.constexpr, GROUP: tl.constexpr,
                   PROLOGUE: tl.constexpr, HAS_RES: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr = 1,
                   PDL: tl.constexpr = False):
    """:func:`gemv_kernel` for int8 / int4 weights with integer dot products: the input vector
    is quantized to int8 per block of ``BLOCK_K`` inputs at run time (:func:`_quantize_block`),
    and each ``[BLOCK_N, BLOCK_K]`` weight tile is multiplied on the tensor cores as an int8 x
    int8 -> int32 ``tl.dot`` (the vector padded to 16 rows, the mma's least M). Per weight this
    costs no float work (the fp32 kernel spends 4-5 instructions per weight on dequantization
    and FMA, which bounds it below the memory bandwidth on sm_90); the sums are exact integers,
    scaled once per tile.

    ``W`` as in :func:`gemv_kernel`: int8 (a uint8 view, ``scale_ptr`` fp32 ``[N]``) or int4
    (uint8 ``[N, K / 2]``, element ``2j`` in the low nibble, value ``nibble - 8``; ``scale_ptr``
    fp32 ``[N, K / GROUP]``, ``GROUP`` = ``BLOCK_K``). The nibbles enter the dot unsigned
    (0..15, as int8) against the even / odd inputs, and the zero point comes off exactly as
    ``8 * sum(q)`` per block. Result: ``out[n] = sum_blocks step_b * s[n, b] * sum_k
    q_k w[n, k] (+ res[n])``: the input's rounding (relative 1/254 of each block's max) is the
    error this adds to weight-only quantization. ``PROLOGUE``, ``HAS_RES``, ``SPLIT_K`` and
    ``PDL`` as in :func:`gemv_kernel`.
    """
    _pdl_enter(PDL)
    tl.static_assert(WBITS == 8 or GROUP == BLOCK_K)
    pid = tl.program_id(0)
    KS: tl.constexpr = ((K + SPLIT_K - 1) // SPLIT_K + BLOCK_K - 1) // BLOCK_K * BLOCK_K
    k_lo = tl.program_id(1) * KS
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    inv_rms = _inv_rms(x_ptr, K, EPS, BLOCK_K, PROLOGUE)
    first = (tl.arange(0, 16) == 0)[:, None]
    acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_lo + KS, BLOCK_K):
        if WBITS == 8:
            cols = k0 + tl.arange(0, BLOCK_K)
            ok = cols < K
            q, step = _quantize_block(_input(x_ptr, norm_ptr, cols, ok, inv_rms, K, PROLOGUE),
                                      BLOCK_K)
            a = tl.where(first, q[None, :], 0).to(tl.int8)
            w = tl.load(w_ptr + rows[None, :] * K + cols[:, None],
                        mask=ok[:, None] & row_ok[None, :], other=0).to(tl.int8, bitcast=True)
            d = tl.dot(a, w, out_dtype=tl.int32)
            acc += d.to(tl.float32) * step
        else:
            HALF: tl.constexpr = BLOCK_K // 2
            j = tl.arange(0, HALF)
            ev = k0 + 2 * j
            x_e = _input(x_ptr, norm_ptr, ev, ev < K, inv_rms, K, PROLOGUE)
            x_o = _input(x_ptr, norm_ptr, ev + 1, ev + 1 < K, inv_rms, K, PROLOGUE)
            step = _a8_step(tl.maximum(tl.max(tl.abs(x_e), 0), tl.max(tl.abs(x_o), 0)))
            q_e, q_o = _a8_codes(x_e, step), _a8_codes(x_o, step)
            b = tl.load(w_ptr + rows[None, :] * (K // 2) + (k0 // 2 + j)[:, None],
                        mask=(2 * j + k0 < K)[:, None] & row_ok[None, :], other=0x88)
            lo = (b & 15).to(tl.int8)
            hi = (b >> 4).to(tl.int8)
            d = tl.dot(tl.where(first, q_e[None, :], 0).to(tl.int8), lo, out_dtype=tl.int32)
            d = tl.dot(tl.where(first, q_o[None, :], 0).to(tl.int8), hi, acc=d,
                       out_dtype=tl.int32)
            d -= 8 * (tl.sum(q_e, 0) + tl.sum(q_o, 0))
            sc = tl.load(scale_ptr + rows * (K // GROUP) + k0 // GROUP, mask=row_ok, other=0.0)
            acc += d.to(tl.float32) * (step * sc)[None, :]
    y = tl.sum(tl.where(first, acc, 0.0), 0)
    if WBITS == 8:
        y = y * tl.load(scale_ptr + rows, mask=row_ok, other=0.0)
    _store_rows(out_ptr, res_ptr, rows, row_ok, y, HAS_RES, SPLIT_K)


@triton.jit
def rotary_cache_kernel(qkv_ptr, cos_ptr, sin_ptr, pos_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
                        H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, M: tl.constexpr,
                        PDL: tl.constexpr = False):
    """Rotary embedding and the KV cache write for head ``i = program_id(0)`` of row
    ``r = program_id(1)``, at position ``p = pos[0] + r``.

    ``qkv``: ``[S, (H + 2 KVH) * D]``, each row Q heads, K heads, V heads (the fused projection's
    output); ``cos`` / ``sin``: float32 ``[M, D / 2]``. Program ``i < H`` writes rotated Q head i
    to ``q_out[r, i, :]`` (``[S, H, D]``, the cache dtype); program ``H + j`` writes rotated K head
    j to ``k_cache[j, p, :]`` and V head j to ``v_cache[j, p, :]`` (caches ``[KVH, M, D]``).
    Rotate-half: ``(x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)`` over the two halves.
    """
    _pdl_enter(PDL)
    i = tl.program_id(0)
    r = tl.program_id(1)
    p = tl.load(pos_ptr) + r
    HALF: tl.constexpr = D // 2
    d = tl.arange(0, HALF)
    c = tl.load(cos_ptr + p * HALF + d)
    s = tl.load(sin_ptr + p * HALF + d)
    row = r * (H + 2 * KVH) * D
    base = i * D
    x1 = tl.load(qkv_ptr + row + base + d).to(tl.float32)
    x2 = tl.load(qkv_ptr + row + base + HALF + d).to(tl.float32)
    r1 = x1 * c - x2 * s
    r2 = x2 * c + x1 * s
    if i < H:
        qrow = r * H * D
        tl.store(q_out_ptr + qrow + base + d, r1.to(q_out_ptr.dtype.element_ty))
        tl.store(q_out_ptr + qrow + base + HALF + d, r2.to(q_out_ptr.dtype.element_ty))
    else:
        j = i - H
        dst = j * M * D + p * D
        tl.store(k_cache_ptr + dst + d, r1.to(k_cache_ptr.dtype.element_ty))
        tl.store(k_cache_ptr + dst + HALF + d, r2.to(k_cache_ptr.dtype.element_ty))
        vbase = (H + KVH + j) * D
        v1 = tl.load(qkv_ptr + row + vbase + d)
        v2 = tl.load(qkv_ptr + row + vbase + HALF + d)
        tl.store(v_cache_ptr + dst + d, v1.to(v_cache_ptr.dtype.element_ty))
        tl.store(v_cache_ptr + dst + HALF + d, v2.to(v_cache_ptr.dtype.element_ty))


@triton.jit
def decode_attention_kernel(q_ptr, k_cache_ptr, v_cache_ptr, pos_ptr, cos_ptr, sin_ptr,
                            part_o_ptr, part_m_ptr, part_l_ptr, count_ptr, out_ptr,
                            H: tl.constexpr, KVH: tl.constexpr, GROUP: tl.constexpr,
                            D: tl.constexpr, M: tl.constexpr, SPLIT: tl.constexpr,
                            NSPLIT: tl.constexpr, SCALE: tl.constexpr, BLOCK_G: tl.constexpr,
                            BLOCK_S: tl.constexpr, ROTARY: tl.constexpr, MERGE: tl.constexpr,
                            PDL: tl.constexpr = False):
    """One chunk of split-KV decode attention for one KV head and its ``GROUP`` query heads.

    Program (kv head j, chunk c) reads cache rows ``c * SPLIT .. c * SPLIT + SPLIT - 1`` that are
    ``<= pos[0]`` (causal: the cache holds ``pos + 1`` tokens), and writes for each of its query
    heads h the chunk's max score ``part_m[h, c]``, its sum of exponentials ``part_l[h, c]`` and
    its unnormalized output ``part_o[h, c, :]`` (float32). A chunk past the end writes
    ``m = -inf, l = 0, o = 0``. Caches ``[KVH, M, D]``; ``part_*`` ``[H, NSPLIT(, D)]``.

    ``ROTARY``: ``q_ptr`` is the fused projection's output ``[(H + 2 KVH) * D]`` (Q heads, K
    heads, V heads, before rotary): each program rotates its query heads at position ``pos``
    (rotate-half, as :func:`rotary_cache_kernel`), and the program whose chunk holds ``pos``
    rotates K head j, writes K and V at ``pos`` into the caches and uses them in place of the
    rows it read (so no separate rotary / cache-write kernel runs). Else ``q_ptr`` is the
    rotated query ``[H, D]`` and the cache already holds row ``pos``.

    ``MERGE``: the last program of KV head j to finish (a float-free atomic counter
    ``count[j]``, int32 ``[KVH]``, zero between steps) merges the chunks of its query heads into
    ``out[h, :]`` as :func:`decode_attention_reduce_kernel` does and resets ``count[j]``; else
    that kernel runs next.
    """
    _pdl_enter(PDL)
    j = tl.program_id(0)
    c = tl.program_id(1)
    pos = tl.load(pos_ptr)
    HALF: tl.constexpr = D // 2
    g = tl.arange(0, BLOCK_G)
    g_ok = g < GROUP
    heads = j * GROUP + g
    dh = tl.arange(0, HALF)
    qa = q_ptr + heads[:, None] * D + dh[None, :]
    q1 = tl.load(qa, mask=g_ok[:, None], other=0.0).to(tl.float32)
    q2 = tl.load(qa + HALF, mask=g_ok[:, None], other=0.0).to(tl.float32)
    t = c * SPLIT + tl.arange(0, SPLIT)
    t_ok = t <= pos
    kv = j * M * D + t[:, None] * D + dh[None, :]
    k1 = tl.load(k_cache_ptr + kv, mask=t_ok[:, None], other=0.0).to(tl.float32)
    k2 = tl.load(k_cache_ptr + kv + HALF, mask=t_ok[:, None], other=0.0).to(tl.float32)
    v1 = tl.load(v_cache_ptr + kv, mask=t_ok[:, None], other=0.0).to(tl.float32)
    v2 = tl.load(v_cache_ptr + kv + HALF, mask=t_ok[:, None], other=0.0).to(tl.float32)
    if ROTARY:
        cs = tl.load(cos_ptr + pos * HALF + dh)
        sn = tl.load(sin_ptr + pos * HALF + dh)
        r1 = q1 * cs[None, :] - q2 * sn[None, :]
        q2 = q2 * cs[None, :] + q1 * sn[None, :]
        q1 = r1
        mine = (pos // SPLIT) == c
        kb = q_ptr + (H + j) * D + dh
        vb = q_ptr + (H + KVH + j) * D + dh
        nk1 = tl.load(kb).to(tl.float32)
        nk2 = tl.load(kb + HALF).to(tl.float32)
        nv1 = tl.load(vb).to(tl.float32)
        nv2 = tl.load(vb + HALF).to(tl.float32)
        rk1 = nk1 * cs - nk2 * sn
        rk2 = nk2 * cs + nk1 * sn
        dst = j * M * D + pos * D + dh
        ty = k_cache_ptr.dtype.element_ty
        mask_mine = (dh < HALF) & mine
        tl.store(k_cache_ptr + dst, rk1.to(ty), mask=mask_mine)
        tl.store(k_cache_ptr + dst + HALF, rk2.to(ty), mask=mask_mine)
        tl.store(v_cache_ptr + dst, nv1.to(ty), mask=mask_mine)
        tl.store(v_cache_ptr + dst + HALF, nv2.to(ty), mask=mask_mine)
        # the row at pos as the cache dtype holds it (rounded like the stored copy)
        new = (t == pos)[:, None]
        k1 = tl.where(new, rk1.to(ty).to(tl.float32)[None, :], k1)
        k2 = tl.where(new, rk2.to(ty).to(tl.float32)[None, :], k2)
        v1 = tl.where(new, nv1.to(ty).to(tl.float32)[None, :], v1)
        v2 = tl.where(new, nv2.to(ty).to(tl.float32)[None, :], v2)
        # q as the unfused path stores it (rounded to the cache dtype)
        q1 = q1.to(ty).to(tl.float32)
        q2 = q2.to(ty).to(tl.float32)
    # scores[g, t] = q[g, :] . k[t, :], over the two halves of the head
    scores = (tl.sum(q1[:, None, :] * k1[None, :, :], 2)
              + tl.sum(q2[:, None, :] * k2[None, :, :], 2)) * SCALE
    scores = tl.where(t_ok[None, :], scores, float("-inf"))
    m = tl.max(scores, 1)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    p = tl.exp(scores - m_safe[:, None])
    p = tl.where(t_ok[None, :], p, 0.0)
    l_sum = tl.sum(p, 1)
    o1 = tl.sum(p[:, :, None] * v1[None, :, :], 1)
    o2 = tl.sum(p[:, :, None] * v2[None, :, :], 1)
    part = heads * NSPLIT + c
    tl.store(part_m_ptr + part, m, mask=g_ok)
    tl.store(part_l_ptr + part, l_sum, mask=g_ok)
    po = part_o_ptr + part[:, None] * D + dh[None, :]
    tl.store(po, o1, mask=g_ok[:, None])
    tl.store(po + HALF, o2, mask=g_ok[:, None])
    if MERGE:
        # Every thread's partial stores are done before one thread's release (the CUTLASS
        # semaphore pattern); the last program's acquire makes all chunks' stores visible.
        tl.debug_barrier()
        done = tl.atomic_add(count_ptr + j, 1, sem="acq_rel")
        if done == NSPLIT - 1:
            cc = tl.arange(0, BLOCK_S)
            mk = g_ok[:, None] & (cc < NSPLIT)[None, :]
            pidx = heads[:, None] * NSPLIT + cc[None, :]
            pm = tl.load(part_m_ptr + pidx, mask=mk, other=float("-inf"), cache_modifier=".cg")
            pl = tl.load(part_l_ptr + pidx, mask=mk, other=0.0, cache_modifier=".cg")
            mmax = tl.max(pm, 1)
            w = tl.where(pm == float("-inf"), 0.0, tl.exp(pm - mmax[:, None]))
            den = tl.sum(pl * w, 1)
            oa = part_o_ptr + pidx[:, :, None] * D + dh[None, None, :]
            a1 = tl.load(oa, mask=mk[:, :, None], other=0.0, cache_modifier=".cg")
            a2 = tl.load(oa + HALF, mask=mk[:, :, None], other=0.0, cache_modifier=".cg")
            out = out_ptr + heads[:, None] * D + dh[None, :]
            oty = out_ptr.dtype.element_ty
            tl.store(out, (tl.sum(a1 * w[:, :, None], 1) / den[:, None]).to(oty),
                     mask=g_ok[:, None])
            tl.store(out + HALF, (tl.sum(a2 * w[:, :, None], 1) / den[:, None]).to(oty),
                     mask=g_ok[:, None])
            tl.store(count_ptr + j, 0)


@triton.jit
def decode_attention_reduce_kernel(part_o_ptr, part_m_ptr, part_l_ptr, out_ptr,
                                   D: tl.constexpr, NSPLIT: tl.constexpr,
                                   BLOCK_S: tl.constexpr, PDL: tl.constexpr = False):
    """Combine the chunks of :func:`decode_attention_kernel` for query head ``program_id(0)``:
    ``out[h, :] = sum_c e^(m_c - m) o_c / sum_c e^(m_c - m) l_c`` with ``m = max_c m_c``
    (the log-sum-exp merge of flash-decoding). ``out``: ``[H * D]`` (the store casts)."""
    _pdl_enter(PDL)
    h = tl.program_id(0)
    c = tl.arange(0, BLOCK_S)
    c_ok = c < NSPLIT
    m = tl.load(part_m_ptr + h * NSPLIT + c, mask=c_ok, other=float("-inf"))
    l_sum = tl.load(part_l_ptr + h * NSPLIT + c, mask=c_ok, other=0.0)
    m_max = tl.max(m, 0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_max))
    d = tl.arange(0, D)
    o = tl.load(part_o_ptr + (h * NSPLIT + c)[:, None] * D + d[None, :], mask=c_ok[:, None],
                other=0.0)
    num = tl.sum(o * w[:, None], 0)
    den = tl.sum(l_sum * w, 0)
    tl.store(out_ptr + h * D + d, (num / den).to(out_ptr.dtype.element_ty))


@triton.jit
def argmax_kernel(logits_ptr, tok_ptr, pos_ptr, out_tokens_ptr, step_ptr,
                  V: tl.constexpr, BLOCK: tl.constexpr, ADVANCE: tl.constexpr,
                  PDL: tl.constexpr = False):
    """Greedy sampling: ``tok[0] = argmax(logits)`` (the first index of the max, as
    ``torch.argmax``), appended at ``out_tokens[step[0]]``; then ``pos[0] += ADVANCE`` (the tokens
    this step consumed: 1 in decode, the prompt length in prefill) and ``step[0] += 1``. One
    program; logits float32 ``[V]``."""
    _pdl_enter(PDL)
    best_v = tl.full((BLOCK,), float("-inf"), dtype=tl.float32)
    best_i = tl.zeros((BLOCK,), dtype=tl.int32)
    for v0 in range(0, V, BLOCK):
        idx = v0 + tl.arange(0, BLOCK)
        x = tl.load(logits_ptr + idx, mask=idx < V, other=float("-inf"))
        better = x > best_v
        best_v = tl.where(better, x, best_v)
        best_i = tl.where(better, idx, best_i)
    top = tl.max(best_v, 0)
    cand = tl.where(best_v == top, best_i, V)
    token = tl.min(cand, 0)
    tl.store(tok_ptr, token)
    step = tl.load(step_ptr)
    tl.store(out_tokens_ptr + step, token)
    tl.store(pos_ptr, tl.load(pos_ptr) + ADVANCE)
    tl.store(step_ptr, step + 1)


@triton.jit
def gumbel_sample_kernel(logits_ptr, seed_ptr, inv_temp_ptr, tok_ptr, out_tokens_ptr, step_ptr,
                         V: tl.constexpr, BLOCK: tl.constexpr):
    """Sampling from ``softmax(logits / T)`` on the device, after :func:`argmax_kernel` in the same
    step (which advanced ``pos`` and ``step``): the Gumbel-max trick, ``token = argmax(logits * (1
    / T) + g)`` with ``g = -log(-log(u))`` and ``u`` uniform from Triton's counter-based Philox
    generator (``tl.rand``) keyed by ``seed[0]`` at counters ``(step[0] - 1) * V + index``, so a seed
    gives the same draws on every run and every step its own; overwrites ``tok[0]`` and
    ``out_tokens[step[0] - 1]``. One program; logits float32 ``[V]``; ``inv_temp[0]`` float32,
    ``seed[0]`` int32 (both read from memory: a captured CUDA graph replays with new values)."""
    seed = tl.load(seed_ptr)
    inv_t = tl.load(inv_temp_ptr)
    step = tl.load(step_ptr) - 1
    best_v = tl.full((BLOCK,), float("-inf"), dtype=tl.float32)
    best_i = tl.zeros((BLOCK,), dtype=tl.int32)
    for v0 in range(0, V, BLOCK):
        idx = v0 + tl.arange(0, BLOCK)
        x = tl.load(logits_ptr + idx, mask=idx < V, other=float("-inf"))
        u = tl.rand(seed, step * V + idx)
        u = tl.minimum(tl.maximum(u, 1e-20), 1.0 - 1e-7)
        score = x * inv_t - tl.log(-tl.log(u))
        score = tl.where(idx < V, score, float("-inf"))
        better = score > best_v
        best_v = tl.where(better, score, best_v)
        best_i = tl.where(better, idx, best_i)
    top = tl.max(best_v, 0)
    token = tl.min(tl.where(best_v == top, best_i, V), 0)
    tl.store(tok_ptr, token)
    tl.store(out_tokens_ptr + step, token)


__all__ = ["argmax_kernel", "decode_attention_kernel", "decode_attention_reduce_kernel",
           "embed_kernel", "gemm_planes_kernel", "gemv_kernel", "gemv_planes_kernel",
           "gumbel_sample_kernel", "heads_to_rows_kernel", "rmsnorm_kernel", "rotary_cache_kernel",
           "silu_mul_kernel"]
