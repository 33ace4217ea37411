"""Run under ``TRITON_INTERPRET=1`` (Triton's CPU interpreter) by test_triton_decode.py: the
decode kernels of ``passctl.targets.tvm.triton_decode`` against independent references.

    python triton_decode_check.py generate   # tiny Llama: greedy tokens + teacher-forced logits
    python triton_decode_check.py gemv       # GEMV fp32 / int8 / int4, every prologue, split-K
    python triton_decode_check.py gemv_a8    # the integer-dot GEMV (int8 activations)
    python triton_decode_check.py gemv_planes  # the code-plane GEMV and GEMM (int8 / int4)
    python triton_decode_check.py generate_planes  # tiny Llama, int8 / int4 code planes

Prints one JSON object on stdout.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch


def _teacher_forced_max_rel(dec, prompt, ref_tokens, ref_logits) -> float:
    """Largest relative error of the decoder's logits against transformers' full forward
    ``ref_logits`` ([positions, vocab]) at every step, the reference's tokens fed back (teacher
    forcing): prefill of ``prompt``, then one decode step per token but the last."""
    dec.prefill(prompt)
    worst = 0.0
    for j in range(len(ref_tokens)):
        r = ref_logits[len(prompt) - 1 + j]
        worst = max(worst, float((dec.logits - r).abs().max() / r.abs().max()))
        if j + 1 < len(ref_tokens):
            dec.tok.fill_(ref_tokens[j])
            dec.decode_step()
    return worst


def generate() -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    from passctl.targets.tvm.triton_decoder import GemvConfig, TritonDecoder

    out = {}
    for name, kvh in (("gqa", 2), ("mha", 4))[: int(sys.argv[2]) if len(sys.argv) > 2 else 2]:
        torch.manual_seed(0)
        cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=kvh, vocab_size=97,
                          max_position_embeddings=128, rms_norm_eps=1e-5)
        cfg._attn_implementation = "eager"
        model = LlamaForCausalLM(cfg).eval()
        prompt = torch.tensor([[5, 17, 3, 42, 8, 64, 1]])
        n_new = 9
        with torch.no_grad():
            ref = model.generate(prompt, max_new_tokens=n_new, min_new_tokens=n_new,
                                 do_sample=False, pad_token_id=0)
            ref_logits = model(ref).logits[0]
        ref_tokens = ref[0, prompt.shape[1]:].tolist()
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for fused in (False, True):
            gemv = {"o": GemvConfig(8, 32, 1, split_k=2), "down": GemvConfig(8, 32, 1, split_k=3)}
            dec = TritonDecoder(sd, cfg, max_length=32, split=8, gemv=gemv, fuse_attention=fused,
                                inv_freq=model.model.rotary_emb.inv_freq)
            toks = dec.generate(prompt[0].tolist(), n_new)
            worst = _teacher_forced_max_rel(dec, prompt[0].tolist(), ref_tokens, ref_logits)
            out[f"{name}-{'fused' if fused else 'unfused'}"] = dict(
                tokens=toks, ref_tokens=ref_tokens, max_rel=worst,
                count_reset=int(dec.count.abs().sum()))
    return out


def generate_planes() -> dict:
    """Greedy tokens and teacher-forced logits of the decode step with int4 weights in code
    planes (decode GEMV and prefill GEMM both read the packed words), and with int4 rows read by
    the f16x2 GEMV (layout half2, its arithmetic emulated; int8's in the GEMV test), against transformers' fp32
    Llama whose projections hold the same quantized weights, dequantized (quantize_rtn's)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from passctl.targets.tvm.triton_decoder import (GemvConfig, TritonDecoder, dequantize,
                                                    quantize_rtn)

    out = {}
    # int8 in code planes runs end to end through the CUDA artifact's interpreter test
    # (tests/decoder/test_cuda_artifact.py); int4 here
    for bits, layout in ((4, "planes"), (4, "half2")):
        torch.manual_seed(0)
        cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, vocab_size=97,
                          max_position_embeddings=128, rms_norm_eps=1e-5)
        cfg._attn_implementation = "eager"
        model = LlamaForCausalLM(cfg).eval()
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        with torch.no_grad():  # the reference holds the weights the artifact stands for
            for name, p in model.named_parameters():
                if p.dim() == 2 and "embed_tokens" not in name:
                    q, sc = quantize_rtn(p.detach(), bits, 128)
                    p.copy_(dequantize(q, sc, bits, 128))
        prompt = torch.tensor([[5, 17, 3, 42, 8, 64, 1]])
        n_new = 6
        with torch.no_grad():
            ref = model.generate(prompt, max_new_tokens=n_new, min_new_tokens=n_new,
                                 do_sample=False, pad_token_id=0)
            ref_logits = model(ref).logits[0]
        ref_tokens = ref[0, prompt.shape[1]:].tolist()
        gemv = {name: GemvConfig(8, 256, 1) for name in ("qkv", "gate_up", "lm_head")}
        gemv.update(o=GemvConfig(8, 128, 1, split_k=1), down=GemvConfig(8, 128, 1, split_k=2))
        dec = TritonDecoder(sd, cfg, max_length=32, split=8, wbits=bits, group=128, gemv=gemv,
                            layout=layout, inv_freq=model.model.rotary_emb.inv_freq)
        toks = dec.generate(prompt[0].tolist(), n_new)
        worst = _teacher_forced_max_rel(dec, prompt[0].tolist(), ref_tokens, ref_logits)
        out[f"int{bits}-{layout}"] = dict(tokens=toks, ref_tokens=ref_tokens, max_rel=worst,
                                        float_copies=sum(lin.float_weight is not None
                                                         for layer in dec.layers
                                                         for lin in layer.values()
                                                         if hasattr(lin, "float_weight")))
    return out


def _gemv_case(seed: int, n: int, k: int, eps: float, zeros=()):
    """Random GEMV operands (float32 torch): weight ``[n, k]``, input ``[2k]`` (gate then up for the
    SiLU prologue; positions ``zeros`` set to 0), RMSNorm gain ``[k]``, residual ``[n]``; and
    ``inputs``: the float64 numpy reading of the vector each ``PROLOGUE`` (0, 1, 2) multiplies."""
    rng = np.random.default_rng(seed)
    w = torch.tensor(rng.standard_normal((n, k)), dtype=torch.float32)
    x = torch.tensor(rng.standard_normal(2 * k), dtype=torch.float32)
    gain = torch.tensor(rng.standard_normal(k), dtype=torch.float32)
    res0 = torch.tensor(rng.standard_normal(n), dtype=torch.float32)
    x[list(zeros)] = 0.0
    xn, xg = x.numpy().astype(np.float64), gain.numpy().astype(np.float64)
    inputs = {0: xn[:k], 1: xn[:k] / np.sqrt(np.mean(xn[:k] ** 2) + eps) * xg,
              2: xn[:k] / (1 + np.exp(-xn[:k])) * xn[k:]}
    return w, x, gain, res0, inputs


def gemv() -> dict:
    from passctl.targets.tvm import triton_decode as K
    from passctl.targets.tvm.triton_decoder import dequantize, quantize_rtn, triton_cdiv

    n, k, eps = 24, 256, 1e-6
    w, x, gain, res0, inputs = _gemv_case(0, n, k, eps)
    results = []
    for bits in (16, 8, 4):
        if bits == 16:
            wq, scale, wref = w, w, w.numpy().astype(np.float64)
        else:
            wq, scale = quantize_rtn(w, bits, 64)
            # the reference weight, dequantized with numpy from the packed bytes
            q = wq.numpy()
            if bits == 8:
                wref = q.astype(np.float64) * scale.numpy()[:, None]
            else:
                vals = np.stack([(q & 15).astype(np.int64) - 8, (q >> 4).astype(np.int64) - 8],
                                2).reshape(n, k)
                wref = (vals.reshape(n, k // 64, 64) * scale.numpy()[:, :, None]).reshape(n, k)
            assert np.allclose(wref, dequantize(wq, scale, bits, 64).numpy(), atol=1e-6)
        for prologue in (0, 1, 2):
            for split in (1, 2):
                for bk in ((32, 128) if bits != 4 else (32, 128)):
                    out = res0.clone()
                    K.gemv_kernel[(triton_cdiv(n, 8), split)](
                        wq.view(torch.uint8) if bits == 8 else wq, scale, x, gain, out, out, N=n, K=k, EPS=eps, WBITS=bits, GROUP=64,
                        PROLOGUE=prologue, HAS_RES=True, BLOCK_N=8, BLOCK_K=bk, SPLIT_K=split)
                    ref = wref @ inputs[prologue] + res0.numpy()
                    rel = float(np.abs(out.numpy() - ref).max() / np.abs(ref).max())
                    results.append(dict(bits=bits, prologue=prologue, split_k=split,
                                        block_k=bk, max_rel=rel))
    return dict(cases=results)


def _quantize_blocks(v: np.ndarray, block: int) -> np.ndarray:
    """Numpy's reading of the activation quantization of gemv_a8_kernel: per block of ``block``,
    step = max|v| / 127, codes rounded half away from zero; returns the dequantized vector."""
    b = v.reshape(-1, block)
    amax = np.abs(b).max(1, keepdims=True)
    step = np.where(amax > 0, amax / 127.0, 1.0)
    t = b / step
    return (np.where(t >= 0, np.floor(t + 0.5), np.ceil(t - 0.5)) * step).reshape(-1)


def gemv_a8() -> dict:
    from passctl.targets.tvm import triton_decode as K
    from passctl.targets.tvm.triton_decoder import A8_BLOCK, dequantize, quantize_rtn, triton_cdiv

    n, k, eps = 40, 3 * A8_BLOCK, 1e-6
    # a zero input, and an all-zero block (step 1, codes 0)
    w, x, gain, res0, inputs = _gemv_case(1, n, k, eps, zeros=[7, *range(A8_BLOCK, 2 * A8_BLOCK)])
    results = []
    for bits in (8, 4):
        wq, scale = quantize_rtn(w, bits, A8_BLOCK)
        wref = dequantize(wq, scale, bits, A8_BLOCK).numpy().astype(np.float64)
        for prologue in (0, 1, 2):
            for split in (1, 2):
                out = res0.clone()
                K.gemv_a8_kernel[(triton_cdiv(n, 16), split)](
                    wq.view(torch.uint8) if bits == 8 else wq, scale, x, gain, out, out, N=n, K=k,
                    EPS=eps, WBITS=bits, GROUP=A8_BLOCK, PROLOGUE=prologue, HAS_RES=True,
                    BLOCK_N=16, BLOCK_K=A8_BLOCK, SPLIT_K=split)
                got = out.numpy().astype(np.float64)
                ref = wref @ _quantize_blocks(inputs[prologue], A8_BLOCK) + res0.numpy()
                exact = wref @ inputs[prologue] + res0.numpy()
                results.append(dict(
                    bits=bits, prologue=prologue, split_k=split,
                    max_rel=float(np.abs(got - ref).max() / np.abs(ref).max()),
                    vs_float_input=float(np.abs(got - exact).max() / np.abs(exact).max())))
    return dict(cases=results)


def gemv_planes() -> dict:
    from passctl.targets.tvm import triton_decode as K
    from passctl.targets.tvm.triton_decoder import (PLANES_INT8_BLOCK, codes_of, dequantize,
                                                    pack_planes, quantize_rtn, triton_cdiv)

    n, k, eps, group = 40, 384, 1e-6, 64
    w, x, gain, res0, inputs = _gemv_case(2, n, k, eps, zeros=[5])
    results = []
    for bits in (8, 4):
        wq, scale = quantize_rtn(w, bits, group)
        block = PLANES_INT8_BLOCK if bits == 8 else group
        words = pack_planes(codes_of(wq, bits), bits, block)
        # numpy's reading of the packed words: code i of word j of block b is input
        # b * block + i * WG + j; value = code - 2^(bits - 1)
        per, wg = 32 // bits, block // (32 // bits)
        u = words.numpy().view(np.uint32).reshape(n, k // block, 1, wg)
        codes = (u >> (bits * np.arange(per, dtype=np.uint32)[None, None, :, None])) \
            & ((1 << bits) - 1)
        vals = codes.reshape(n, k).astype(np.int64) - (1 << (bits - 1))
        sc = scale.numpy().astype(np.float64)
        wref = vals * sc[:, None] if bits == 8 else \
            (vals.reshape(n, k // group, group) * sc[:, :, None]).reshape(n, k)
        # the words hold the weight quantize_rtn's bytes stand for, every input in its place
        unpack_err = float(np.abs(wref - dequantize(wq, scale, bits, group).numpy()).max())
        for prologue in (0, 1, 2):
            for split in (1, 2):
                for bk in (block, 2 * block):
                    out = res0.clone()
                    K.gemv_planes_kernel[(triton_cdiv(n, 16), split)](
                        words, scale, x, gain, out, out, K.PLANES_MAGIC, N=n, K=k, EPS=eps,
                        WBITS=bits, WG=wg,
                        PROLOGUE=prologue, HAS_RES=True, BLOCK_N=16, BLOCK_K=bk, SPLIT_K=split)
                    ref = wref @ inputs[prologue] + res0.numpy()
                    results.append(dict(bits=bits, prologue=prologue, split_k=split, block_k=bk,
                                        unpack_err=unpack_err, max_rel=float(np.abs(out.numpy() - ref).max()
                                                      / np.abs(ref).max())))
        # the prefill GEMM over the same words: 5 rows of float32 activations, plus a residual
        a = torch.tensor(np.random.default_rng(3).standard_normal((5, k)), dtype=torch.float32)
        res = torch.tensor(np.random.default_rng(4).standard_normal((5, n)), dtype=torch.float32)
        for has_res in (False, True):
            c = torch.full((5, n), float("nan"))
            K.gemm_planes_kernel[(triton_cdiv(5, 16) * triton_cdiv(n, 16),)](
                a, words, scale, res, c, M=5, N=n, K=k, WBITS=bits, WG=wg, HAS_RES=has_res,
                BLOCK_M=16, BLOCK_N=16, GROUP_M=2)
            ref = a.numpy().astype(np.float64) @ wref.T + (res.numpy() if has_res else 0.0)
            results.append(dict(bits=bits, gemm=True, has_res=has_res,
                                max_rel=float(np.abs(c.numpy() - ref).max() / np.abs(ref).max())))
    return dict(cases=results)


def gemv_half2() -> dict:
    """gemv_half2_kernel (EMULATE: its f16x2 arithmetic in Triton operations) against numpy's
    float64 product with quantize_rtn's dequantized weight: masked tiles (40 rows, tiles of 16;
    K tiles past K) and unmasked ones (32 rows, K = split * tiles), each prologue, split-K; one
    input of 1000 (prologue 0) to show a word's fp16 sums stay in range."""
    from passctl.targets.tvm import triton_decode as K
    from passctl.targets.tvm.triton_decoder import dequantize, quantize_rtn, triton_cdiv

    k, eps, group = 384, 1e-6, 64
    results = []
    for n in (40, 32):
        w, x, gain, res0, inputs = _gemv_case(5, n, k, eps, zeros=[5])
        x_big = x.clone()
        x_big[9] = 1000.0
        inputs["big"] = inputs[0].copy()
        inputs["big"][9] = 1000.0
        for bits in (8, 4):
            wq, scale = quantize_rtn(w, bits, group)
            wref = dequantize(wq, scale, bits, group).numpy().astype(np.float64)
            words = wq.view(torch.uint8).view(torch.int64)
            for prologue in (0, 1, 2, "big"):
                for split in (1, 2):
                    for bk in (64, 128, 256):
                        out = res0.clone()
                        K.gemv_half2_kernel[(triton_cdiv(n, 16), split)](
                            words, scale, x_big if prologue == "big" else x, gain, out, out,
                            N=n, K=k, EPS=eps, WBITS=bits, GROUP=group,
                            PROLOGUE=0 if prologue == "big" else prologue, HAS_RES=True, BLOCK_N=16,
                            BLOCK_K=bk, SPLIT_K=split, EMULATE=True)
                        ref = wref @ inputs[prologue] + res0.numpy()
                        ks = -(-(-(-k // split)) // bk) * bk
                        results.append(dict(
                            bits=bits, n=n, prologue=prologue, split_k=split, block_k=bk,
                            even=n % 16 == 0 and ks * split == k,
                            max_rel=float(np.abs(out.numpy() - ref).max() / np.abs(ref).max())))
    return dict(cases=results)


if __name__ == "__main__":
    print(json.dumps({"generate": generate, "gemv": gemv, "gemv_a8": gemv_a8,
                      "gemv_planes": gemv_planes, "gemv_half2": gemv_half2,
                      "generate_planes": generate_planes}[sys.argv[1]]()))
