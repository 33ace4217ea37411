"""CPU latency: passctl's TVM llvm artifact and TVM's own ONNX frontend + default pipeline vs ONNX Runtime.

Run ``python benchmarks/tvm_cpu.py [--models resnet50,minilm_legacy,bert_base] [--runs N]``. In one
process, for each model (batch 1; MiniLM at sequence 16 as in the corpus, BERT-base at 128):

- ``onnxruntime``: the original ONNX file, ``ORT_ENABLE_ALL``, ``intra_op_num_threads`` = CPU count.
- ``tvm default``: ``tvm.relax.frontend.onnx.from_onnx`` on the original file with static input
  shapes, then ``tvm.compile(mod, target)`` with TVM 0.27's default pipeline (for llvm it legalizes
  every op into a serial loop nest: no fusion, no schedules); the failure is printed when the import
  fails (BERT's scalar ConstantOfShape). Then also ``tvm default (cleaned)``: the same on the file
  after passctl ``cleanup,lower-tvm{dims=...}`` (what TVM's default pipeline does once it imports).
- ``passctl tvm``: ``cleanup,fuse,lower-tvm{dims=...}`` (the TVM form of ``fuse``) and the TVM emitter
  for the ``cpu`` profile (fused kernels with passctl's CPU schedules, NHWC convolutions, weight
  layout transforms run once at load), loaded with ``tvm.runtime`` only.

Both TVM variants use the same target: ``llvm`` with this host's ``-mcpu`` and ``num-cores``. Latency
is the median wall-clock ms of ``--runs`` calls after 2 warm-up calls (a variant slower than 1 s per
call gets 3 runs); the ratio column is latency / ONNX Runtime's (1.0 = parity, below 1 = faster).
The table is printed last and written to ``benchmarks/results/tvm_cpu-<UTC date>.md``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))  # also loaded by path from tests/benchmarks
from passctl_path import scratch_dir  # noqa: E402
from tvm_baseline import cleaned_export, lower_tvm, max_rel, tvm_default  # noqa: E402

MODELS: Dict[str, Tuple[str, Dict[str, int]]] = {
    "resnet50": ("zoo", {}),
    "minilm_legacy": ("corpus", {"batch": 1, "sequence": 16}),
    "bert_base": ("zoo", {"batch": 1, "sequence": 128}),
}


def model_path(model_id: str) -> str:
    """The ONNX file of ``model_id`` (zoo or corpus; exported with torch on first use)."""
    kind, _ = MODELS[model_id]
    if kind == "zoo":
        from zoo import zoo_path
        return zoo_path(model_id)
    from corpus import CORPUS
    return CORPUS[model_id].path


def time_ms(call: Callable[[], object], runs: int, warmup: int = 2) -> List[float]:
    """Wall-clock ms of ``runs`` calls after ``warmup`` calls (3 runs when one call takes > 1 s)."""
    start = time.perf_counter()
    call()
    first = time.perf_counter() - start
    for _ in range(warmup - 1):
        call()
    runs = 3 if first > 1.0 else runs
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def run_onnxruntime(path: str, feeds) -> Tuple[Callable, np.ndarray, float]:
    from passctl.support.check import cpu_session

    start = time.perf_counter()
    sess = cpu_session(path, optimize=True, threads=os.cpu_count() or 1)
    build = time.perf_counter() - start
    return (lambda: sess.run(None, feeds)), sess.run(None, feeds)[0], build


def run_tvm_default(path: str, feeds) -> Tuple[Callable, np.ndarray, float]:
    import tvm

    from passctl.targets.tvm.support import host_cpu_target

    return tvm_default(path, feeds, tvm.target.Target(host_cpu_target()), tvm.cpu(), quiet=True)


def run_passctl_tvm(path: str, dims: Dict[str, int], feeds) -> Tuple[Callable, np.ndarray, float]:
    from passctl.ir import load
    from passctl.passes.manager import PassManager
    from passctl.passes.pipeline_text import build_pipeline
    from passctl.targets import get_target
    from passctl.targets.tvm import TvmEmitter, load_artifact

    start = time.perf_counter()
    model = load(path)
    PassManager(build_pipeline("cleanup,fuse," + lower_tvm(dims), "cpu", "tvm")).run(model)
    folder = os.path.join(scratch_dir("tvm-cpu-"), "artifact")
    TvmEmitter(self_check=False).emit(model, get_target("cpu"), folder)
    art = load_artifact(folder)
    build = time.perf_counter() - start
    return art.bind(feeds), next(iter(art.run(feeds).values())), build


def bench(model_ids: List[str], runs: int) -> List[tuple]:
    """Rows ``(model, variant, median ms, ratio to ORT, max rel err vs ORT, build s, note)``."""
    from passctl.support.inputs import make_inputs

    rows = []
    for model_id in model_ids:
        path = model_path(model_id)
        _, dims = MODELS[model_id]
        feeds = make_inputs(path, seed=0, dim_values=dims)
        ort_ms, ref = None, None
        variants = ["onnxruntime", "tvm default", "passctl tvm"]
        for variant in variants:
            try:
                if variant == "onnxruntime":
                    call, out, build = run_onnxruntime(path, feeds)
                elif variant == "tvm default":
                    call, out, build = run_tvm_default(path, feeds)
                elif variant == "tvm default (cleaned)":
                    cleaned = cleaned_export(path, "cpu", os.path.join(scratch_dir("tvm-cpu-"), "cleaned.onnx"),
                                             dims)
                    call, out, build = run_tvm_default(cleaned, feeds)
                else:
                    call, out, build = run_passctl_tvm(path, dims, feeds)
                ms = statistics.median(time_ms(call, runs))
                if variant == "onnxruntime":
                    ort_ms, ref = ms, out
                ratio = ms / ort_ms if ort_ms else float("nan")
                err = max_rel(out, ref) if ref is not None else float("nan")
                rows.append((model_id, variant, ms, ratio, err, build, ""))
            except Exception as e:  # noqa: BLE001 (a failing variant is a result)
                msg = (str(e).strip().splitlines() or [type(e).__name__])[-1][:110]
                traceback.print_exc(limit=2)
                rows.append((model_id, variant, float("nan"), float("nan"), float("nan"),
                             float("nan"), f"failed: {msg}"))
                if variant == "tvm default":
                    variants.append("tvm default (cleaned)")
            print(f"{rows[-1][0]} {rows[-1][1]}: {rows[-1][2]:.2f} ms {rows[-1][6]}", flush=True)
    return rows


def table(rows) -> str:
    """The rows as a Markdown table."""
    lines = ["| model | variant | median ms | vs ONNX Runtime | max rel err vs ORT | build s | note |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for model_id, variant, ms, ratio, err, build, note in rows:
        lines.append(f"| {model_id} | {variant} | {ms:.2f} | {ratio:.2f}x | {err:.1e} | "
                     f"{build:.1f} | {note} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,minilm_legacy,bert_base")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--no-save", action="store_true", help="do not write benchmarks/results/")
    args = parser.parse_args(argv)
    import tvm

    from passctl.targets.tvm.support import host_cpu_target

    rows = bench([m.strip() for m in args.models.split(",") if m.strip()], args.runs)
    now = datetime.datetime.now(datetime.timezone.utc)
    header = (f"{now:%Y-%m-%d %H:%M} UTC; tvm {tvm.__version__}; target {host_cpu_target()}; "
              f"{os.cpu_count()} cores (shared with other jobs: compare ratios, not absolute ms)")
    text = header + "\n\n" + table(rows)
    if not args.no_save:
        out = REPO / "benchmarks" / "results" / f"tvm_cpu-{now:%Y-%m-%d}.md"
        out.parent.mkdir(exist_ok=True)
        out.write_text(text + "\n")
    print()
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
