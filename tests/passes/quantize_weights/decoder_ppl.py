"""Perplexity of a ``passctl export-decoder`` artifact's graph (float32 or MatMulNBits weights).

The artifact's graph returns the logits of a chunk's last token only; for perplexity every
position's logits are needed, so :func:`all_logits_session` loads the artifact's very
``model.onnx`` (its weights, its MatMulNBits nodes) and bypasses only the final ``Slice`` of the
hidden states (and, for a tied LM head, widens the logits reshape to ``[batch, -1, vocab]``).
Each 256-token window is one prefill chunk with an empty cache (GroupQueryAttention, causal),
as ``tests/passes/precision/real_models.perplexity`` cuts the text.
"""

from __future__ import annotations

import json
import os
from typing import List

import numpy as np
import onnx
from onnx import numpy_helper

WINDOW = 256


def all_logits_session(folder: str, threads: int = 2):
    import onnxruntime as ort

    with open(os.path.join(folder, "decoder.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    proto = onnx.load(os.path.join(folder, manifest["model"]))
    g = proto.graph
    slices = [n for n in g.node if n.op_type == "Slice" and len(n.input) == 4
              and n.input[1] == "last.start"]
    assert len(slices) == 1, "not a passctl-static-kv decoder graph"
    cut = slices[0]
    for n in g.node:
        for i, name in enumerate(n.input):
            if name == cut.output[0]:
                n.input[i] = cut.input[0]
    g.node.remove(cut)
    vocab = manifest["vocab_size"]
    for t in g.initializer:
        if t.name == "logits.tail":
            t.CopyFrom(numpy_helper.from_array(np.array([-1, vocab], np.int64), "logits.tail"))
    out = g.output[0]
    out.type.tensor_type.shape.dim[1].ClearField("dim_value")
    out.type.tensor_type.shape.dim[1].dim_param = "sequence"
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(proto.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"]), manifest


def perplexity(folder: str, ids: np.ndarray, window: int = WINDOW) -> float:
    """exp(mean NLL) of each token given the earlier tokens of its ``window``-token window
    (the last window shorter), natural log, float64."""
    s, m = all_logits_session(folder)
    runs: List[np.ndarray] = [ids[i:i + window] for i in range(0, len(ids), window)]
    runs = [r for r in runs if len(r) >= 2]
    nll, count = 0.0, 0
    shape = (1, m["num_kv_heads"], m["max_length"], m["head_dim"])
    for w in runs:
        feed = {"input_ids": w[None].astype(np.int64),
                "seqlens_k": np.array([len(w) - 1], np.int32),
                "total_sequence_length": np.array(len(w), np.int32)}
        for i in range(m["num_layers"]):
            feed[f"past_key_values.{i}.key"] = np.zeros(shape, np.float32)
            feed[f"past_key_values.{i}.value"] = np.zeros(shape, np.float32)
        logits = s.run(["logits"], feed)[0][0].astype(np.float64)[:-1]
        logits -= logits.max(-1, keepdims=True)
        log_sum = np.log(np.exp(logits).sum(-1))
        nll -= (logits[np.arange(len(w) - 1), w[1:]] - log_sum).sum()
        count += len(w) - 1
    return float(np.exp(nll / count))
