"""Benchmark: passctl ONNX import / print / parse / export against onnx.load + onnx.save.

Each measurement runs in its own subprocess, so its peak RSS (``ru_maxrss``) is its own. Models: every
corpus model (``tests/corpus.py``) and the 32-layer LLaMA-shape graph. Goals: import+export within 2x
of load+save time, peak RSS (above an idle interpreter with the same imports) under 1.5x the weight
bytes.

Usage: ``python benchmarks/ir_roundtrip.py [--models ID,ID] [--no-llama] [--json FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

_CHILD_PRELUDE = """
import json, os, resource, sys, time
import numpy, onnx
import passctl.ir
"""

# Each child prints one JSON line with its timings; the parent adds the child's peak RSS.
_CHILD = {
    "idle": "result = {}",
    "onnx": """
src, out = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
m = onnx.load(src)
t1 = time.perf_counter()
external = any(t.data_location == onnx.TensorProto.EXTERNAL
               for t in onnx.load(src, load_external_data=False).graph.initializer)
if external or m.ByteSize() > 2**31 - 1:
    onnx.save(m, out, save_as_external_data=True, location=os.path.basename(out) + ".data")
else:
    onnx.save(m, out)
t2 = time.perf_counter()
result = {"load": t1 - t0, "save": t2 - t1}
""",
    "passctl": """
from passctl.ir import load, save
src, out = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
m = load(src)
t1 = time.perf_counter()
save(m, out)
t2 = time.perf_counter()
weights = sum(v.const.nbytes for v in m.graph.initializers.values())
for n in m.graph.all_nodes():
    for a in n.attributes.values():
        if a.type == passctl.ir.AttrType.TENSOR:
            weights += a.value.nbytes
result = {"import": t1 - t0, "export": t2 - t1, "weights": weights}
""",
    "text": """
from passctl.ir import load
src = sys.argv[1]
m = load(src)
try:
    from passctl.ir.printer import print_model
    from passctl.ir.parser import parse_model
except ImportError as e:
    result = {"print": None, "parse": None, "why": str(e)}
else:
    t0 = time.perf_counter()
    text = print_model(m)
    t1 = time.perf_counter()
    parse_model(text, src + ".ir")
    t2 = time.perf_counter()
    result = {"print": t1 - t0, "parse": t2 - t1}
""",
}
_CHILD_END = """
print(json.dumps(result))
"""


def run_child(kind: str, src: str, out: str) -> dict:
    """Run one measurement in a fresh interpreter; returns its JSON plus ``rss`` (peak bytes)."""
    code = _CHILD_PRELUDE + _CHILD[kind] + _CHILD_END
    script = (
        "import resource, subprocess, sys, json\n"
        "p = subprocess.run([sys.executable, '-c', sys.argv[1], *sys.argv[2:]], capture_output=True,"
        " text=True)\n"
        "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024\n"
        "print(json.dumps({'rc': p.returncode, 'out': p.stdout, 'err': p.stderr[-2000:], 'rss': rss}))\n")
    # A wrapper process per measurement, so RUSAGE_CHILDREN covers exactly one child.
    proc = subprocess.run([sys.executable, "-c", script, code, src, out], capture_output=True,
                          text=True, check=True)
    wrapped = json.loads(proc.stdout)
    if wrapped["rc"] != 0:
        return {"error": wrapped["err"].strip().splitlines()[-1] if wrapped["err"] else "failed"}
    result = json.loads(wrapped["out"].strip().splitlines()[-1])
    result["rss"] = wrapped["rss"]
    return result


def measure(name: str, src: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="passctl-bench-") as tmp:
        row = {"model": name, "file": src}
        row["idle"] = run_child("idle", src, "")
        row["onnx"] = run_child("onnx", src, os.path.join(tmp, "onnx.onnx"))
        row["passctl"] = run_child("passctl", src, os.path.join(tmp, "passctl.onnx"))
        row["text"] = run_child("text", src, "")
    return row


def models(ids, with_llama: bool):
    from corpus import CORPUS, llama_shape_model

    for model_id in ids or list(CORPUS):
        yield model_id, CORPUS[model_id].path
    if with_llama:
        yield "llama_shape_32l", llama_shape_model()


def _fmt_s(v):
    return "n/a" if v is None else f"{v:.3f}"


def _mb(v):
    return f"{v / 2**20:.0f}"


def report(rows) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text
        Console = Table = None
    headers = ["model", "weights MB", "onnx load+save s", "import s", "export s", "imp+exp s",
               "time ratio", "print s", "parse s", "onnx RSS MB", "passctl RSS MB",
               "RSS/weights"]
    lines = []
    for r in rows:
        o, p, t, idle = r["onnx"], r["passctl"], r["text"], r["idle"]
        if "error" in p or "error" in o:
            lines.append([r["model"]] + ["error: " + (p.get("error") or o.get("error"))] +
                         [""] * (len(headers) - 2))
            continue
        base = o["load"] + o["save"]
        ours = p["import"] + p["export"]
        rss_ours = p["rss"] - idle["rss"]
        ratio_rss = rss_ours / p["weights"] if p["weights"] else float("nan")
        lines.append([r["model"], _mb(p["weights"]), f"{base:.3f}", f"{p['import']:.3f}",
                      f"{p['export']:.3f}", f"{ours:.3f}", f"{ours / base:.2f}x",
                      _fmt_s(t.get("print")), _fmt_s(t.get("parse")),
                      _mb(o["rss"] - idle["rss"]), _mb(rss_ours), f"{ratio_rss:.2f}x"])
    if Table is not None:
        table = Table(title="passctl IR round trip vs onnx.load + onnx.save "
                            "(RSS: peak above an idle interpreter)")
        for h in headers:
            table.add_column(h, justify="left" if h == "model" else "right")
        for line in lines:
            table.add_row(*line)
        Console(width=max(160, Console().width)).print(table)
    else:
        print("\t".join(headers))
        for line in lines:
            print("\t".join(line))
    missing = [r["text"].get("why") for r in rows if r["text"].get("why")]
    if missing:
        print(f"print/parse n/a: {missing[0]}")
    print("goals: imp+exp time <= 2x onnx load+save; passctl RSS < 1.5x weight bytes")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated corpus ids (default: all)")
    parser.add_argument("--no-llama", action="store_true", help="skip the LLaMA-shape graph")
    parser.add_argument("--json", help="also write the raw measurements to this file")
    args = parser.parse_args(argv)
    ids = args.models.split(",") if args.models else None
    rows = []
    for name, src in models(ids, not args.no_llama):
        start = time.perf_counter()
        rows.append(measure(name, src))
        print(f"measured {name} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    report(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
