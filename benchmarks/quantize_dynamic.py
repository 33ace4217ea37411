"""ONNX Runtime CPU latency of encoders at seq 128: fp32, passctl dynamic int8, ORT's quantize_dynamic.

Run ``python benchmarks/quantize_dynamic.py [--models minilm,bert_base] [--rounds 5] [--runs 10]``.
For each model (batch 1, sequence 128):

- ``fp32``: the original file, ``ORT_ENABLE_ALL``;
- ``passctl fp32``: ``cleanup,fuse,flash-attn`` (passctl's exact fusions) as shipped;
- ``passctl dyn-int8`` / ``passctl dyn-int8 (integer)``: ``cleanup,fuse,flash-attn,
  quantize-dynamic{metric=cosine,budget=B,calib=DIR,form=dqmm|integer}`` (``--budget B``,
  default 7e-3): DynamicQuantizeMatMul
  vs the MatMulInteger form, the MatMuls the budget allows, with the pass's default
  ``smooth=search`` (SmoothQuant smoothing of the LayerNorm-fed MatMuls, alpha chosen on the
  calibration feeds; ``smooth_alpha`` in the stats column);
- ``ort quantize_dynamic``: ``onnxruntime.quantization.quantize_dynamic(fp32 file,
  weight_type=QInt8)`` (its defaults: per-tensor weights, MatMulInteger form), ``ORT_ENABLE_ALL``.

Sessions: ``passctl.support.check.cpu_session``, 2 intra-op threads (``--no-spinning``: all of
them with ``session.intra_op.allow_spinning=0``); warm-up, then ``--rounds``
interleaved rounds of ``--runs`` runs per variant; the median over all runs is printed.

Calibration (the budget's feeds): MiniLM (all-MiniLM-L6-v2, real weights, ``minilm_legacy``):
the lines of ``tests/data/public_domain_text.txt`` tokenized by its own tokenizer in batches
padded to 128 tokens (not the 200 evaluation sentences); BERT-base (``tests/zoo.py``, random
weights): seeded random ids at seq 128. Accuracy: MiniLM's mean-pooled embeddings (attention-mask
weighted mean of last_hidden_state) of the 200 sentences of ``tests/data/sentences.txt``, cosine
against the fp32 model's per sentence (mean and minimum); BERT-base: 1 - cosine of
last_hidden_state on 4 seeded random feeds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "passes" / "precision"))

THREADS = 2
SEQ = 128
DIMS = {"batch": 1, "sequence": SEQ}


def _calib_minilm(folder: Path) -> None:
    from real_models import DATA, minilm_tokenizer

    tok = minilm_tokenizer()
    lines = [l for l in (DATA / "public_domain_text.txt").read_text().splitlines()[1:]
             if l.strip()]
    for k in range(4):
        chunk = lines[k * 8:(k + 1) * 8] or lines[:8]
        enc = tok(chunk, return_tensors="np", padding="max_length", truncation=True,
                  max_length=SEQ)
        np.savez(folder / f"calib{k}.npz", **{n: np.asarray(enc[n], np.int64) for n in
                                               ("input_ids", "attention_mask", "token_type_ids")})


def _calib_random(path: str, folder: Path) -> None:
    from passctl.support.inputs import make_inputs

    for k in range(2):
        np.savez(folder / f"calib{k}.npz", **make_inputs(path, seed=100 + k, dim_values=DIMS))


def _compile(src: str, pipeline: str, out: Path) -> dict:
    from passctl.ir import load, save
    from passctl.passes import PassManager, build_pipeline

    model = load(src)
    start = time.perf_counter()
    result = PassManager(build_pipeline(pipeline)).run(model)
    save(model, str(out))
    stats = next((r.stats for r in result.records if r.name == "quantize-dynamic"), {})
    stats = {k: v for k, v in stats.items() if k in ("quantized_layers", "float_layers",
                                                      "error", "form", "bias_absorbed")}
    smoothing = next((r.stats.get("smoothing") for r in result.records
                      if r.name == "quantize-dynamic"), None)
    if smoothing:
        stats["smooth_alpha"] = smoothing.get("alpha")
    stats["compile_s"] = round(time.perf_counter() - start, 1)
    return stats


def _embeddings(path: str, feeds):
    from passctl.support.check import cpu_session

    s = cpu_session(path, optimize=True, threads=THREADS)
    names = {i.name for i in s.get_inputs()}
    out = []
    for f in feeds:
        h = s.run(["last_hidden_state"], {k: v for k, v in f.items() if k in names})[0]
        mask = f["attention_mask"][..., None].astype(np.float64)
        out.append((h.astype(np.float64) * mask).sum(1) / mask.sum(1))
    return np.concatenate(out)


def _cosines(e: np.ndarray, ref: np.ndarray) -> np.ndarray:
    return (e * ref).sum(1) / np.linalg.norm(e, axis=1) / np.linalg.norm(ref, axis=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="minilm,bert_base")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--budget", type=float, default=7e-3, help="cosine budget (1 - cos)")
    ap.add_argument("--no-spinning", action="store_true",
                    help="every timed session with session.intra_op.allow_spinning=0 (worker "
                         "threads sleep between kernels; ONNX Runtime's default spins)")
    args = ap.parse_args()
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from passctl.support.check import cpu_session
    from passctl.support.cpu_isa import host_isa
    from passctl.support.inputs import make_inputs

    print(f"cpu: {host_isa()}; {THREADS} threads; batch 1, sequence {SEQ}; worker threads "
          f"{'sleep (allow_spinning=0)' if args.no_spinning else 'spin (ONNX Runtime default)'}")
    for model_id in args.models.split(","):
        if model_id == "minilm":
            from corpus import CORPUS
            src = CORPUS["minilm_legacy"].path
        elif model_id == "bert_base":
            from zoo import ZOO
            src = ZOO["bert_base"].path
        else:
            raise SystemExit(f"unknown model {model_id}; use minilm, bert_base")
        with tempfile.TemporaryDirectory(prefix="passctl-qdyn-") as tmp:
            tmp = Path(tmp)
            calib = tmp / "calib"
            calib.mkdir()
            _calib_minilm(calib) if model_id == "minilm" else _calib_random(src, calib)
            q = (f"quantize-dynamic{{metric=cosine,budget={args.budget:g},calib={calib}"
                 f",form=FORM}}")
            variants = {"fp32": (src, {})}
            variants["passctl fp32"] = (str(tmp / "fused.onnx"),
                                        _compile(src, "cleanup,fuse,flash-attn", tmp / "fused.onnx"))
            for form, label in (("dqmm", "passctl dyn-int8"), ("integer", "passctl dyn-int8 (integer)")):
                out = tmp / f"dyn-{form}.onnx"
                variants[label] = (str(out), _compile(src, "cleanup,fuse,flash-attn," +
                                                      q.replace("FORM", form), out))
            ort_out = tmp / "ort-dynamic.onnx"
            quantize_dynamic(src, str(ort_out), weight_type=QuantType.QInt8)
            variants["ort quantize_dynamic"] = (str(ort_out), {})
            feed = make_inputs(src, seed=0, dim_values=DIMS)
            spin = False if args.no_spinning else None
            sessions = {k: cpu_session(p, optimize=True, threads=THREADS, spinning=spin)
                        for k, (p, _) in variants.items()}
            times = {k: [] for k in variants}
            for s in sessions.values():
                names = {i.name for i in s.get_inputs()}
                for _ in range(3):
                    s.run(None, {k: v for k, v in feed.items() if k in names})
            for _ in range(args.rounds):
                for k, s in sessions.items():
                    names = {i.name for i in s.get_inputs()}
                    f = {n: v for n, v in feed.items() if n in names}
                    for _ in range(args.runs):
                        t = time.perf_counter()
                        s.run(None, f)
                        times[k].append(time.perf_counter() - t)
            base = statistics.median(times["fp32"])
            if model_id == "minilm":
                from real_models import minilm_feeds, sentences

                feeds = minilm_feeds(sentences())
                ref = _embeddings(src, feeds)
            else:
                feeds = [make_inputs(src, seed=200 + k, dim_values=DIMS) for k in range(4)]
                ref = np.concatenate([cpu_session(src, threads=THREADS).run(
                    ["last_hidden_state"], f)[0].reshape(1, -1) for f in feeds])
            print(f"\n{model_id} ({src})")
            print(f"{'variant':28s} {'median ms':>10s} {'vs fp32':>8s}  accuracy  passctl stats")
            for k, (path, stats) in variants.items():
                ms = statistics.median(times[k]) * 1e3
                if model_id == "minilm":
                    c = _cosines(_embeddings(path, feeds), ref)
                    acc = f"cos mean {c.mean():.5f} min {c.min():.5f}"
                else:
                    s = cpu_session(path, optimize=True, threads=THREADS)
                    got = np.concatenate([s.run(["last_hidden_state"], f)[0].reshape(1, -1)
                                          for f in feeds])
                    acc = f"1-cos max {float(1 - _cosines(got, ref).min()):.2e}"
                print(f"{k:28s} {ms:10.2f} {base * 1e3 / ms:7.2f}x  {acc}  {stats or ''}",
                      flush=True)
            del sessions


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
