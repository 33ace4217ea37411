"""Decode worker for ``generate_cpu.py``: runs onnxruntime-genai or llama.cpp in its own venv.

``generate_cpu.py --genai-python PY`` / ``--llama-cpp-python PY`` starts this file with that
interpreter (a venv that has ``onnxruntime_genai`` / ``llama_cpp``, so neither runtime, nor the
onnxruntime that onnxruntime-genai pins, lands in passctl's venv). It imports neither passctl nor
torch: only the standard library and the runtime.

Protocol (JSON lines): started as ``python generate_cpu_worker.py genai|llama MODEL`` with one
JSON object on stdin's first line: ``{"ids": [int, ...], "new": N, "threads": T}``. It loads the
model, runs one warm-up generation of 4 tokens and prints ``{"ready": true, "versions": {...}}``.
Then every stdin line ``run`` runs one timed greedy generation of ``N`` new tokens from ``ids``
and prints ``{"tokens": [...], "ttft_s": s, "tokens_per_s": t}`` (decode tokens/s counts the
tokens after the first, the intervals between consecutive tokens, as passctl's Generator does);
``quit`` or end of input ends it.

- ``genai``: MODEL is the folder of ``python -m onnxruntime_genai.models.builder``; the decoder
  session gets ``intra_op_num_threads=T`` (config overlay); greedy (``do_sample=False``),
  ``max_length = len(ids) + N``; the loop is ``append_tokens(ids)`` then
  ``generate_next_token()`` until ``is_done()``.
- ``llama``: MODEL is a GGUF file; ``llama_cpp.Llama(n_ctx=len(ids)+N+8, n_threads=T,
  n_threads_batch=T)``; the same ids are evaluated (no BOS added) and each next token is the
  argmax of the last position's logits (``Llama.eval``, then ``llama_get_logits_ith(ctx, -1)``:
  ``Llama.scores`` stays empty without ``logits_all``), which is greedy decoding.
"""

from __future__ import annotations

import json
import sys
import time


def _genai(model_dir: str, ids, new: int, threads: int):
    import onnxruntime_genai as og

    config = og.Config(model_dir)
    config.clear_providers()  # cpu
    overlay = {"model": {"decoder": {"session_options": {"intra_op_num_threads": threads,
                                                         "inter_op_num_threads": 1}}}}
    config.overlay(json.dumps(overlay))
    model = og.Model(config)
    versions = {"onnxruntime-genai": og.__version__}
    try:
        import onnxruntime

        versions["onnxruntime (installed beside it)"] = onnxruntime.__version__
    except ImportError:
        pass

    def run(count: int):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(ids) + count, do_sample=False)
        gen = og.Generator(model, params)
        start = time.perf_counter()
        gen.append_tokens(ids)
        times = []
        while not gen.is_done():
            gen.generate_next_token()
            times.append(time.perf_counter())
        tokens = [int(t) for t in gen.get_sequence(0)][len(ids):]
        del gen
        return tokens, times, start

    return run, versions


def _llama(gguf: str, ids, new: int, threads: int):
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(model_path=gguf, n_ctx=len(ids) + new + 8, n_threads=threads,
                          n_threads_batch=threads, n_batch=64, verbose=False)
    versions = {"llama-cpp-python": llama_cpp.__version__}
    vocab = llm.n_vocab()

    def run(count: int):
        llm.reset()
        start = time.perf_counter()
        llm.eval(list(ids))
        tokens, times = [], []
        for k in range(count):
            if k:
                llm.eval([tokens[-1]])
            # the last evaluated position's logits, read from the context: llama-cpp-python 0.3
            # fills Llama.scores only with logits_all=True (it samples inside llama.cpp)
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1),
                                           shape=(vocab,))
            tokens.append(int(np.argmax(logits)))
            times.append(time.perf_counter())
        return tokens, times, start

    return run, versions


def main() -> int:
    kind, model = sys.argv[1], sys.argv[2]
    job = json.loads(sys.stdin.readline())
    ids, new, threads = [int(i) for i in job["ids"]], int(job["new"]), int(job["threads"])
    run, versions = {"genai": _genai, "llama": _llama}[kind](model, ids, new, threads)
    run(4)  # warm-up
    print(json.dumps({"ready": True, "versions": versions}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        tokens, times, start = run(new)
        tps = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
        print(json.dumps({"tokens": tokens, "ttft_s": times[0] - start, "tokens_per_s": tps}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
