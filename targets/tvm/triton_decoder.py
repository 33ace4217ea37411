"""Greedy generation on CUDA with the decode kernels of ``targets/tvm/triton_decode.py``: a
prefill of the prompt, then decode steps captured once as one CUDA graph (issue 17, item 3).

The step's launch sequence (per layer: fused-RMSNorm QKV GEMV, rotary + KV cache write,
split-KV attention and its merge, O GEMV + residual, fused-RMSNorm gate/up GEMV, SiLU-gated down
GEMV + residual; then the final norm + LM head GEMV and greedy argmax) reads its token and
position from device memory and advances them itself, so every replay is the same graph and the
host only launches it and reads the token. This module runs the sequence through Triton's
launcher on torch CUDA tensors (``torch.cuda.CUDAGraph`` captures it): it is the GPU reference
runtime the benchmark times (``benchmarks/gpu_decode.py``); the kernels are the ones the TVM
emitter embeds.

Weights: transformers' Llama state dict layout (``model.layers.N.self_attn.q_proj.weight`` ...),
``[out, in]`` row-major, fp16 / bf16; with ``wbits`` 8 or 4 the projections are quantized
weight-only (round-to-nearest: int8 one symmetric scale per output channel, int4 one
symmetric scale per ``group`` inputs), the embedding stays in the float dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from passctl.targets.tvm import triton_decode as K


@dataclass
class GemvConfig:
    """Tile sizes of one :func:`gemv_kernel` launch."""

    block_n: int = 16
    block_k: int = 256
    num_warps: int = 4
    #: programs along K adding into the float32 residual with atomics (only the O and down
    #: projections, whose output is the residual stream; 1 elsewhere)
    split_k: int = 1
    #: software-pipelining depth of the K loop (Triton's ``num_stages``; None: its default)
    num_stages: Optional[int] = None
    #: with the decoder's ``act_int8``: this projection takes the integer-dot kernel (False:
    #: the float-dequantizing one, where a sweep found it faster)
    a8: bool = True

    def launch_options(self) -> Dict[str, int]:
        """Triton launch options: ``num_warps`` and, where set, ``num_stages``."""
        opts = dict(num_warps=self.num_warps)
        if self.num_stages is not None:
            opts["num_stages"] = self.num_stages
        return opts


#: inputs per activation quantization block of the integer-dot GEMV (``act_int8``)
A8_BLOCK = 128


def quantize_rtn(w, bits: int, group: int = 128):
    """Round-to-nearest symmetric weight-only quantization of a ``[N, K]`` torch weight.

    Returns ``(q, scale)``: bits 8: int8 ``[N, K]`` and fp32 ``[N]`` (scale = max|w| / 127 per
    row); bits 4: uint8 ``[N, K / 2]`` (two nibbles, value + 8, element 2j low) and fp32
    ``[N, K / group]`` (scale = max|w| / 7 per block). ``W ~= q * scale``.
    """
    import torch

    w = w.float()
    if bits == 8:
        scale = (w.abs().amax(1) / 127.0).clamp_min(1e-12)
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        return q, scale
    n, k = w.shape
    blocks = w.reshape(n, k // group, group)
    scale = (blocks.abs().amax(2) / 7.0).clamp_min(1e-12)
    q = torch.round(blocks / scale[:, :, None]).clamp(-8, 7).to(torch.int32) + 8
    q = q.reshape(n, k)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)
    return packed.contiguous(), scale.contiguous()


def dequantize(q, scale, bits: int, group: int = 128):
    """The float32 ``[N, K]`` weight that :func:`quantize_rtn`'s ``(q, scale)`` stands for."""
    import torch

    if bits == 8:
        return q.float() * scale[:, None]
    lo = (q & 15).to(torch.int32) - 8
    hi = (q >> 4).to(torch.int32) - 8
    n = q.shape[0]
    vals = torch.stack([lo, hi], 2).reshape(n, -1).float()
    return (vals.reshape(n, -1, group) * scale[:, :, None]).reshape(n, -1)


#: the decode GEMVs' weight layouts (see :class:`TritonDecoder`)
LAYOUTS = ("rows", "half2", "planes")

#: inputs per plane block of the int8 code-plane layout (int4's is its quantization group)
PLANES_INT8_BLOCK = 128


def codes_of(q, bits: int):
    """The unsigned codes ``c = value + 2^(bits-1)`` (int32 ``[N, K]``) of :func:`quantize_rtn`'s
    ``q`` (int8 ``[N, K]``, or int4 nibble pairs ``[N, K / 2]``)."""
    import torch

    if bits == 8:
        return q.to(torch.int32) + 128
    n = q.shape[0]
    return torch.stack([(q & 15).to(torch.int32), (q >> 4).to(torch.int32)], 2).reshape(n, -1)


def pack_planes(codes, bits: int, block: int):
    """Unsigned codes ``[N, K]`` (int32, ``0 .. 2^bits - 1``) in the code-plane layout of
    :func:`~passctl.targets.tvm.triton_decode.gemv_planes_kernel`: int32 ``[N, K / P]``, ``P =
    32 / bits``; in each plane block of ``block`` inputs (``WG = block / P`` words), word ``j``
    holds in bits ``bits * i ..`` the code of input ``i * WG + j`` of the block.

    Raises:
        ValueError: ``K`` is not a multiple of ``block``, or ``block`` not of ``P``.
    """
    import torch

    n, k = codes.shape
    per = 32 // bits
    if k % block or block % per:
        raise ValueError(f"K={k} is not a multiple of the plane block {block} (or the block of "
                         f"{per} codes per word)")
    wg = block // per
    planes = codes.to(torch.int32).reshape(n, k // block, per, wg)
    word = torch.zeros(n, k // block, wg, dtype=torch.int32, device=codes.device)
    for i in range(per):
        word |= planes[:, :, i, :] << (bits * i)
    return word.reshape(n, k // per).contiguous()


class _Linear:
    """One projection's device weight in the GEMV's format.

    ``layout``: ``rows`` (:func:`quantize_rtn`'s bytes, read by ``gemv_kernel`` /
    ``gemv_a8_kernel``), ``half2`` (the same bytes read in 64-bit words by
    ``gemv_half2_kernel``) or ``planes`` (int8 / int4 only: :func:`pack_planes`, read by
    ``gemv_planes_kernel``; the same codes and scales)."""

    def __init__(self, w, wbits: int, group: int, layout: str = "rows"):
        import torch

        self.n, self.k = int(w.shape[0]), int(w.shape[1])
        self.wbits, self.group = wbits, group
        self.layout = layout if wbits != 16 else "rows"
        if wbits == 16:
            self.float_weight = w.contiguous()
            self.w, self.scale = self.float_weight, self.float_weight
            self.kernel_weight = self.w
        else:
            self.w, self.scale = quantize_rtn(w, wbits, group)
            if self.layout == "planes":
                # decode and prefill (gemm_planes_kernel) read the same words: no float copy
                block = group if wbits == 4 else next(
                    (b for b in (PLANES_INT8_BLOCK, 64, 32) if self.k % b == 0), 4)
                self.plane_words = block // (32 // wbits)
                if self.plane_words < 16:  # the prefill GEMM's dot needs K >= 16 per plane
                    raise ValueError(f"layout='planes' needs plane blocks of >= {16 * 32 // wbits} "
                                     f"inputs (int4: group >= 128; int8: K a multiple of 64); "
                                     f"K={self.k}, group={group}")
                self.w = pack_planes(codes_of(self.w, wbits), wbits, block)
                self.kernel_weight = self.w
                self.float_weight = None
            else:
                # The prefill GEMMs read the same quantized weight, dequantized once.
                self.float_weight = dequantize(self.w, self.scale, wbits, group).to(w.dtype)
                # gemv_kernel reads int8 through a uint8 view (see its docstring)
                self.kernel_weight = self.w.view(torch.uint8)
                if self.layout == "half2":  # the same bytes in 64-bit words of 64 / wbits inputs
                    if self.k % (64 // wbits):
                        raise ValueError(f"layout='half2' needs K a multiple of {64 // wbits} "
                                         f"(int{wbits}); K={self.k}")
                    if wbits == 4 and (group < 16 or group & (group - 1)):
                        # gemv_half2_kernel's tiles (powers of two) must nest with the groups
                        raise ValueError(f"layout='half2' needs int4 groups that are powers of "
                                         f"two >= 16; group={group}")
                    self.kernel_weight = self.kernel_weight.view(torch.int64)

    @property
    def nbytes(self) -> int:
        return int(self.w.numel() * self.w.element_size()
                   + (0 if self.wbits == 16 else self.scale.numel() * 4))


class TritonDecoder:
    """A Llama-style decoder (batch 1) on one CUDA device with a static KV cache.

    Args:
        state: transformers' state dict (tensors on the CUDA device, fp16 / bf16).
        config: the transformers ``LlamaConfig`` (or any with the same attributes).
        max_length: cache length M (prompt + new tokens).
        wbits: 16 (weights as given), 8 or 4 (weight-only RTN, see the module docstring).
        gemv: tile sizes per projection name (``qkv``, ``o``, ``gate_up``, ``down``,
            ``lm_head``); missing names use :class:`GemvConfig`'s defaults.
        fuse_attention: decode attention rotates Q / K, writes the cache row and merges its
            chunks itself (5 kernels per layer instead of 7; see ``decode_attention_kernel``).
        pdl: launch the decode step's kernels with programmatic dependent launch (sm_90+):
            each kernel's launch overlaps the previous one's tail.
        split: cache rows per decode-attention program (flash-decoding's chunk; a power of
            two dividing ``max_length``).
        act_int8: with ``wbits`` 8 or 4, the decode GEMVs quantize their input vector to int8
            per block of :data:`A8_BLOCK` at run time and multiply with integer dot products
            (``gemv_a8_kernel``; the scheme of ONNX Runtime's MatMulNBits at accuracy_level 4).
            Int4 needs ``group`` = :data:`A8_BLOCK`. The prefill is unchanged (float GEMMs).
        layout: with ``wbits`` 8 or 4, ``rows`` (``gemv_kernel``'s bytes), ``half2`` (the same
            bytes, read by ``gemv_half2_kernel``: fp16 pair arithmetic, two weights per
            instruction; ``K`` a multiple of 64 / wbits) or ``planes`` (the
            code-plane words of :func:`pack_planes`, read by ``gemv_planes_kernel``; its tiles'
            ``block_k`` must be a multiple of 128). Not with ``act_int8``.

    Raises:
        ValueError: the head size is not a power of two, or ``max_length`` is not a multiple
            of the attention split; ``act_int8`` with fp16 weights or an int4 group other
            than :data:`A8_BLOCK`.
    """

    def __init__(self, state: Dict, config, max_length: int, wbits: int = 16, group: int = 128,
                 gemv: Optional[Dict[str, GemvConfig]] = None, inv_freq=None,
                 fuse_attention: bool = True, pdl: bool = False, split: int = 64,
                 act_int8: bool = False, layout: str = "rows"):
        import torch

        self.config = config
        self.L = int(config.num_hidden_layers)
        self.hidden = int(config.hidden_size)
        self.inter = int(config.intermediate_size)
        self.H = int(config.num_attention_heads)
        self.KVH = int(getattr(config, "num_key_value_heads", None) or self.H)
        self.D = int(getattr(config, "head_dim", None) or self.hidden // self.H)
        self.V = int(config.vocab_size)
        self.eps = float(config.rms_norm_eps)
        self.M = int(max_length)
        self.SPLIT = int(split)
        self.fuse_attention = bool(fuse_attention)
        if act_int8 and (wbits == 16 or (wbits == 4 and group != A8_BLOCK)):
            raise ValueError(f"act_int8 needs int8 weights or int4 in groups of {A8_BLOCK} "
                             f"(got wbits={wbits}, group={group})")
        self.act_int8 = bool(act_int8)
        if layout not in LAYOUTS or (layout != "rows" and act_int8):
            raise ValueError(f"layout={layout!r}: use one of {', '.join(LAYOUTS)} (only rows with "
                             f"act_int8)")
        self.layout = layout
        if pdl and not K.HAS_PDL:
            raise ValueError("this Triton has no grid dependency control (pdl=True needs >= 3.3)")
        self.pdl = bool(pdl)
        if self.D & (self.D - 1):
            raise ValueError(f"head size {self.D} is not a power of two")
        if self.M % self.SPLIT:
            raise ValueError(f"max_length {self.M} is not a multiple of {self.SPLIT}")
        default = GemvConfig(16, 2048, 2) if layout == "half2" and wbits != 16 else GemvConfig()
        self.gemv = {name: default for name in ("qkv", "o", "gate_up", "down", "lm_head")}
        self.gemv.update(gemv or {})
        emb = state["model.embed_tokens.weight"]
        dev, dt = emb.device, emb.dtype
        self.device, self.dtype = dev, dt
        self.emb = emb.contiguous()
        head = state.get("lm_head.weight", emb)
        self.layers = []
        for i in range(self.L):
            p = f"model.layers.{i}."
            get = lambda name: state[p + name]  # noqa: E731
            qkv = torch.cat([get("self_attn.q_proj.weight"), get("self_attn.k_proj.weight"),
                             get("self_attn.v_proj.weight")], 0)
            gate_up = torch.cat([get("mlp.gate_proj.weight"), get("mlp.up_proj.weight")], 0)
            self.layers.append(dict(
                attn_norm=get("input_layernorm.weight").float().contiguous(),
                mlp_norm=get("post_attention_layernorm.weight").float().contiguous(),
                qkv=_Linear(qkv, wbits, group, layout),
                o=_Linear(get("self_attn.o_proj.weight"), wbits, group, layout),
                gate_up=_Linear(gate_up, wbits, group, layout),
                down=_Linear(get("mlp.down_proj.weight"), wbits, group, layout)))
        self.final_norm = state["model.norm.weight"].float().contiguous()
        self.lm_head = _Linear(head, wbits, group, layout)
        if inv_freq is None:
            base = float(getattr(config, "rope_theta", None)
                         or (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
            inv_freq = 1.0 / (base ** (torch.arange(0, self.D, 2, dtype=torch.float64) / self.D))
        pos = torch.arange(self.M, dtype=torch.float64)[:, None] * inv_freq.double().cpu()[None, :]
        self.cos = torch.cos(pos).float().to(dev).contiguous()
        self.sin = torch.sin(pos).float().to(dev).contiguous()
        # State: caches, position, step counter, token, generated tokens.
        self.k_cache = [torch.zeros(self.KVH, self.M, self.D, device=dev, dtype=dt)
                        for _ in range(self.L)]
        self.v_cache = [torch.zeros(self.KVH, self.M, self.D, device=dev, dtype=dt)
                        for _ in range(self.L)]
        i32 = dict(device=dev, dtype=torch.int32)
        self.pos = torch.zeros(1, **i32)
        self.step_no = torch.zeros(1, **i32)
        self.tok = torch.zeros(1, **i32)
        self.out_tokens = torch.zeros(self.M + 1, **i32)
        # Decode scratch.
        self.nsplit = self.M // self.SPLIT
        self.x = torch.zeros(self.hidden, device=dev, dtype=torch.float32)
        self.qkv = torch.empty((self.H + 2 * self.KVH) * self.D, device=dev, dtype=dt)
        self.q = torch.empty(self.H * self.D, device=dev, dtype=dt)
        self.attn = torch.empty(self.H * self.D, device=dev, dtype=dt)
        self.part_o = torch.empty(self.H * self.nsplit * self.D, device=dev, dtype=torch.float32)
        self.part_m = torch.empty(self.H * self.nsplit, device=dev, dtype=torch.float32)
        self.part_l = torch.empty(self.H * self.nsplit, device=dev, dtype=torch.float32)
        self.count = torch.zeros(self.KVH, **i32)
        self.gu = torch.empty(2 * self.inter, device=dev, dtype=dt)
        self.logits = torch.empty(self.V, device=dev, dtype=torch.float32)
        self.graph = None

    # -- sizes ------------------------------------------------------------------------------

    @property
    def weight_bytes(self) -> int:
        """Bytes one decode step reads from weights (projections, LM head, one embedding row)."""
        total = sum(lin.nbytes for layer in self.layers
                    for lin in (layer["qkv"], layer["o"], layer["gate_up"], layer["down"]))
        return total + self.lm_head.nbytes + self.hidden * self.emb.element_size()

    # -- kernels ----------------------------------------------------------------------------

    def _launch(self, pdl: bool):
        """Launch keyword arguments of a decode-step kernel."""
        return dict(PDL=True, launch_pdl=True) if pdl else {}

    def _gemv(self, lin: _Linear, cfg: GemvConfig, x, out, prologue=0, norm=None, res=None,
              pdl=False):
        split = cfg.split_k if (res is out and out.dtype == self.x.dtype) else 1
        grid = (triton_cdiv(lin.n, cfg.block_n), split)
        if lin.layout == "half2":
            K.gemv_half2_kernel[grid](
                lin.kernel_weight, lin.scale, x, norm if norm is not None else x,
                res if res is not None else out, out, N=lin.n, K=lin.k, EPS=self.eps,
                WBITS=lin.wbits, GROUP=lin.group, PROLOGUE=prologue, HAS_RES=res is not None,
                BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split,
                EMULATE=K.interpreted(), **cfg.launch_options(), **self._launch(pdl))
            return
        if lin.layout == "planes":
            K.gemv_planes_kernel[grid](
                lin.kernel_weight, lin.scale, x, norm if norm is not None else x,
                res if res is not None else out, out, K.PLANES_MAGIC, N=lin.n, K=lin.k, EPS=self.eps,
                WBITS=lin.wbits, WG=lin.plane_words, PROLOGUE=prologue, HAS_RES=res is not None,
                BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split,
                **cfg.launch_options(), **self._launch(pdl))
            return
        kernel, block_k = K.gemv_kernel, cfg.block_k
        if self.act_int8 and cfg.a8:
            kernel, block_k = K.gemv_a8_kernel, A8_BLOCK
        kernel[grid](lin.kernel_weight, lin.scale, x, norm if norm is not None else x,
                     res if res is not None else out, out,
                     N=lin.n, K=lin.k, EPS=self.eps, WBITS=lin.wbits, GROUP=lin.group,
                     PROLOGUE=prologue, HAS_RES=res is not None,
                     BLOCK_N=cfg.block_n, BLOCK_K=block_k, SPLIT_K=split,
                     **cfg.launch_options(), **self._launch(pdl))

    def _attention_decode(self, layer_index: int):
        group = self.H // self.KVH
        pdl = self._launch(self.pdl)
        i = layer_index
        fused = self.fuse_attention
        if not fused:
            K.rotary_cache_kernel[(self.H + self.KVH, 1)](
                self.qkv, self.cos, self.sin, self.pos, self.q, self.k_cache[i], self.v_cache[i],
                H=self.H, KVH=self.KVH, D=self.D, M=self.M, num_warps=1, **pdl)
        K.decode_attention_kernel[(self.KVH, self.nsplit)](
            self.qkv if fused else self.q, self.k_cache[i], self.v_cache[i], self.pos,
            self.cos, self.sin, self.part_o, self.part_m, self.part_l, self.count, self.attn,
            H=self.H, KVH=self.KVH, GROUP=group, D=self.D, M=self.M, SPLIT=self.SPLIT,
            NSPLIT=self.nsplit, SCALE=1.0 / math.sqrt(self.D), BLOCK_G=triton_next_pow2(group),
            BLOCK_S=triton_next_pow2(self.nsplit), ROTARY=fused, MERGE=fused, num_warps=4, **pdl)
        if not fused:
            K.decode_attention_reduce_kernel[(self.H,)](
                self.part_o, self.part_m, self.part_l, self.attn, D=self.D, NSPLIT=self.nsplit,
                BLOCK_S=triton_next_pow2(self.nsplit), num_warps=1, **pdl)

    def decode_step(self) -> None:
        """One token: reads ``tok`` and ``pos``, writes the cache at ``pos``, samples the next
        token into ``tok`` / ``out_tokens[step]``, advances ``pos`` and ``step``."""
        pdl = self.pdl
        K.embed_kernel[(1,)](self.tok, self.emb, self.x, K=self.hidden, BLOCK=1024, num_warps=4,
                             **self._launch(pdl))
        g = self.gemv
        for i, layer in enumerate(self.layers):
            self._gemv(layer["qkv"], g["qkv"], self.x, self.qkv, prologue=1,
                       norm=layer["attn_norm"], pdl=pdl)
            self._attention_decode(i)
            self._gemv(layer["o"], g["o"], self.attn, self.x, res=self.x, pdl=pdl)
            self._gemv(layer["gate_up"], g["gate_up"], self.x, self.gu, prologue=1,
                       norm=layer["mlp_norm"], pdl=pdl)
            self._gemv(layer["down"], g["down"], self.gu, self.x, prologue=2, res=self.x, pdl=pdl)
        self._gemv(self.lm_head, g["lm_head"], self.x, self.logits, prologue=1,
                   norm=self.final_norm, pdl=pdl)
        K.argmax_kernel[(1,)](self.logits, self.tok, self.pos, self.out_tokens, self.step_no,
                              V=self.V, BLOCK=1024, ADVANCE=1, num_warps=4, **self._launch(pdl))

    def prefill(self, ids: Sequence[int]) -> None:
        """The prompt (positions 0 .. S-1) through batched GEMMs and the FlashAttention kernel;
        fills the cache, samples the first new token, sets ``pos`` to S."""
        import torch

        from passctl.targets.tvm.triton_kernels import attention_kernel, gemm_kernel

        S = len(ids)
        if S + 1 > self.M:
            raise ValueError(f"prompt of {S} tokens does not fit a cache of {self.M}")
        dev, dt = self.device, self.dtype
        self.pos.zero_()
        self.step_no.zero_()
        toks = torch.tensor(list(ids), device=dev, dtype=torch.int32)
        x = torch.empty(S, self.hidden, device=dev, dtype=torch.float32)
        h = torch.empty(S, self.hidden, device=dev, dtype=dt)
        qkv = torch.empty(S, (self.H + 2 * self.KVH) * self.D, device=dev, dtype=dt)
        q = torch.empty(S, self.H * self.D, device=dev, dtype=dt)
        att = torch.empty(self.H, S, self.D, device=dev, dtype=dt)
        att_rows = torch.empty(S, self.H * self.D, device=dev, dtype=dt)
        gu = torch.empty(S, 2 * self.inter, device=dev, dtype=dt)
        act = torch.empty(S, self.inter, device=dev, dtype=dt)
        K.embed_kernel[(S,)](toks, self.emb, x, K=self.hidden, BLOCK=1024, num_warps=4)

        def gemm(a, lin: _Linear, out, res=None):
            m, kk = a.shape
            bm = 16 if m <= 16 else (64 if m <= 128 else 128)
            if lin.layout == "planes":  # dequantized in registers, one dot per code plane
                bn = 128
                K.gemm_planes_kernel[(triton_cdiv(m, bm) * triton_cdiv(lin.n, bn),)](
                    a, lin.kernel_weight, lin.scale, res if res is not None else out, out,
                    M=m, N=lin.n, K=kk, WBITS=lin.wbits, WG=lin.plane_words,
                    HAS_RES=res is not None, BLOCK_M=bm, BLOCK_N=bn, GROUP_M=8,
                    num_warps=4 if bm <= 64 else 8, num_stages=3)
                return
            w = lin.float_weight
            bn, bk = 128, 64
            grid = (triton_cdiv(m, bm) * triton_cdiv(lin.n, bn), 1)
            gemm_kernel[grid](a, w, out, res if res is not None else out, out,
                              M=m, N=lin.n, K=kk, stride_am=kk, stride_ak=1, stride_bk=1,
                              stride_bn=kk, stride_ab=0, stride_bb=0, HAS_BIAS=False, ACT=0,
                              HAS_RES=res is not None, PRECISION="none", BLOCK_M=bm,
                              BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=4 if bm <= 64 else 8,
                              num_stages=3)

        group = self.H // self.KVH
        for i, layer in enumerate(self.layers):
            K.rmsnorm_kernel[(S,)](x, layer["attn_norm"], h, K=self.hidden, EPS=self.eps,
                                   BLOCK=1024, num_warps=4)
            gemm(h, layer["qkv"], qkv)
            K.rotary_cache_kernel[(self.H + self.KVH, S)](
                qkv, self.cos, self.sin, self.pos, q, self.k_cache[i], self.v_cache[i],
                H=self.H, KVH=self.KVH, D=self.D, M=self.M, num_warps=1)
            kc, vc = self.k_cache[i], self.v_cache[i]
            bm = 64 if S >= 64 else 16
            attention_kernel[(triton_cdiv(S, bm), self.H)](
                q, kc, vc, q, att, H=self.H, GROUP=group, S=S, T=S, D=self.D, DV=self.D,
                sqb=0, sqh=self.D, sqs=self.H * self.D, skb=0, skh=self.M * self.D, sks=self.D,
                svb=0, svh=self.M * self.D, svs=self.D, smb=0, smh=0, sms=0,
                SCALE=1.0 / math.sqrt(self.D), MASK=0, CAUSAL=True, NAN_TO_ZERO=False,
                PRECISION="none", BLOCK_M=bm, BLOCK_N=64, BLOCK_D=self.D, BLOCK_DV=self.D,
                num_warps=4)
            K.heads_to_rows_kernel[(S, self.H)](att, att_rows, S=S, D=self.D, num_warps=1)
            gemm(att_rows, layer["o"], x, res=x)
            K.rmsnorm_kernel[(S,)](x, layer["mlp_norm"], h, K=self.hidden, EPS=self.eps,
                                   BLOCK=1024, num_warps=4)
            gemm(h, layer["gate_up"], gu)
            K.silu_mul_kernel[(S,)](gu, act, K=self.inter, BLOCK=1024, num_warps=4)
            gemm(act, layer["down"], x, res=x)
        self._gemv(self.lm_head, self.gemv["lm_head"], x[S - 1], self.logits, prologue=1,
                   norm=self.final_norm)
        K.argmax_kernel[(1,)](self.logits, self.tok, self.pos, self.out_tokens, self.step_no,
                              V=self.V, BLOCK=1024, ADVANCE=S, num_warps=4)

    # -- CUDA graph -------------------------------------------------------------------------

    def capture(self, step=None):
        """Capture :meth:`decode_step` as one CUDA graph (the kernels compile first, outside
        the capture). The warm-up step changes ``pos`` / ``tok``; they are restored.

        ``step``: another callable to capture instead (a decode step followed by more kernels);
        its graph is returned and ``graph`` (what :meth:`generate` replays) is left as it is."""
        import torch

        fn = step or self.decode_step
        saved = [t.clone() for t in (self.pos, self.step_no, self.tok, self.out_tokens)]
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize()
        # The warm-up step also wrote the cache row at pos: the next real step rewrites that row
        # before its attention reads it.
        for t, s in zip((self.pos, self.step_no, self.tok, self.out_tokens), saved):
            t.copy_(s)
        if step is None:
            self.graph = graph
        return graph

    def generate(self, ids: Sequence[int], max_new_tokens: int) -> List[int]:
        """Greedy tokens after ``ids`` (prefill, then ``max_new_tokens - 1`` graph replays).
        Tokens are read back once at the end (``out_tokens``)."""
        import torch

        if len(ids) + max_new_tokens > self.M:
            raise ValueError(f"{len(ids)} + {max_new_tokens} tokens do not fit a cache of {self.M}")
        self.prefill(ids)
        for _ in range(max_new_tokens - 1):
            if self.graph is not None:
                self.graph.replay()
            else:
                self.decode_step()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return [int(t) for t in self.out_tokens[:max_new_tokens].tolist()]


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


__all__ = ["A8_BLOCK", "GemvConfig", "TritonDecoder", "dequantize", "quantize_rtn"]
