"""SmolLM2-135M on ONNX Runtime's CPU provider: passctl fuse with and without fuse-skip-rmsnorm.

Run ``python benchmarks/ort_skip_rmsnorm.py [--seqs 32,128] [--runs 50] [--profile] [--kernels]``.
SmolLM2-135M comes from the test zoo (``tests/zoo.py``: exported once, cached under ``.cache/``).
Variants, each ``passctl.ir.load`` -> ``PassManager(build_pipeline(P))`` -> ``save``:

- ``before``: ``cleanup`` + the cpu ``fuse`` group without ``fuse-skip-rmsnorm`` (residual Add +
  SimplifiedLayerNormalization, what ``fuse`` gave before the SkipRMSNorm family);
- ``after``: ``cleanup,fuse`` (SkipRMSNorm lowered by ``lower-onnxruntime``: its statistics are
  printed, e.g. ``SkipRMSNorm->com.microsoft::SkipSimplifiedLayerNormalization``).

Timing sessions: ``ORT_ENABLE_ALL``, ``intra_op_num_threads=2``, one inter-op thread, ``ORT_SEQUENTIAL``,
``session.intra_op.allow_spinning=0`` (see ``_timing_session``: with spinning the order of two
interleaved sessions biases their medians), batch 1. Both sessions are warmed up, then run in interleaved
rounds (alternating which goes first), so load from other processes hits both alike; the median and
20th percentile of ``--runs`` runs are printed in milliseconds, with ``after``'s max relative error
against ``before`` (``passctl.support.check.compare``).

``--profile`` (the ceiling): ONNX Runtime's profiler (``SessionOptions.enable_profiling``) on each
graph; the share of the run time (``model_run`` events after warm-up) spent in the residual Add
nodes (Adds whose output feeds a SimplifiedLayerNormalization) plus the (Skip)SimplifiedLayerNormalization
nodes, matched by node name in the ``*_kernel_time`` events. On ``before`` that share is the ceiling:
no fusion of the two can save more; on ``after`` it is what the fused kernels cost instead.

``--kernels`` (instead of the model): the profiler's kernel time per block of a 30-block residual
chain at SmolLM2's width (576), Add + SimplifiedLayerNormalization against one
SkipSimplifiedLayerNormalization that writes the sum as its 4th output; each form in its own
session, so neither's threads compete with the other's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
THREADS = 2


def prepare(src: str, folder: Path) -> Dict[str, str]:
    """Write the ``before`` and ``after`` graphs of ``src`` under ``folder``; returns their paths."""
    from passctl.ir import load, save
    from passctl.passes import PassManager, build_pipeline, expand_alias

    fuse = expand_alias("fuse", "cpu")
    pipelines = {"before": ",".join(["cleanup"] + [p for p in fuse if p != "fuse-skip-rmsnorm"]),
                 "after": "cleanup,fuse"}
    paths = {}
    for variant, pipeline in pipelines.items():
        model = load(src)
        result = PassManager(build_pipeline(pipeline)).run(model)
        lowered = [r.stats for r in result.records if r.name == "lower-onnxruntime"][-1]
        print(f"{variant}: lower-onnxruntime {json.dumps({k: v for k, v in lowered.items() if v})}")
        (folder / variant).mkdir()
        paths[variant] = str(folder / variant / "model.onnx")
        save(model, paths[variant])
    return paths


def ceiling(path: str, feeds: dict, warmup: int, runs: int, prefix: str) -> dict:
    """Share of ``model_run`` time in residual Adds + SimplifiedLayerNormalization (profiler)."""
    import onnx

    from passctl.support.check import cpu_session

    graph = onnx.load(path, load_external_data=False).graph
    consumers = defaultdict(list)
    for n in graph.node:
        for name in n.input:
            consumers[name].append(n.op_type)
    norms = {n.name for n in graph.node
             if n.op_type in ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")}
    adds = {n.name for n in graph.node if n.op_type == "Add"
            and "SimplifiedLayerNormalization" in consumers[n.output[0]]}
    session = cpu_session(path, True, THREADS, sequential=True, profile_prefix=prefix)
    for _ in range(warmup + runs):
        session.run(None, feeds)
    trace = session.end_profiling()
    with open(trace) as f:
        events = json.load(f)
    os.remove(trace)
    run_events = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                        key=lambda e: e["ts"])[warmup:]
    first = run_events[0]["ts"]
    total = sum(e["dur"] for e in run_events)
    spent = {"add": 0.0, "norm": 0.0}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time") or e["ts"] < first:
            continue
        node = e["name"][:-len("_kernel_time")]
        spent["add"] += e["dur"] if node in adds else 0.0
        spent["norm"] += e["dur"] if node in norms else 0.0
    return {"adds": len(adds), "norms": len(norms), "run_ms": total / len(run_events) / 1e3,
            "add_ms": spent["add"] / len(run_events) / 1e3, "norm_ms": spent["norm"] / len(run_events) / 1e3,
            "share": (spent["add"] + spent["norm"]) / total}


def _chain(fused: bool, seq: int, layers: int = 30, hidden: int = 576) -> bytes:
    """A pre-norm residual stream of ``layers`` blocks at SmolLM2's width: per block the residual sum
    (Add) + RMSNorm (``SimplifiedLayerNormalization``), or one ``SkipSimplifiedLayerNormalization``
    writing the sum as its 4th output, then a Mul standing in for the block."""
    import numpy as np
    import onnx.helper as oh
    import onnx.numpy_helper as nh

    nodes, a, h = [], "a", "h"
    for i in range(layers):
        if fused:
            nodes.append(oh.make_node("SkipSimplifiedLayerNormalization", [a, h, "w"],
                                      [f"y{i}", "", "", f"s{i}"], domain="com.microsoft", epsilon=1e-5))
        else:
            nodes += [oh.make_node("Add", [a, h], [f"s{i}"]),
                      oh.make_node("SimplifiedLayerNormalization", [f"s{i}", "w"], [f"y{i}"], axis=-1,
                                   epsilon=1e-5, stash_type=1)]
        nodes.append(oh.make_node("Mul", [f"y{i}", "c"], [f"a{i + 1}"]))
        a, h = f"a{i + 1}", f"s{i}"
    nodes.append(oh.make_node("Add", [a, h], ["out"], name="out"))
    shape = [1, seq, hidden]
    weights = [nh.from_array(np.random.default_rng(0).uniform(0.5, 1.5, hidden).astype(np.float32), "w"),
               nh.from_array(np.array([0.1], np.float32), "c")]
    graph = oh.make_graph(nodes, "chain", [oh.make_tensor_value_info(n, 1, shape) for n in ("a", "h")],
                          [oh.make_tensor_value_info("out", 1, shape)], weights)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18),
                                               oh.make_opsetid("com.microsoft", 1)]).SerializeToString()


def kernel_us(seq: int, runs: int, prefix: str) -> Dict[str, float]:
    """Profiler kernel time per block (microseconds, mean over ``runs`` runs after 10 warm-up runs) of
    the residual Add + RMSNorm in :func:`_chain`'s two forms; one session at a time."""
    import numpy as np

    from passctl.support.check import cpu_session

    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal((1, seq, 576)).astype(np.float32) for n in ("a", "h")}
    result = {}
    for fused in (False, True):
        session = cpu_session(_chain(fused, seq), True, THREADS, sequential=True, profile_prefix=prefix)
        for _ in range(10 + runs):
            session.run(None, feeds)
        trace = session.end_profiling()
        with open(trace) as f:
            events = json.load(f)
        os.remove(trace)
        first = sorted(e["ts"] for e in events if e.get("name") == "model_run")[10]
        total = sum(e["dur"] for e in events if e.get("cat") == "Node" and e["ts"] >= first
                    and e.get("name", "").endswith("_kernel_time")
                    and e["args"].get("op_name") != "Mul" and e["name"] != "out_kernel_time")
        result["fused" if fused else "unfused"] = total / runs / 30
    return result


def _timing_session(path: str):
    """``ORT_ENABLE_ALL``, 2 intra-op threads, sequential, and no spinning: with ONNX Runtime's default
    spin-wait, the idle threads of one session slow the next session's run, and in interleaved rounds
    the first-listed of two identical sessions measured a 19% higher median (A/A test, seq 32)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def latency(paths: Dict[str, str], feeds: dict, warmup: int, runs: int) -> Dict[str, List[float]]:
    """Milliseconds per run of each variant, interleaved rounds (see :func:`_timing_session`)."""
    sessions = {v: _timing_session(p) for v, p in paths.items()}
    order = list(sessions)
    for _ in range(warmup):
        for v in order:
            sessions[v].run(None, feeds)
    times: Dict[str, List[float]] = {v: [] for v in order}
    for r in range(runs):
        for v in (order if r % 2 == 0 else order[::-1]):
            start = time.perf_counter()
            sessions[v].run(None, feeds)
            times[v].append((time.perf_counter() - start) * 1e3)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", default="32,128", help="sequence lengths, comma-separated")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="also measure the ceiling (profiler)")
    parser.add_argument("--kernels", action="store_true",
                        help="only the kernel comparison on a 30-block residual chain (profiler)")
    args = parser.parse_args(argv)

    import tempfile

    from passctl.support.check import compare, cpu_session
    from passctl.support.inputs import make_inputs
    from zoo import ZOO

    if args.kernels:
        with tempfile.TemporaryDirectory(prefix="ort_skip_rmsnorm_") as tmp:
            for seq in (int(s) for s in args.seqs.split(",")):
                k = kernel_us(seq, max(args.runs, 100), str(Path(tmp) / "prof"))
                print(f"seq {seq} kernels per block: Add + SimplifiedLayerNormalization "
                      f"{k['unfused']:.2f} us, "
                      f"SkipSimplifiedLayerNormalization {k['fused']:.2f} us "
                      f"(fused/unfused {k['fused'] / k['unfused']:.2f})")
        return 0
    entry = ZOO["smollm2"]
    with tempfile.TemporaryDirectory(prefix="ort_skip_rmsnorm_") as tmp:
        paths = prepare(entry.path, Path(tmp))
        for seq in (int(s) for s in args.seqs.split(",")):
            feeds = make_inputs(paths["before"], seed=0, dim_values={"batch": 1, "sequence": seq},
                                overrides=dict(entry.input_overrides))
            outs = {}
            for v, p in paths.items():
                session = cpu_session(p, True, THREADS)
                names = [o.name for o in session.get_outputs()]
                outs[v] = dict(zip(names, session.run(names, feeds)))
            max_rel = compare(outs["before"], outs["after"]).max_rel
            if args.profile:
                for v in ("before", "after"):
                    c = ceiling(paths[v], feeds, args.warmup, min(args.runs, 30), str(Path(tmp) / "prof"))
                    print(f"seq {seq} {v} profile: {c['adds']} residual Adds {c['add_ms']:.3f} ms + "
                          f"{c['norms']} (Skip)SimplifiedLayerNormalization {c['norm_ms']:.3f} ms of "
                          f"{c['run_ms']:.2f} ms per run = {100 * c['share']:.2f}%")
            times = latency(paths, feeds, args.warmup, args.runs)
            med = {v: statistics.median(t) for v, t in times.items()}
            p20 = {v: statistics.quantiles(t, n=5)[0] for v, t in times.items()}
            print(f"seq {seq}: median before {med['before']:.2f} ms, after {med['after']:.2f} ms "
                  f"(after/before {med['after'] / med['before']:.3f}); p20 before {p20['before']:.2f}, "
                  f"after {p20['after']:.2f}; {args.runs} runs, {THREADS} threads; max_rel after vs "
                  f"before {max_rel:.1e}; load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
