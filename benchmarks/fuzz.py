"""Differential fuzzer of passctl's pass families (issue 15, build item 8).

Random valid opset-17 graphs (``tests/fuzz/fuzz_graphs.py``: conv/BN/activations, RepVGG-style branches,
MatMul/Gemm + bias, LayerNorm/RMSNorm and GELU/SiLU/HardSwish spellings, attention with MHA/GQA
heads and every mask form, constant subgraphs, with broadcast-rank, shared-initializer,
extra-consumer, wrong-axis, keepdims and NaN perturbations) go through ``passctl compile`` per pass
family, in-process, and the artifact run in ONNX Runtime the way it ships is compared with ONNX
Runtime on the original at ORT_DISABLE_ALL (``tests/fuzz/fuzz_runner.py`` says how each run is judged).

    python benchmarks/fuzz.py --graphs 10000                 # every family, seeds 0..9999
    python benchmarks/fuzz.py --graphs 500 --family flash-attn --seed 1000
    python benchmarks/fuzz.py --minutes 60 --save-failures /tmp/fuzz-fails

Prints OK / REFUSED / INTERNAL / WRONG counts per family, how many graphs held attention and how
many of those got it fused (``fuse-attention``) and lowered to an attention kernel op, then every
WRONG and INTERNAL run (family, seed, one-line reason) grouped by reason, and the REFUSED reasons.
One failure reproduces with ``--family F --seed S --graphs 1``; ``--save-failures DIR`` writes each
failing graph (``model.onnx``, ``inputs.npz``, ``README.txt`` with the passctl command) for
minimizing. Exit status 1 when any run is WRONG or INTERNAL.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "fuzz"))
sys.path.insert(0, str(REPO / "benchmarks"))

from passctl_path import ensure_passctl_importable  # noqa: E402

ensure_passctl_importable()

from fuzz_runner import (FAMILIES, INTERNAL, REFUSED, WRONG, family, grouped,  # noqa: E402
                         run_many)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--graphs", type=int, default=10000, help="graphs per family (default 10000)")
    p.add_argument("--family", action="append", default=[],
                   help=f"family to run (repeatable or comma-separated; default: "
                        f"{', '.join(FAMILIES)}; also flash-attn-only, reparam-fuse)")
    p.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--minutes", type=float, default=None,
                   help="stop after this many minutes (seeds run across all families in turn)")
    p.add_argument("--save-failures", metavar="DIR", default=None,
                   help="write each WRONG / INTERNAL graph to DIR/<family>-<seed>/")
    p.add_argument("--show-refused", type=int, default=10,
                   help="REFUSED reason groups to print (default 10)")
    p.add_argument("-v", "--verbose", action="store_true", help="print each failure as it happens")
    args = p.parse_args(argv)

    names = [n for arg in args.family for n in arg.split(",") if n] or list(FAMILIES)
    try:
        families = [family(n) for n in names]
    except KeyError as e:
        p.error(str(e.args[0]))
    deadline = time.monotonic() + 60 * args.minutes if args.minutes else None
    start = time.monotonic()
    done = [0]

    def progress(o) -> None:
        done[0] += 1
        if args.verbose and o.kind in (WRONG, INTERNAL):
            print(o.line(), flush=True)
        if done[0] % 500 == 0:
            print(f"... {done[0]} runs, {time.monotonic() - start:.0f} s", file=sys.stderr,
                  flush=True)

    if args.save_failures:
        os.makedirs(args.save_failures, exist_ok=True)
    summary = run_many(families, range(args.seed, args.seed + args.graphs), args.save_failures,
                       deadline, progress)
    elapsed = time.monotonic() - start
    runs = len(summary.outcomes)
    print(f"fuzz: {runs} runs ({runs // max(len(families), 1)} graphs per family, seeds from "
          f"{args.seed}) in {elapsed:.0f} s ({elapsed / max(runs, 1):.3f} s per run)")
    print(summary.table())
    for kind in (WRONG, INTERNAL):
        fails = [o for o in summary.outcomes if o.kind == kind]
        if not fails:
            continue
        print(f"\n{kind} ({len(fails)}), by reason:")
        for key, group in grouped(fails):
            print(f"  [{len(group)}] {key}")
            for o in group[:5]:
                print(f"      family={o.family} seed={o.seed}: {o.reason}  "
                      f"[{','.join(o.tags[:12])}]")
            if len(group) > 5:
                print(f"      ... seeds {', '.join(f'{o.family}:{o.seed}' for o in group[5:25])}"
                      f"{' ...' if len(group) > 25 else ''}")
    refused = [o for o in summary.outcomes if o.kind == REFUSED]
    if refused and args.show_refused:
        print(f"\nREFUSED ({len(refused)}), by reason:")
        for key, group in grouped(refused)[:args.show_refused]:
            print(f"  [{len(group)}] e.g. family={group[0].family} seed={group[0].seed}: "
                  f"{group[0].reason}")
    return 1 if summary.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
