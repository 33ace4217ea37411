"""Run under ``TRITON_INTERPRET=1`` (Triton's CPU interpreter) by test_cuda_artifact.py: the CUDA
decoder artifact (``passctl export-decoder SRC -o OUT --target h200``) exported through the
command line and run by ``passctl.Generator(OUT)`` with its tensors on the CPU, against
transformers' fp32 model and against the ONNX Runtime artifact of the same model.

    python cuda_artifact_check.py greedy OUT_ROOT   # fp32 weights (and fp16, looser)
    python cuda_artifact_check.py int8 OUT_ROOT     # int8 weights in code planes
    python cuda_artifact_check.py gumbel OUT_ROOT   # the device sampler's distribution

Prints one JSON object on stdout.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decoder_helpers import tiny_model  # noqa: E402

PROMPT = [5, 17, 3, 42, 8, 64, 1]
NEW = 8


def _export(model, root: str, name: str, *extra: str) -> str:
    from passctl.tools.cli import main

    src, out = os.path.join(root, f"{name}-src"), os.path.join(root, name)
    model.save_pretrained(src)
    rc = main(["export-decoder", src, "-o", out, "-q", *extra])
    assert rc == 0, rc
    return out


def _reference(model):
    """transformers' greedy tokens after PROMPT and the logits of every position of prompt +
    tokens (teacher forcing)."""
    prompt = torch.tensor([PROMPT])
    with torch.no_grad():
        ref = model.generate(prompt, max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
        logits = model(ref).logits[0].double().numpy()
    return ref[0, len(PROMPT):].tolist(), logits


def _teacher_forced(gen, tokens) -> list:
    """The artifact's last-position logits after the prompt, then after each of ``tokens`` but
    the last (one decode step each)."""
    gen.reset(1)
    got = [gen.step(np.array([PROMPT]))[0]]
    for t in tokens[:-1]:
        got.append(gen.step(np.array([[t]]))[0])
    return got


def _rel(got, ref_logits) -> float:
    """Worst relative error (max |a - b| / max |b| per position) of logits rows ``got`` against
    transformers' at the same positions."""
    worst = 0.0
    for j, row in enumerate(got):
        r = ref_logits[len(PROMPT) - 1 + j]
        worst = max(worst, float(np.abs(row - r).max() / np.abs(r).max()))
    return worst


def greedy(root: str) -> dict:
    import passctl

    model = tiny_model("llama", seed=0, rope_theta=500.0)
    ref_tokens, ref_logits = _reference(model)
    out = _export(model, root, "cuda", "--target", "h200", "--max-length", "32", "--dtype", "fp32")
    gen = passctl.Generator(out)
    deferred = gen.generate(PROMPT, max_new_tokens=NEW, stop_at_eos=False)  # tokens read at the end
    streamed = []
    per_step = gen.generate(PROMPT, max_new_tokens=NEW, stop_at_eos=False,
                            on_token=streamed.append, return_logits=True)
    forced = _teacher_forced(gen, ref_tokens)
    # sampling (host sampler on the step's logits) against the ONNX Runtime artifact of the same
    # model with the same seed
    cpu = _export(model, root, "cpu", "--max-length", "32")
    kw = dict(max_new_tokens=NEW, stop_at_eos=False, temperature=1.5, top_p=0.95, seed=7)
    sampled = gen.generate(PROMPT, **kw).tokens[0].tolist()
    ort_sampled = passctl.Generator(cpu).generate(PROMPT, **kw).tokens[0].tolist()
    # temperature without top-p: sampled on the device (Gumbel-max), read at the end or per step
    dev = dict(max_new_tokens=NEW, stop_at_eos=False, temperature=1.5, seed=11)
    on_device = gen.generate(PROMPT, **dev).tokens[0].tolist()
    on_device_streamed = gen.generate(PROMPT, on_token=lambda t: None, **dev).tokens[0].tolist()
    other_seed = gen.generate(PROMPT, **{**dev, "seed": 12}).tokens[0].tolist()
    # the default dtype, fp16 (the interpreter computes in numpy's float16 where the GPU would)
    half = passctl.Generator(_export(model, root, "cuda16", "--target", "h200", "--max-length",
                                     "32"))
    half_run = half.generate(PROMPT, max_new_tokens=NEW, stop_at_eos=False, return_logits=True)
    return dict(
        fp16_tokens=half_run.tokens[0].tolist(), fp16_rel=_rel(list(half_run.logits[0]),
                                                               ref_logits),
        generator=type(gen).__name__, ref_tokens=ref_tokens,
        deferred=deferred.tokens[0].tolist(), per_step=per_step.tokens[0].tolist(),
        streamed=streamed, forced_rel=_rel(forced, ref_logits),
        returned_rel=_rel(list(per_step.logits[0]), ref_logits),
        sampled=sampled, ort_sampled=ort_sampled, on_device=on_device,
        on_device_streamed=on_device_streamed, other_seed=other_seed,
        weight_bytes=gen.weight_bytes, fraction=per_step.bandwidth_fraction,
        tokens_per_s=per_step.tokens_per_s)


def int8(root: str) -> dict:
    import passctl
    from passctl.targets.tvm.triton_decoder import dequantize, quantize_rtn

    # untied (mqa: one KV head): the LM head is quantized, the embedding stays float
    model = tiny_model("mqa", seed=1, hidden_size=128, intermediate_size=256)
    out = _export(model, root, "int8", "--target", "h100", "--max-length", "32", "--dtype",
                  "fp32", "--weights", "int8", "--weight-layout", "planes")
    with torch.no_grad():  # the reference holds the weights the artifact's decoder stands for
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed_tokens" not in name:
                q, sc = quantize_rtn(p.detach(), 8)
                p.copy_(dequantize(q, sc, 8))
    ref_tokens, ref_logits = _reference(model)
    gen = passctl.Generator(out)
    got = gen.generate(PROMPT, max_new_tokens=NEW, stop_at_eos=False)
    return dict(ref_tokens=ref_tokens, tokens=got.tokens[0].tolist(),
                forced_rel=_rel(_teacher_forced(gen, ref_tokens), ref_logits),
                layouts=sorted({layer[k].layout for layer in gen.decoder.layers
                                for k in ("qkv", "o", "gate_up", "down")}
                               | {gen.decoder.lm_head.layout}),
                weight_bytes=gen.weight_bytes)


def gumbel(_root: str) -> dict:
    """gumbel_sample_kernel's draws from fixed logits (7 values, blocks of 4: two loop trips)
    at 2000 counters: their frequencies against softmax(logits / T) computed with numpy."""
    from passctl.targets.tvm import triton_decode as K

    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 3.0, 1.5])
    temperature, n = 1.7, 2000
    seed = torch.tensor([1234], dtype=torch.int32)
    inv_t = torch.tensor([1.0 / temperature])
    tok = torch.zeros(1, dtype=torch.int32)
    out = torch.zeros(n + 1, dtype=torch.int32)
    step = torch.zeros(1, dtype=torch.int32)
    for i in range(n):
        step.fill_(i + 1)  # the kernel draws at counter step - 1 (argmax_kernel advanced it)
        K.gumbel_sample_kernel[(1,)](logits, seed, inv_t, tok, out, step, V=7, BLOCK=4)
    z = logits.double().numpy() / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    freq = np.bincount(out[:n].numpy(), minlength=8) / n
    again = out.clone()
    K.gumbel_sample_kernel[(1,)](logits, seed, inv_t, tok, again, step, V=7, BLOCK=4)
    return dict(p=p.tolist(), freq=freq.tolist(), n=n, last_token=int(tok[0]),
                repeat_same=int(again[n - 1]) == int(out[n - 1]))


if __name__ == "__main__":
    print(json.dumps({"greedy": greedy, "int8": int8, "gumbel": gumbel}[sys.argv[1]](sys.argv[2])))
