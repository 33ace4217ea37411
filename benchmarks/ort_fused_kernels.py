"""ONNX Runtime CPU time of each fused kernel that ``fuse`` emits against the unfused ops it replaces.

Run ``python benchmarks/ort_fused_kernels.py [--runs 1000]``. Each case is a one-node (fused) and a
few-node (unfused) graph on the activation shape of a real model (BERT-base / MiniLM / SmolLM2 at
batch 1, sequence 128), run with ``intra_op_num_threads=2``, interleaved, under both
``ORT_DISABLE_ALL`` (the kernels as written) and ``ORT_ENABLE_ALL`` (what ONNX Runtime's own fusions
make of the unfused form). Medians in microseconds; ``fused/unfused`` below 1 means the fusion pays.
A fused op that is slower than the ops it replaces should not be emitted for this target.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Dict, List, Sequence, Tuple

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper

MS = "com.microsoft"


def _graph(nodes: Sequence[onnx.NodeProto], inputs: Sequence[Tuple[str, List[int]]],
           weights: Dict[str, np.ndarray], shape: List[int]) -> bytes:
    """A model with float32 ``inputs``, one float32 output ``y`` of ``shape``, and ``weights``."""
    graph = oh.make_graph(list(nodes), "case",
                          [oh.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in inputs],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, shape)],
                          [onnx.numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid(MS, 1)])
    return model.SerializeToString()


def cases(seed: int = 0) -> Dict[str, Tuple[bytes, bytes, List[Tuple[str, List[int]]]]]:
    """name -> (unfused model, fused model, inputs). Formulas: ONNX operator specs and ONNX Runtime's
    ContribOperators.md (SkipLayerNormalization, SimplifiedLayerNormalization, BiasGelu, QuickGelu)."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    n = oh.make_node
    out = {}
    for hidden, label in ((384, "MiniLM"), (768, "BERT-base")):
        shape = [1, 128, hidden]
        w = {"g": rng.standard_normal(hidden).astype(f32), "b": rng.standard_normal(hidden).astype(f32),
             "bias": rng.standard_normal(hidden).astype(f32)}
        ins = [("x", shape), ("s", shape)]
        unfused = _graph([n("Add", ["x", "bias"], ["xb"]), n("Add", ["xb", "s"], ["t"]),
                          n("LayerNormalization", ["t", "g", "b"], ["y"], axis=-1, epsilon=1e-12)],
                         ins, w, shape)
        fused = _graph([n("SkipLayerNormalization", ["x", "s", "g", "b", "bias"], ["y"], domain=MS,
                          epsilon=1e-12)], ins, w, shape)
        out[f"SkipLayerNorm {label} {shape}"] = (unfused, fused, ins)
    shape = [1, 128, 576]
    w = {"g": rng.standard_normal(576).astype(f32), "two": np.array(2.0, f32), "eps": np.array(1e-5, f32),
         "axes": np.array([-1], np.int64)}
    unfused = _graph([n("Pow", ["x", "two"], ["p"]), n("ReduceMean", ["p", "axes"], ["m"], keepdims=1),
                      n("Add", ["m", "eps"], ["a"]), n("Sqrt", ["a"], ["r"]), n("Reciprocal", ["r"], ["i"]),
                      n("Mul", ["x", "i"], ["xn"]), n("Mul", ["xn", "g"], ["y"])], [("x", shape)], w, shape)
    fused = _graph([n("SimplifiedLayerNormalization", ["x", "g"], ["y"], axis=-1, epsilon=1e-5,
                      stash_type=1)], [("x", shape)], {"g": w["g"]}, shape)
    out[f"RMSNorm SmolLM2 {shape}"] = (unfused, fused, [("x", shape)])
    shape = [1, 128, 1536]
    unfused = _graph([n("Sigmoid", ["x"], ["s"]), n("Mul", ["x", "s"], ["y"])], [("x", shape)], {}, shape)
    fused = _graph([n("QuickGelu", ["x"], ["y"], domain=MS, alpha=1.0)], [("x", shape)], {}, shape)
    out[f"SiLU SmolLM2 {shape}"] = (unfused, fused, [("x", shape)])
    shape = [1, 128, 3072]
    w = {"b": rng.standard_normal(3072).astype(f32), "sqrt2": np.array(np.sqrt(2.0), f32),
         "one": np.array(1.0, f32), "half": np.array(0.5, f32)}
    unfused = _graph([n("Add", ["x", "b"], ["xb"]), n("Div", ["xb", "sqrt2"], ["d"]), n("Erf", ["d"], ["e"]),
                      n("Add", ["e", "one"], ["e1"]), n("Mul", ["xb", "e1"], ["m"]),
                      n("Mul", ["m", "half"], ["y"])], [("x", shape)], w, shape)
    fused = _graph([n("BiasGelu", ["x", "b"], ["y"], domain=MS)], [("x", shape)], {"b": w["b"]}, shape)
    out[f"BiasGelu BERT-base {shape}"] = (unfused, fused, [("x", shape)])
    return out


def measure(runs: int, threads: int = 2) -> List[str]:
    """Markdown table rows: case, level, unfused and fused medians (us), their ratio, max |difference|."""
    from passctl.support.check import cpu_session

    rng = np.random.default_rng(1)
    rows = ["| case | ORT level | unfused us | fused us | fused/unfused | max abs diff |",
            "|---|---|---|---|---|---|"]
    for name, (unfused, fused, inputs) in cases().items():
        feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in inputs}
        for level in ("ORT_DISABLE_ALL", "ORT_ENABLE_ALL"):
            sessions = [cpu_session(m, optimize=level == "ORT_ENABLE_ALL", threads=threads)
                        for m in (unfused, fused)]
            results = [s.run(None, feeds)[0] for s in sessions]
            times: List[List[float]] = [[], []]
            for _ in range(runs):
                for i, session in enumerate(sessions):
                    start = time.perf_counter()
                    session.run(None, feeds)
                    times[i].append((time.perf_counter() - start) * 1e6)
            a, b = statistics.median(times[0]), statistics.median(times[1])
            diff = float(np.max(np.abs(results[0] - results[1])))
            rows.append(f"| {name} | {level} | {a:.0f} | {b:.0f} | {b / a:.2f} | {diff:.1e} |")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000, help="interleaved runs per graph (median shown)")
    args = parser.parse_args(argv)
    print("\n".join(measure(args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
