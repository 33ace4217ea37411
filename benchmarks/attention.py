"""ONNX Runtime CPU latency of attention substitution: passctl flash-attn vs unfused vs ORT's optimizer.

Run ``python benchmarks/attention.py [--models minilm,bert_base] [--seqs 128,512] [--runs 15]``.
For each model and sequence length (batch 1, attention mask all ones) it prepares four graphs and
times them in ONNX Runtime CPU sessions (``intra_op_num_threads=2``, ``ORT_SEQUENTIAL``,
``ORT_ENABLE_ALL``):

- ``unfused``: the export as it is;
- ``ort-transformers``: ``onnxruntime.transformers.optimizer.optimize_model(model_type="bert",
  num_heads, hidden_size)`` (its fused-op counts are printed: it fuses no attention in these
  transformers-5 exports, docs/facts.md);
- ``passctl flash-attn``: ``passctl`` pipeline ``flash-attn`` (every attention ->
  com.microsoft.MultiHeadAttention; nothing else fused);
- ``passctl fuse,flash-attn``: ``cleanup,fuse,flash-attn`` (LayerNorm/GELU/Gemm fusions too, the
  like-for-like peer of ORT's optimizer).

Sessions are created first, warmed up, then run in interleaved rounds (each round runs every variant
once) so load from other processes hits all alike; the table shows the median and the fastest run
in milliseconds and each variant's ``max_rel`` against the unfused graph run with ``ORT_DISABLE_ALL``. Results go to stdout and
``benchmarks/results/attention-<UTC date>.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

THREADS = 2
VARIANTS = ("unfused", "ort-transformers", "passctl flash-attn", "passctl fuse,flash-attn")
MODELS = {"minilm": ("minilm_legacy", 12, 384), "bert_base": ("bert_base", 12, 768)}


def _model_path(source_id: str) -> str:
    """The ONNX file of a tests/corpus.py model, else of a tests/zoo.py one (``MODELS``' first field)."""
    from corpus import CORPUS
    if source_id in CORPUS:
        return CORPUS[source_id].path
    from zoo import ZOO
    return ZOO[source_id].path


def _prepare(variant: str, src: str, folder: Path, heads: int, hidden: int) -> Dict:
    out = folder / (variant.replace(" ", "_").replace(",", "+") + ".onnx")
    info: Dict = {"path": str(out)}
    start = time.perf_counter()
    if variant == "unfused":
        info["path"] = src
    elif variant == "ort-transformers":
        from onnxruntime.transformers.optimizer import optimize_model
        with contextlib.redirect_stdout(io.StringIO()):
            optimized = optimize_model(src, model_type="bert", num_heads=heads, hidden_size=hidden)
        info["fused"] = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
        optimized.save_model_to_file(str(out))
    else:
        from passctl.ir import load, save
        from passctl.passes import PassManager, build_pipeline
        pipeline = "flash-attn" if variant == "passctl flash-attn" else "cleanup,fuse,flash-attn"
        model = load(src)
        result = PassManager(build_pipeline(pipeline)).run(model)
        fused = {}
        for r in result.records:
            if r.name == "fuse-attention":
                fused["attention"] = r.stats["attention"]
                fused["unfused_softmax"] = r.stats["unfused_softmax"]
            elif r.name.startswith("lower-"):
                fused.update({k: v for k, v in r.stats.items() if "->" in k and v})
        info["fused"] = fused
        save(model, str(out))
    info["prepare_s"] = round(time.perf_counter() - start, 2)
    return info


def _session(path: str, optimize: bool = True):
    from passctl.support.check import cpu_session
    return cpu_session(path, optimize, THREADS, sequential=True)


def bench(model_id: str, seqs: List[int], runs: int, warmup: int) -> List[Dict]:
    from passctl.support.check import compare, make_inputs
    source_id, heads, hidden = MODELS[model_id]
    src = _model_path(source_id)
    rows = []
    with tempfile.TemporaryDirectory(prefix="passctl-attn-bench-") as tmp:
        infos = {v: _prepare(v, src, Path(tmp), heads, hidden) for v in VARIANTS}
        sessions = {v: _session(info["path"]) for v, info in infos.items()}
        reference = _session(src, optimize=False)
        for seq in seqs:
            feeds = make_inputs(src, seed=0, dim_values={"batch": 1, "sequence": seq})
            ref = dict(zip([o.name for o in reference.get_outputs()], reference.run(None, feeds)))
            times: Dict[str, List[float]] = {v: [] for v in VARIANTS}
            rel: Dict[str, Optional[float]] = {}
            for v, s in sessions.items():
                out = dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))
                rel[v] = compare(ref, out).max_rel
                for _ in range(warmup):
                    s.run(None, feeds)
            for r in range(runs):
                order = list(VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)])
                for v in order:
                    t0 = time.perf_counter()
                    sessions[v].run(None, feeds)
                    times[v].append((time.perf_counter() - t0) * 1e3)
            rows.append({"model": model_id, "seq": seq,
                         "ms": {v: statistics.median(t) for v, t in times.items()},
                         "min_ms": {v: min(t) for v, t in times.items()}, "max_rel": rel,
                         "fused": {v: infos[v].get("fused", {}) for v in VARIANTS}})
    return rows


def table(rows: List[Dict]) -> List[str]:
    lines = ["| model | seq | " + " | ".join(VARIANTS) + " | flash-attn vs unfused (median; fastest) |",
             "|---|---|" + "---|" * len(VARIANTS) + "---|"]
    for r in rows:
        cells = [f"{r['ms'][v]:.1f} / {r['min_ms'][v]:.1f} ({r['max_rel'][v]:.0e})" for v in VARIANTS]
        speed = r["ms"]["unfused"] / r["ms"]["passctl flash-attn"]
        fastest = r["min_ms"]["unfused"] / r["min_ms"]["passctl flash-attn"]
        lines.append(f"| {r['model']} | {r['seq']} | " + " | ".join(cells)
                     + f" | {speed:.2f}x; {fastest:.2f}x |")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minilm,bert_base")
    parser.add_argument("--seqs", default="128,512")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    seqs = [int(s) for s in args.seqs.split(",")]
    rows = []
    for model_id in args.models.split(","):
        rows.extend(bench(model_id, seqs, args.runs, args.warmup))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    load = os.getloadavg()
    lines = [f"# Attention substitution on ONNX Runtime CPU ({date} UTC)", "",
             f"`python benchmarks/attention.py --models {args.models} --seqs {args.seqs} --runs "
             f"{args.runs}`; batch 1, {THREADS} threads; cells: median / fastest ms (max_rel vs the "
             f"unfused graph without ORT optimizations); load average {load[0]:.1f} at the end (a "
             "shared machine: the fastest run is the less disturbed figure).", ""]
    lines += table(rows)
    lines += ["", "Fused operators per variant (first sequence length's graphs are the same):", ""]
    seen = set()
    for r in rows:
        if r["model"] in seen:
            continue
        seen.add(r["model"])
        for v in VARIANTS[1:]:
            lines.append(f"- {r['model']} {v}: {r['fused'][v]}")
    text = "\n".join(lines) + "\n"
    print(text)
    out = REPO / "benchmarks" / "results" / f"attention-{date}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
