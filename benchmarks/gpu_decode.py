"""LLM decode on the H200: passctl's Triton decode step as one CUDA graph against transformers
(issues 17 and 18), every variant in one run.

    python benchmarks/gpu_decode.py check      # numerics: teacher-forced logits vs torch fp32
    python benchmarks/gpu_decode.py sweep      # GEMV tile sweep on the LLaMA-7B shapes -> json
    python benchmarks/gpu_decode.py bench [--configs FILE] [--tokens 256] [--prompt 16]

``check``: random-weight Llama configs (GQA 2048-wide 4 layers; SmolLM2-135M's shape, 9 query /
3 KV heads of 64), fp16 on the GPU; the fp32 torch model (same weights) generates greedily and
its tokens are teacher-forced through passctl's prefill + decode steps; per-step cosine of the
logits (bound 0.999 for fp16) and max-rel; int8 / int4 weight-only reported beside.
``bench``: LLaMA-7B shape (hidden 4096, 32 layers, 32 heads, FFN 11008, vocab 32000), random fp16
weights (std 0.02), batch 1, a ``--prompt``-token prompt, ``--tokens`` new tokens greedy:
the weight-streaming floor (weight bytes / measured device copy bandwidth per token),
transformers ``generate`` (sdpa, dynamic cache), transformers with the static cache (it compiles
the forward with torch.compile), passctl fp16 / int8 / int4; and time to first token for a
512-token prompt. Times are wall-clock around the whole generate call (median of ``--repeat``),
after a warm-up call.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from passctl_path import ensure_passctl_importable  # noqa: E402

ensure_passctl_importable()

from passctl.targets.tvm import triton_decode as K  # noqa: E402
from passctl.targets.tvm.triton_decoder import GemvConfig, TritonDecoder  # noqa: E402

LLAMA_7B = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                max_position_embeddings=4096, rms_norm_eps=1e-6)


def _model(cfg_kwargs, dtype=torch.float16, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(**cfg_kwargs)
    cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    return cfg, model


def check(args) -> int:
    configs = {
        "gqa-2048x4": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=4,
                           num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                           max_position_embeddings=1024, rms_norm_eps=1e-5),
        "smollm2-135m-shape": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                                   max_position_embeddings=2048, rms_norm_eps=1e-5,
                                   tie_word_embeddings=True, rope_theta=100000.0),
    }
    worst = 1.0
    rows = []
    for name, kw in configs.items():
        cfg, model = _model(kw, torch.float32)
        gen = torch.Generator(device="cuda").manual_seed(1)
        prompt = torch.randint(0, cfg.vocab_size, (1, 16), device="cuda", generator=gen)
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=32, do_sample=False)
            ref_logits = model(out).logits[0].float()
        ids = prompt[0].tolist()
        forced = out[0, 16:].tolist()
        sd16 = {k: v.detach().half() for k, v in model.state_dict().items()}
        variants = [(16, v) for v in ("unfused", "fused", "fused-pdl") if v in args.variants] \
            + [(8, "fused"), (4, "fused")] \
            + ([(8, "fused-planes"), (4, "fused-planes"), (8, "fused-pdl-planes"),
                (4, "fused-pdl-planes")] if cfg.hidden_size % 128 == 0 else []) \
            + [(8, "fused-pdl-half2"), (4, "fused-pdl-half2")] \
            + ([(8, "fused-a8"), (4, "fused-a8")] if cfg.hidden_size % 128 == 0 and
               "fused-a8" in args.variants else [])  # int4 a8: groups of 128
        for wbits, variant in variants:
            if variant.endswith("pdl") and not K.HAS_PDL:
                continue
            try:
                # split 16: the 48 tokens span three chunks, so the merge combines real ones
                a8, layout = variant.endswith("-a8"), _layout(variant)
                dec = TritonDecoder(sd16, cfg, max_length=128, wbits=wbits, split=16,
                                    group=128 if cfg.hidden_size % 128 == 0 else 64,
                                    gemv=_configs(args.configs, wbits, a8, layout)
                                    if variant != "unfused" else None,
                                    inv_freq=model.model.rotary_emb.inv_freq,
                                    fuse_attention=variant != "unfused",
                                    pdl="pdl" in variant, act_int8=a8, layout=layout)
                dec.prefill(ids)
                cos, rel = [], []
                for j in range(len(forced)):
                    r = ref_logits[15 + j]
                    got = dec.logits
                    cos.append(torch.nn.functional.cosine_similarity(got, r, dim=0).item())
                    rel.append(((got - r).abs().max() / r.abs().max()).item())
                    if j + 1 < len(forced):
                        dec.tok.fill_(forced[j])
                        dec.decode_step()
                dec.capture()
                toks = dec.generate(ids, 32)
            except Exception as exc:  # noqa: BLE001  (report the variant, go on)
                print(f"{name} w{wbits} {variant}: FAILED {type(exc).__name__}: {str(exc)[:400]}",
                      flush=True)
                worst = 0.0 if wbits == 16 and variant != "fused-pdl" else worst
                continue
            same = sum(a == b for a, b in zip(toks, forced))
            rows.append((name, wbits, variant, min(cos), max(rel), same))
            if wbits == 16:
                worst = min(worst, min(cos))
            del dec
        del model
        torch.cuda.empty_cache()
    print("| config | weights | variant | min cosine over 32 steps | max rel | greedy tokens equal fp32 torch (graph replay) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, wbits, variant, c, r, same in rows:
        print(f"| {name} | {'fp16' if wbits == 16 else f'int{wbits} RTN'} | {variant} | {c:.6f} | {r:.2e} | {same}/32 |")
    print(f"fp16 worst cosine {worst:.6f} (bound 0.999): {'OK' if worst >= 0.999 else 'MISS'}")
    return 0 if worst >= 0.999 else 1


SHAPES = {"qkv": (12288, 4096, 1), "o": (4096, 4096, 0), "gate_up": (22016, 4096, 1),
          "down": (4096, 11008, 2), "lm_head": (32000, 4096, 1)}


def _weights(n, k, wbits, copies=4):
    """``copies`` independent weights (together larger than the L2 cache, so every launch
    streams from HBM)."""
    from passctl.targets.tvm.triton_decoder import quantize_rtn

    ws = []
    for _ in range(copies):
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
        ws.append((w, w) if wbits == 16 else quantize_rtn(w, wbits, 128))
    return ws


def _layout(variant: str) -> str:
    """The decoder's weight layout a bench / check variant names (``...-planes``, ``...-half2``)."""
    return next((lay for lay in ("planes", "half2") if variant.endswith("-" + lay)), "rows")


def _time_gemv(ws, n, k, prologue, wbits, cfg: GemvConfig, iters=50, a8=False, layout="rows",
               ref=None):
    """Mean time of one GEMV launch (CUDA events around a CUDA graph of ``iters`` launches,
    each on the next of the weight copies) and the weight bytes per second it streams. With
    ``cfg.split_k`` > 1 the output is the float32 residual, added into in place (the O / down
    projections' use). ``a8``: the integer-dot kernel (``gemv_a8_kernel``, input quantized to
    int8 per block of 128). ``layout`` planes: ``ws`` holds code-plane words (:func:`_planes`)
    and the code-plane kernel runs; half2: the rows' bytes read by ``gemv_half2_kernel``.
    ``ref``: ``(w_float, out_index)``: the first launch's output is checked against torch's
    float32 product with that dequantized weight first; returns its max relative error third.""" 
    from passctl.targets.tvm import triton_decode as K
    from passctl.targets.tvm.triton_decoder import A8_BLOCK, triton_cdiv

    kernel = K.gemv_a8_kernel if a8 else K.gemv_kernel

    copies = len(ws)
    x = torch.randn(2 * k if prologue == 2 else k, device="cuda", dtype=torch.float32)
    g = torch.ones(k, device="cuda")
    split = cfg.split_k
    out = torch.zeros(n, device="cuda", dtype=torch.float32 if split > 1 else torch.float16)

    def launch(i):
        w, s = ws[i % copies]
        if layout == "half2":
            K.gemv_half2_kernel[(triton_cdiv(n, cfg.block_n), split)](
                w.view(torch.uint8).view(torch.int64), s, x, g, out, out, N=n, K=k, EPS=1e-6,
                WBITS=wbits, GROUP=128, PROLOGUE=prologue, HAS_RES=split > 1,
                BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split, **cfg.launch_options())
            return
        if layout == "planes":
            K.gemv_planes_kernel[(triton_cdiv(n, cfg.block_n), split)](
                w, s, x, g, out, out, K.PLANES_MAGIC, N=n, K=k, EPS=1e-6, WBITS=wbits,
                WG=128 // (32 // wbits),
                PROLOGUE=prologue, HAS_RES=split > 1, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                SPLIT_K=split, **cfg.launch_options())
            return
        kernel[(triton_cdiv(n, cfg.block_n), split)](
            w.view(torch.uint8) if wbits == 8 else w, s, x, g, out, out, N=n, K=k, EPS=1e-6,
            WBITS=wbits, GROUP=128, PROLOGUE=prologue, HAS_RES=split > 1, BLOCK_N=cfg.block_n,
            BLOCK_K=A8_BLOCK if a8 else cfg.block_k, SPLIT_K=split, **cfg.launch_options())

    err = None
    if ref is not None:  # numerics first: launch 0 against torch on the dequantized weight
        out.zero_()
        launch(0)
        torch.cuda.synchronize()
        xv = x.float()
        if prologue == 1:
            xv = xv * torch.rsqrt(xv.pow(2).mean() + 1e-6) * g
        elif prologue == 2:
            xv = torch.nn.functional.silu(xv[:k]) * xv[k:]
        want = ref.float() @ xv
        err = ((out.float() - want).abs().max() / want.abs().max()).item()
    for i in range(3):
        launch(i)
    torch.cuda.synchronize()
    # The launches replayed as one CUDA graph, as the decode step runs them: timed back to back
    # from Python, a launch costs ~20 us of host time, more than a small GEMV takes.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(iters):
            launch(i)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / iters
    nbytes = ws[0][0].numel() * ws[0][0].element_size() + (0 if wbits == 16 else ws[0][1].numel() * 4)
    return ms, nbytes / ms / 1e9, err


def _planes(ws, wbits):
    """``ws`` of :func:`_weights` as code-plane words (plane blocks of 128 inputs)."""
    from passctl.targets.tvm.triton_decoder import codes_of, pack_planes

    return [(pack_planes(codes_of(q, wbits), wbits, 128), s) for q, s in ws]


#: the sweep's grid per (bits, projection): split-K only where the output is the residual
def _grid(wbits, name, a8=False, layout="rows"):
    splits = (1, 2, 4) if name in ("o", "down") else (1,)
    if layout == "half2":  # K tiles of 1-4 thousand inputs: every thread along K (see the kernel)
        return [GemvConfig(bn, bk, nw, sk) for bn in (8, 16)
                for bk, nw in ((2048, 2), (2048, 4), (4096, 4))
                for sk in splits[:2]]
    if layout == "planes":  # K tiles of whole plane blocks (128 inputs); 16 KB tiles are the fp16 kernel's
        bks = (512, 1024) if wbits == 8 else (1024, 2048)
        bns = (8, 16, 32) if name in ("o", "down") else (16, 32, 64)
        return [GemvConfig(bn, bk, nw, sk) for bn in bns for bk in bks for nw in (4, 8)
                for sk in splits]
    if a8:  # K tile fixed at the quantization block; deeper pipelines instead
        return [GemvConfig(bn, 128, nw, sk, st) for bn in (16, 32, 64, 128) for nw in (4, 8)
                for st in (2, 3, 4) for sk in splits]
    bks = {16: (256, 512, 1024), 8: (256, 512, 1024), 4: (256, 512)}[wbits]
    splits = (1, 2, 4) if name in ("o", "down") else (1,)
    bns = (4, 8, 16) if name in ("o", "down") else (8, 16, 32)
    return [GemvConfig(bn, bk, nw, sk) for bn in bns for bk in bks for nw in (4, 8)
            for sk in splits if not (sk > 1 and bk > 512)]


def sweep(args) -> int:
    best = {}
    t0 = time.time()
    names = args.shapes or list(SHAPES)
    kinds = [(b, a8) for b in args.wbits for a8 in ((False, True) if args.a8 == "both" else
                                                    (args.a8 == "only",)) if not (a8 and b == 16)]
    layout = args.layout
    if layout != "rows":
        kinds = [(b, False) for b in args.wbits if b != 16]
    tag = {"rows": "", "planes": "p", "half2": "h"}[layout]
    for wbits, a8 in kinds:
        for name in names:
            n, k, pro = SHAPES[name]
            results = []
            ws = _weights(n, k, wbits)
            ref = None
            if layout == "half2":  # its fp16 arithmetic checked against torch on every config
                from passctl.targets.tvm.triton_decoder import dequantize
                ref = dequantize(ws[0][0], ws[0][1], wbits, 128)
            if layout == "planes":
                ws = _planes(ws, wbits)
            worst = 0.0
            for cfg in _grid(wbits, name, a8, layout):
                try:
                    ms, tbs, err = _time_gemv(ws, n, k, pro, wbits, cfg, a8=a8, layout=layout,
                                              ref=ref)
                except Exception as exc:  # noqa: BLE001  (a config out of registers / shared memory)
                    print(f"  {name} w{wbits} {cfg}: {type(exc).__name__}: {str(exc)[:200]}")
                    continue
                if err is not None:
                    worst = max(worst, err)
                    if not err < 5e-3:
                        print(f"  {name} w{wbits} {cfg}: WRONG, max rel {err:.2e} against torch")
                        continue
                results.append((ms, tbs, cfg))
            if ref is not None:
                print(f"  {name} w{wbits} half2: worst max rel against torch {worst:.2e} "
                      f"over {len(results)} configs", flush=True)
            del ws
            results.sort(key=lambda r: r[0])
            ms, tbs, cfg = results[0]
            best[f"{wbits}{'a8' if a8 else tag}:{name}"] = dict(
                block_n=cfg.block_n, block_k=cfg.block_k, num_warps=cfg.num_warps,
                split_k=cfg.split_k, num_stages=cfg.num_stages, us=round(ms * 1000, 2),
                TBps=round(tbs, 3))
            print(f"w{wbits}{'a8' if a8 else tag:<2} {name:8s} [{n}x{k}] best {cfg} {ms * 1000:.1f} us {tbs:.2f} TB/s "
                  f"({len(results)} configs, {time.time() - t0:.0f} s)", flush=True)
            _write_configs(args, best)  # after every shape: a run cut short keeps what it found
    print(f"sweep took {time.time() - t0:.0f} s")
    print("wrote", _write_configs(args, best))
    return 0


def _write_configs(args, best) -> str:
    """Merge ``best`` into the sweep's json (``--out``; entries of shapes / bits not swept this
    time are kept); returns its path."""
    out = args.out or os.path.join(os.environ.get("OUT", "."), "gemv_configs.json")
    if os.path.exists(out):
        with open(out) as f:
            best = {**json.load(f), **best}
    with open(out, "w") as f:
        json.dump(best, f, indent=1)
    return out


def _configs(path, wbits, a8=False, layout="rows"):
    """Tiles per projection for ``wbits`` (keys ``"8:qkv"``; ``"8a8:qkv"`` for the
    integer-dot kernel, ``"8p:qkv"`` for the code-plane one, ``"8h:qkv"`` for the f16x2 one)
    from a sweep's json; with ``a8``,
    per projection the faster of the two kernels as the sweep timed them."""
    if not path:
        return None
    with open(path) as f:
        data = json.load(f)
    def read(want):
        return {name: (v["us"], GemvConfig(v["block_n"], v["block_k"], v["num_warps"],
                                           v.get("split_k", 1), v.get("num_stages"),
                                           a8=want.endswith("a8")))
                for key, v in data.items() for b, name in [key.split(":")] if b == want}

    if layout != "rows":
        return {name: cfg for name, (_, cfg) in
                read(f"{wbits}{layout[0]}").items()} or None
    plain = read(str(wbits))
    if not a8:
        return {name: cfg for name, (_, cfg) in plain.items()}
    # the integer-dot kernel where the sweep timed it faster, the float one elsewhere
    dot = read(f"{wbits}a8")
    return {name: min([c for c in (plain.get(name), dot.get(name)) if c],
                      key=lambda c: c[0])[1] for name in {*plain, *dot}}


def _copy_bandwidth() -> float:
    a = torch.empty(2 ** 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        b.copy_(a)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / 20
    del a, b
    return 2 * 2 ** 30 / dt  # bytes read + written per second


def _timed(fn, repeat):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench(args) -> int:
    cfg, model = _model(LLAMA_7B)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    gen = torch.Generator(device="cuda").manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt), device="cuda", generator=gen)
    long_prompt = torch.randint(0, cfg.vocab_size, (1, 512), device="cuda", generator=gen)
    n = args.tokens
    bw = _copy_bandwidth()
    weight_bytes = sum(p.numel() * p.element_size() for name, p in model.named_parameters()
                       if "embed_tokens" not in name) + cfg.hidden_size * 2
    rows = []
    floor = weight_bytes / bw * n
    rows.append(("weight-streaming floor (weight bytes / copy bandwidth per token)", floor, None))
    print(f"weights read per token {weight_bytes / 1e9:.2f} GB, copy bandwidth {bw / 1e12:.2f} TB/s, "
          f"floor {floor:.3f} s", flush=True)

    results = {}
    if not args.skip_transformers:
        def hf_dynamic():
            with torch.no_grad():
                return model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        t = _timed(hf_dynamic, 1)
        ref_tokens = hf_dynamic()[0, args.prompt:].tolist()
        rows.append(("transformers generate, sdpa, dynamic cache", t, None))
        print(f"transformers dynamic {t:.3f} s", flush=True)
        model.generation_config.cache_implementation = "static"
        t0 = time.perf_counter()

        def hf_static():
            with torch.no_grad():
                return model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        hf_static()
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        t = _timed(hf_static, 2)
        rows.append((f"transformers generate, static cache (torch.compile; first call {compile_s:.0f} s)",
                     t, None))
        print(f"transformers static {t:.3f} s (first {compile_s:.1f} s)", flush=True)

        def hf_ttft():
            with torch.no_grad():
                return model.generate(long_prompt, max_new_tokens=1, do_sample=False)
        hf_ttft()
        results["hf_ttft"] = _timed(hf_ttft, 3)
        model.generation_config.cache_implementation = None
    else:
        ref_tokens = None

    sd = {k: v.detach() for k, v in model.state_dict().items()}
    ids = prompt[0].tolist()
    max_length = args.max_length or -(-(args.prompt + n) // 64) * 64
    for wbits in args.wbits:
        for variant in args.variants:
            fused, pdl, a8 = variant != "unfused", "pdl" in variant, variant.endswith("-a8")
            layout = _layout(variant)
            if layout != "rows" and wbits == 16:
                continue
            if pdl and not K.HAS_PDL:
                print(f"passctl w{wbits} {variant}: skipped, this Triton has no PDL")
                continue
            if a8 and wbits == 16:
                continue
            gemv = _configs(args.configs, wbits, a8, layout) or {}
            if a8 and gemv and not any(c.a8 for c in gemv.values()):
                print(f"passctl w{wbits} {variant}: skipped, the sweep found the float GEMV "
                      "faster for every projection")
                continue
            if not fused:  # the previous step: 7 kernels per layer, no split-K
                gemv = {k: GemvConfig(c.block_n, c.block_k, c.num_warps) for k, c in gemv.items()}
            label = ("fp16" if wbits == 16 else f"int{wbits} weight-only (RTN)") + f", {variant}"
            if a8:
                label += " (int8 activations per block of 128)"
            if layout != "rows":
                label += {"planes": " (code-plane GEMV)", "half2": " (f16x2 GEMV)"}[layout]
            try:
                t0 = time.perf_counter()
                dec = TritonDecoder(sd, cfg, max_length=max_length, wbits=wbits, gemv=gemv,
                                    inv_freq=model.model.rotary_emb.inv_freq,
                                    fuse_attention=fused, pdl=pdl, act_int8=a8, layout=layout)
                dec.prefill(ids)
                dec.capture()
                torch.cuda.synchronize()
                setup = time.perf_counter() - t0
                t = _timed(lambda: dec.generate(ids, n), args.repeat)
                toks = dec.generate(ids, n)
                # decode alone: graph replays
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                dec.prefill(ids)
                start.record()
                for _ in range(n - 1):
                    dec.graph.replay()
                end.record()
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001  (report the variant, go on with the rest)
                print(f"passctl {label}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                dec = None
                torch.cuda.empty_cache()
                continue
            ms_tok = start.elapsed_time(end) / (n - 1)
            frac = dec.weight_bytes / (ms_tok / 1e3) / bw
            agree = None if ref_tokens is None else sum(a == b for a, b in zip(toks, ref_tokens))
            rows.append((f"passctl {label}", t,
                         dict(ms_tok=ms_tok, frac=frac, agree=agree, setup=setup,
                              gb=dec.weight_bytes / 1e9)))
            print(f"passctl {label}: {t:.3f} s, {ms_tok:.2f} ms/token, {frac * 100:.0f}% of copy "
                  f"bandwidth, tokens equal transformers {agree}/{n}, setup {setup:.1f} s", flush=True)
            del dec
            torch.cuda.empty_cache()
    # time to first token, 512-token prompt (prefill + the first token; no graph involved)
    dec = TritonDecoder(sd, cfg, max_length=576, wbits=16, gemv=_configs(args.configs, 16),
                        inv_freq=model.model.rotary_emb.inv_freq)
    results["ttft"] = _timed(lambda: dec.prefill(long_prompt[0].tolist()), 3)
    del dec
    torch.cuda.empty_cache()

    base = next((r[1] for r in rows if r[0].startswith("transformers generate, sdpa")), None)
    print()
    print(f"LLaMA-7B shape, batch 1, prompt {args.prompt}, {n} new tokens, greedy; "
          f"{torch.cuda.get_device_name()}")
    print("| variant | s for %d tokens | ms / token | x transformers eager | notes |" % n)
    print("| --- | --- | --- | --- | --- |")
    for name, t, extra in rows:
        ratio = f"{base / t:.2f}x" if base else "-"
        note = ""
        if extra:
            note = (f"decode {extra['ms_tok']:.2f} ms/token = {extra['frac'] * 100:.0f}% of copy "
                    f"bandwidth over {extra['gb']:.2f} GB; greedy tokens equal transformers "
                    f"{extra['agree']}/{n}")
        print(f"| {name} | {t:.3f} | {t / n * 1e3:.2f} | {ratio} | {note} |")
    print(f"time to first token, 512-token prompt: passctl fp16 {results['ttft'] * 1e3:.1f} ms"
          + (f", transformers static cache (compiled) {results['hf_ttft'] * 1e3:.1f} ms"
             if "hf_ttft" in results else ""))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("check", "sweep", "bench", "all"))
    p.add_argument("--configs", default=None, help="GEMV tile json from `sweep`")
    p.add_argument("--out", default=None)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--max-length", type=int, default=0,
                   help="KV cache length (default: prompt + tokens rounded up to 64, as "
                        "transformers' static cache sizes it)")
    p.add_argument("--variants", nargs="+", default=["unfused", "fused", "fused-pdl"],
                   choices=("unfused", "fused", "fused-pdl", "fused-a8", "fused-pdl-a8",
                            "fused-planes", "fused-pdl-planes", "fused-half2", "fused-pdl-half2"),
                   help="unfused: 7 kernels per layer (rotary and merge apart), no split-K; "
                        "fused: 5 per layer + split-K O / down; fused-pdl: and programmatic "
                        "dependent launch; -a8: int8 / int4 GEMVs with int8 activations "
                        "(integer dot products; skipped for fp16); -planes: int8 / int4 GEMVs "
                        "over code-plane words (gemv_planes_kernel; skipped for fp16); -half2: "
                        "int8 / int4 GEMVs in f16x2 arithmetic (gemv_half2_kernel)")
    p.add_argument("--layout", choices=("rows", "planes", "half2"), default="rows",
                   help="sweep: the byte-row GEMVs (rows), the code-plane one (planes) or the "
                        "f16x2 one over the byte rows (half2; each config's output checked "
                        "against torch first)")
    p.add_argument("--a8", choices=("no", "only", "both"), default="no",
                   help="sweep: the float-dequantizing GEMV (no), the integer-dot one (only), "
                        "or both")
    p.add_argument("--shapes", nargs="+", default=None, choices=tuple(SHAPES),
                   help="projections the sweep tunes (default all)")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--wbits", type=int, nargs="+", default=[16, 8, 4])
    p.add_argument("--skip-transformers", action="store_true")
    args = p.parse_args(argv)
    if args.mode == "all":  # check, then sweep, then bench with the swept tiles
        rc = check(args)
        sweep(args)
        args.configs = args.out or os.path.join(os.environ.get("OUT", "."), "gemv_configs.json")
        return bench(args) or rc
    return {"check": check, "sweep": sweep, "bench": bench}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
