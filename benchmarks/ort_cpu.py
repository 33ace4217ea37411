"""ONNX Runtime CPU latency of raw exports, onnxslim, ORT's transformers optimizer and passctl fuse.

Run ``python benchmarks/ort_cpu.py [--models bert_base,smollm2] [--runs 30] [--quick]``. For each model it
prepares four graphs and times five ONNX Runtime CPU sessions (``intra_op_num_threads=2``,
``inter_op_num_threads=1``, ``ORT_SEQUENTIAL``, batch 1):

- ``disabled``: the raw export with ``ORT_DISABLE_ALL``;
- ``ort-all``: the raw export with ``ORT_ENABLE_ALL``;
- ``onnxslim``: ``onnxslim.slim(src, out)`` (its Python API), ``ORT_ENABLE_ALL``;
- ``ort-transformers``: ``onnxruntime.transformers.optimizer.optimize_model`` (``model_type`` ``bert`` for
  BERT/MiniLM, ``qwen3`` for SmolLM2: its decoder-only type with RoPE and RMSNorm), ``ORT_ENABLE_ALL``;
  ``n/a`` for the CNNs;
- ``passctl``: ``passctl.ir.load`` -> ``PassManager(build_pipeline("cleanup,fuse"))`` -> ``save``,
  ``ORT_ENABLE_ALL``.

Timing: all sessions of a model are created first, warmed up, then run in interleaved rounds (each
round runs every session once, starting at a rotating one), so load from other processes on the
machine hits every variant alike; the table shows the median of ``--runs`` runs in milliseconds.
Every variant's outputs are compared with the ``disabled`` run (``passctl.support.check.compare``,
``max_rel``).

Headroom: the share of ``ort-all``'s operator time (ONNX Runtime's profiler,
``SessionOptions.enable_profiling``, node ``*_kernel_time`` events summed by ``op_name`` over the
profiled runs after warm-up) spent outside MatMul/Gemm/Conv and their fused and quantized variants
(FusedConv, FusedMatMul, QLinearConv...). No exact fp32 fusion can save more than that share. The same
share is shown for the passctl graph, and ``taken`` = ``(ort-all - passctl) / (ort-all * headroom)``.
``passctl vs best peer`` is the best peer's median divided by passctl's (above 1: passctl is faster);
``same at p20`` uses each variant's 20th-percentile run instead, which other processes on a shared
machine inflate less than the median (the details give the load average around each model).

Models come from ``tests/zoo.py`` and ``tests/corpus.py`` (exported with torch on first use, cached
under ``.cache/``). Results go to stdout and ``benchmarks/results/ort_cpu-<UTC date>.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import re
import statistics
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

THREADS = 2
VARIANTS = ("disabled", "ort-all", "onnxslim", "ort-transformers", "passctl")
PEERS = ("ort-all", "onnxslim", "ort-transformers")
MIN_HEADROOM = 0.01
"""Below this headroom the share of it taken is not shown (timing noise exceeds the headroom)."""
GEMM_LIKE = re.compile(r"MatMul|Gemm|Conv")
"""Op names counted as matrix work (MatMul, FusedMatMul, MatMulNBits, Gemm, QGemm, Conv, FusedConv,
NhwcFusedConv, QLinearConv, ConvTranspose, ...); everything else is headroom."""


def _zoo(model_id: str) -> Callable[[], Tuple[str, dict, dict]]:
    def get():
        from zoo import ZOO
        entry = ZOO[model_id]
        return entry.path, dict(entry.dim_values), dict(entry.input_overrides)
    return get


def _corpus(model_id: str, dims: Dict[str, int]) -> Callable[[], Tuple[str, dict, dict]]:
    def get():
        from corpus import CORPUS
        return CORPUS[model_id].path, dims, dict(CORPUS[model_id].input_overrides)
    return get


# id -> (label, (path, dim_values, overrides) getter, optimize_model keyword arguments or None). BERT
# and MiniLM: num_heads / hidden_size detected by the optimizer; SmolLM2-135M: 9 heads, hidden 576.
MODELS = {
    "bert_base": ("BERT-base seq 128", _zoo("bert_base"), {"model_type": "bert"}),
    "minilm": ("MiniLM-L6 seq 128", _zoo("minilm"), {"model_type": "bert"}),
    "resnet50": ("ResNet-50 224x224", _zoo("resnet50"), None),
    "ppocr_det": ("PP-OCRv4 det 640x640", _corpus("ppocr_det", {"x[0]": 1, "x[2]": 640, "x[3]": 640}),
                  None),
    "ppocr_rec": ("PP-OCRv4 rec 48x320", _corpus("ppocr_rec", {"x[0]": 1, "x[2]": 48, "x[3]": 320}), None),
    "smollm2": ("SmolLM2-135M seq 128", _zoo("smollm2"),
                {"model_type": "qwen3", "num_heads": 9, "hidden_size": 576}),
    "repvgg_a0": ("RepVGG-A0 224x224", _zoo("repvgg_a0"), None),
}
DEFAULT_MODELS = ("bert_base", "minilm", "resnet50", "ppocr_det", "ppocr_rec", "smollm2")


def _weights_bytes(path: str) -> int:
    folder = Path(path).parent
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def _prepare(variant: str, src: str, folder: Path, optimizer_kwargs: Optional[dict],
             pipeline: str) -> Tuple[str, dict]:
    """Write ``variant``'s graph of ``src`` into ``folder``; returns (path, info)."""
    out = str(folder / "model.onnx")
    big = _weights_bytes(src) > 1_500_000_000
    start = time.perf_counter()
    info: dict = {}
    if variant == "onnxslim":
        import onnxslim
        with contextlib.redirect_stdout(io.StringIO()):  # it prints a summary table
            onnxslim.slim(src, out)
    elif variant == "ort-transformers":
        from onnxruntime.transformers.optimizer import optimize_model
        optimized = optimize_model(src, **optimizer_kwargs)
        info["fused"] = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
        optimized.save_model_to_file(out, use_external_data_format=big)
    elif variant == "passctl":
        from passctl.ir import load, save
        from passctl.passes import PassManager, build_pipeline, expand_alias
        model = load(src)
        result = PassManager(build_pipeline(pipeline)).run(model)
        stats: Dict[str, dict] = defaultdict(dict)
        for record in result.records:
            for key, value in record.stats.items():
                if isinstance(value, (int, float)) and value:
                    stats[record.name][key] = stats[record.name].get(key, 0) + value
        cleanup = set(expand_alias("cleanup")) | {"infer-shapes"}
        info["fused"] = {name: s for name, s in stats.items() if name not in cleanup and s}
        save(model, out)
    else:
        raise ValueError(variant)
    info["prepare_s"] = time.perf_counter() - start
    return out, info


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:160] if lines else ''}"


def _session(path: str, optimize: bool, profile_prefix: Optional[str] = None):
    from passctl.support.check import cpu_session
    return cpu_session(path, optimize, THREADS, sequential=True, profile_prefix=profile_prefix)


def op_time_shares(path: str, feeds: dict, warmup: int, runs: int, folder: Path) -> Dict[str, float]:
    """Operator time by op type (microseconds) over ``runs`` profiled runs after ``warmup`` runs.

    Source: ONNX Runtime's profiler JSON (Chrome trace events); node events are named
    ``<node>_kernel_time`` with ``args.op_name``; ``model_run`` session events delimit the runs.
    """
    session = _session(path, True, str(folder / "profile"))
    for _ in range(warmup + runs):
        session.run(None, feeds)
    trace = session.end_profiling()
    with open(trace) as f:
        events = json.load(f)
    starts = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    first = starts[warmup] if len(starts) > warmup else 0
    by_op: Dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") and e["ts"] >= first:
            by_op[e["args"].get("op_name", "?")] += e["dur"]
    os.remove(trace)
    return dict(by_op)


def headroom(by_op: Dict[str, float]) -> float:
    """Share of operator time outside MatMul/Gemm/Conv-like ops (0..1)."""
    total = sum(by_op.values())
    other = sum(t for op, t in by_op.items() if not GEMM_LIKE.search(op))
    return other / total if total else float("nan")


def bench_model(model_id: str, args) -> dict:
    """Prepare, check and time every variant of one model; returns the row."""
    from passctl.support.check import compare
    from passctl.support.inputs import make_inputs

    label, getter, optimizer_kwargs = MODELS[model_id]
    src, dims, overrides = getter()
    feeds = make_inputs(src, seed=0, dim_values=dims, overrides=overrides)
    row: dict = {"id": model_id, "label": label, "ms": {}, "info": {}, "max_rel": {}, "errors": {}}
    with tempfile.TemporaryDirectory(prefix=f"ort_cpu_{model_id}_") as tmp:
        paths = {"disabled": src, "ort-all": src}
        for variant in ("onnxslim", "ort-transformers", "passctl"):
            if variant == "ort-transformers" and optimizer_kwargs is None:
                continue
            folder = Path(tmp) / variant
            folder.mkdir()
            try:
                paths[variant], row["info"][variant] = _prepare(variant, src, folder, optimizer_kwargs,
                                                                args.pipeline)
            except Exception as error:  # a peer or passctl failing is a result, not a crash
                row["errors"][variant] = _one_line(error)
                traceback.print_exc(file=sys.stderr)
        sessions = {}
        for variant, path in paths.items():
            try:
                sessions[variant] = _session(path, variant != "disabled")
            except Exception as error:
                row["errors"][variant] = "session: " + _one_line(error)
        reference = None
        for variant, session in sessions.items():
            names = [o.name for o in session.get_outputs()]
            outputs = dict(zip(names, session.run(names, feeds)))
            if reference is None:
                reference = outputs
            row["max_rel"][variant] = compare(reference, outputs).max_rel
        order = list(sessions)
        for _ in range(args.warmup):
            for variant in order:
                sessions[variant].run(None, feeds)
        times: Dict[str, List[float]] = {v: [] for v in order}
        for r in range(args.runs):
            for variant in order[r % len(order):] + order[:r % len(order)]:
                start = time.perf_counter()
                sessions[variant].run(None, feeds)
                times[variant].append((time.perf_counter() - start) * 1e3)
        row["ms"] = {v: statistics.median(t) for v, t in times.items()}
        row["p20_ms"] = {v: statistics.quantiles(t, n=5)[0] if len(t) > 1 else t[0]
                         for v, t in times.items()}
        sessions.clear()
        profile_runs = max(3, min(args.runs, 10))
        row["ops_all"] = op_time_shares(src, feeds, 2, profile_runs, Path(tmp))
        row["headroom"] = headroom(row["ops_all"])
        if "passctl" in paths and "passctl" in row["ms"]:
            row["ops_passctl"] = op_time_shares(paths["passctl"], feeds, 2, profile_runs, Path(tmp))
            row["headroom_passctl"] = headroom(row["ops_passctl"])
    return row


def _fmt(value: Optional[float], spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


def _top_ops(by_op: Dict[str, float], count: int = 6) -> str:
    """The ``count`` op types outside MatMul/Gemm/Conv taking the most time, as shares of all op time."""
    total = sum(by_op.values()) or 1.0
    other = sorted(((t, op) for op, t in by_op.items() if not GEMM_LIKE.search(op)), reverse=True)
    return ", ".join(f"{op} {100 * t / total:.1f}%" for t, op in other[:count])


def _vs_best_peer(ms: Dict[str, float]) -> Tuple[Optional[str], Optional[float]]:
    """The fastest peer in ``ms`` and its time divided by passctl's (``None`` where either is missing)."""
    peers = {p: ms[p] for p in PEERS if p in ms}
    best = min(peers, key=peers.get) if peers else None
    return best, (peers[best] / ms["passctl"] if best and "passctl" in ms else None)


def summarize(rows: List[dict]) -> List[str]:
    """The markdown tables of the results."""
    head = ["model", *VARIANTS, "best peer", "passctl vs best peer", "same at p20", "headroom",
            "non-GEMM after passctl", "headroom taken"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        ms = row["ms"]
        best, ratio = _vs_best_peer(ms)
        _, ratio_p20 = _vs_best_peer(row["p20_ms"])
        taken = None
        if "passctl" in ms and "ort-all" in ms and row["headroom"] >= MIN_HEADROOM:
            taken = (ms["ort-all"] - ms["passctl"]) / (ms["ort-all"] * row["headroom"])
        cells = [row["label"]] + [_fmt(ms.get(v)) if v in ms else ("error" if v in row["errors"] else "n/a")
                                  for v in VARIANTS]
        cells += [best or "n/a", _fmt(ratio, ".3f") + ("x" if ratio else ""),
                  _fmt(ratio_p20, ".3f") + ("x" if ratio_p20 else ""),
                  _fmt(100 * row["headroom"], ".1f") + "%",
                  (_fmt(100 * row["headroom_passctl"], ".1f") + "%") if "headroom_passctl" in row else "n/a",
                  (_fmt(100 * taken, ".0f") + "%") if taken is not None else "n/a"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Details (max_rel vs `disabled`, prepare time, fusions, p20 run, top non-GEMM ops):",
              ""]
    for row in rows:
        parts = []
        for variant in VARIANTS:
            if variant in row["errors"]:
                parts.append(f"{variant}: ERROR {row['errors'][variant]}")
            elif variant in row["max_rel"]:
                info = row["info"].get(variant, {})
                extra = f", prepare {info['prepare_s']:.1f} s" if "prepare_s" in info else ""
                extra += f", fused {json.dumps(info['fused'], sort_keys=True)}" if info.get("fused") else ""
                parts.append(f"{variant}: max_rel {row['max_rel'][variant]:.1e}{extra}")
        if "load" in row:
            parts.append("1-minute load average {:.1f} before, {:.1f} after".format(*row["load"]))
        parts.append("p20 ms: " + ", ".join(f"{v} {t:.2f}" for v, t in row["p20_ms"].items()))
        parts.append("non-GEMM ops of ort-all: " + _top_ops(row["ops_all"]))
        if "ops_passctl" in row:
            parts.append("non-GEMM ops of passctl: " + _top_ops(row["ops_passctl"]))
        lines.append(f"- **{row['label']}**: " + "; ".join(parts))
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help=f"comma-separated ids from {', '.join(MODELS)}")
    parser.add_argument("--runs", type=int, default=30, help="timed runs per variant (median is shown)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs per variant first")
    parser.add_argument("--quick", action="store_true", help="5 runs, 1 warm-up (a smoke test, noisy)")
    parser.add_argument("--pipeline", default="cleanup,fuse", help="passctl pipeline text")
    parser.add_argument("--output", default=None, help="markdown file (default benchmarks/results/"
                                                       "ort_cpu-<UTC date>.md)")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.warmup = 5, 1
    ids = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in ids if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    import onnxruntime
    import onnxslim

    now = datetime.datetime.now(datetime.timezone.utc)
    header = [f"# ONNX Runtime CPU latency, {now:%Y-%m-%d %H:%M} UTC", "",
              f"onnxruntime {onnxruntime.__version__}, onnxslim {onnxslim.__version__}, {THREADS} intra-op "
              f"threads, sequential, batch 1; median of {args.runs} interleaved runs after {args.warmup} "
              f"warm-up runs, ms; passctl pipeline `{args.pipeline}`; {os.cpu_count()} CPUs, load average "
              f"at start {os.getloadavg()[0]:.2f}.", ""]
    print("\n".join(header), flush=True)
    rows = []
    for model_id in ids:
        start, load = time.perf_counter(), os.getloadavg()[0]
        rows.append(bench_model(model_id, args))
        rows[-1]["load"] = (load, os.getloadavg()[0])
        print(f"{model_id}: done in {time.perf_counter() - start:.0f} s; "
              f"{json.dumps({k: round(v, 2) for k, v in rows[-1]['ms'].items()})}", flush=True)
    lines = header + summarize(rows) + ["", f"Load average at end: {os.getloadavg()[0]:.2f}."]
    print("\n".join(summarize(rows)))
    default = REPO / "benchmarks" / "results" / f"ort_cpu-{now:%Y-%m-%d}.md"
    out = Path(args.output) if args.output else default
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".md.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, out)
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
