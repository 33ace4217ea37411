"""Compile speed: time and peak RSS of passctl's cleanup pipeline, onnxsim and onnxslim on two models.

Run ``python benchmarks/compile_speed.py``. Each (model, tool) pair runs in a fresh subprocess that
imports the tool, loads the model, simplifies it and writes the result, so the peak RSS
(``resource.getrusage(RUSAGE_SELF).ru_maxrss`` of that process) and the time cover exactly one tool.
Time is measured inside the subprocess from before the tool's import to after its output file is
written (interpreter start-up excluded). Tools:

- ``passctl``: ``passctl.ir.load`` -> ``PassManager(build_pipeline("cleanup"))`` -> ``passctl.ir.save``.
- ``onnxsim``: ``onnx.load`` -> ``onnxsim.simplify(model)`` (its Python API: its command line takes
  6-12x longer, see docs/facts.md) -> ``onnx.save``.
- ``onnxslim``: ``onnxslim.slim(path, output_path)`` (its Python API).

Models: the 32-layer LLaMA-shape graph (``tests/corpus.py: llama_shape_model``; exported with torch
on first use, cached under ``.cache/``) and PP-OCRv4 rec (shipped in rapidocr-onnxruntime).
Ratios are the peer's time (or RSS) divided by passctl's: above 1 means passctl is faster (smaller).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOLS = ("passctl", "onnxsim", "onnxslim")
MODELS = ("llama32", "ppocr_rec")


def _model_path(model_id: str) -> str:
    sys.path.insert(0, str(REPO / "tests"))
    from corpus import CORPUS, llama_shape_model

    if model_id == "llama32":
        return llama_shape_model(num_hidden_layers=32)
    return CORPUS[model_id].path


def _count_nodes(path: str) -> int:
    import onnx

    return len(onnx.load(path, load_external_data=False).graph.node)


def _child(tool: str, src: str, out_dir: str) -> None:
    """Run one tool on ``src`` writing into ``out_dir``; print one JSON line with the measurements."""
    out = os.path.join(out_dir, "model.onnx")
    start = time.perf_counter()
    if tool == "passctl":
        from passctl.ir import load, save
        from passctl.passes.manager import PassManager
        from passctl.passes.pipeline_text import build_pipeline

        model = load(src)
        PassManager(build_pipeline("cleanup")).run(model)
        save(model, out)
    elif tool == "onnxsim":
        import onnx
        import onnxsim

        model, _ = onnxsim.simplify(onnx.load(src))
        large = model.ByteSize() > 1_800_000_000
        onnx.save(model, out, save_as_external_data=large)
    elif tool == "onnxslim":
        import onnxslim

        onnxslim.slim(src, out)
    else:
        raise SystemExit(f"unknown tool {tool}")
    seconds = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"seconds": seconds, "peak_rss_mib": peak_kib / 1024,
                      "nodes_after": _count_nodes(out)}))


def _measure(tool: str, src: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"passctl-bench-{tool}-") as tmp:
        proc = subprocess.run([sys.executable, __file__, "--child", tool, src, tmp],
                              capture_output=True, text=True, timeout=timeout, cwd=str(REPO))
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return {"error": f"exit {proc.returncode}: {tail[0]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of " + ", ".join(MODELS))
    ap.add_argument("--tools", default=",".join(TOOLS), help="comma list of " + ", ".join(TOOLS))
    ap.add_argument("--repeat", type=int, default=1, help="runs per pair; the fastest is reported")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    ap.add_argument("--child", nargs=3, metavar=("TOOL", "MODEL", "OUT_DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(*args.child)
        return 0
    tools = args.tools.split(",")
    header = (f"{'model':<10} {'tool':<9} {'nodes':>13} {'time s':>8} {'peak RSS MiB':>13} "
              f"{'time ratio':>10} {'RSS ratio':>9}")
    print(header)
    print("-" * len(header))
    for model_id in args.models.split(","):
        src = _model_path(model_id)
        before = _count_nodes(src)
        rows = {}
        for tool in tools:
            runs = [_measure(tool, src, args.timeout) for _ in range(max(1, args.repeat))]
            good = [r for r in runs if "error" not in r]
            rows[tool] = min(good, key=lambda r: r["seconds"]) if good else runs[0]
        base = rows.get("passctl", {})
        for tool in tools:
            r = rows[tool]
            if "error" in r:
                print(f"{model_id:<10} {tool:<9} {'':>13} {r['error']}")
                continue
            ratio_t = r["seconds"] / base["seconds"] if "seconds" in base else float("nan")
            ratio_m = r["peak_rss_mib"] / base["peak_rss_mib"] if "seconds" in base else float("nan")
            nodes = f"{before}->{r['nodes_after']}"
            print(f"{model_id:<10} {tool:<9} {nodes:>13} {r['seconds']:>8.2f} "
                  f"{r['peak_rss_mib']:>13.0f} {ratio_t:>10.2f} {ratio_m:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
