"""Helpers of the compare / bisect / diff tests: ONNX Runtime runs of a model with every node
output exposed and the max-rel formula, written here independently of passctl.tools.compare."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
WRONG_RULES = os.path.join(HERE, "wrong_rules.py")


def run_all_tensors(proto: onnx.ModelProto, feeds) -> dict:
    """Every main-graph node output of ``proto`` (a copy gets them as graph outputs), by name, from
    ONNX Runtime's CPU provider with graph optimizations off."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    have = {o.name for o in proto.graph.output}
    for node in proto.graph.node:
        for name in node.output:
            if name and name not in have:
                proto.graph.output.append(onnx.ValueInfoProto(name=name))
                have.add(name)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    feed = {i.name: feeds[i.name] for i in sess.get_inputs()}
    return {n: np.asarray(v) for n, v in zip(names, sess.run(names, feed))}


def max_rel(ref: np.ndarray, got: np.ndarray) -> float:
    """max |ref - got| / max |ref| in float64 (the check's max-rel, floor 1e-30)."""
    a, b = ref.astype(np.float64), got.astype(np.float64)
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(a))), 1e-30)) if a.size else 0.0
