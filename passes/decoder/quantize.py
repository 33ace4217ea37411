"""Weight-only quantization of a decoder graph (``passctl export-decoder --weights int4|int8``).

The decoder of :func:`passctl.passes.decoder.graph.build_decoder` keeps its projections as MatMuls
with constant ``[K, N]`` weights (fused Q/K/V and gate/up) and its LM head as a MatMul (untied) or a
Gemm(transB=1) over the embedding matrix (tied). :func:`quantize_decoder` runs the
``quantize-weights`` pass over that graph: every one of them becomes
``com.microsoft.MatMulNBits`` (the form onnxruntime-genai's model builder writes for int4 CPU
models); a tied embedding keeps its float32 table for the Gather and the LM head reads a
quantized copy. docs/quantize-weights.md.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import onnx

WEIGHT_FORMATS = {"int4": 4, "int8": 8}


def quantize_decoder(proto: onnx.ModelProto, bits: int, block: Optional[int] = None,
                     symmetric: bool = True, method: str = "rtn", accuracy_level: Optional[int] = None,
                     exclude: str = "", float_zero_points: bool = False,
                     calib_ids: Optional[Sequence[int]] = None, window: int = 256,
                     budget: Optional[float] = None, metric: str = "mean-rel",
                     sensitivity: str = "auto", awq: bool = False, fallback: str = "float"
                     ) -> Tuple[onnx.ModelProto, Dict[str, Any]]:
    """``(quantized ModelProto, the pass's statistics)`` of decoder ``proto`` (float32).

    ``calib_ids`` (token ids of calibration text) are the calibration feeds of ``method=gptq``,
    ``awq`` and ``budget``: the text is cut into ``window``-token prefill chunks, each run with an
    empty cache (:func:`decoder_feeds`). While the pass runs, the graph returns the logits of
    every position of a chunk, not only the last one (:func:`every_position`; restored after),
    so the budget's error under ``metric`` is over all calibration tokens' logits and AWQ sees
    every token's LM-head input. ``metric="ppl"`` makes the budget a relative perplexity
    increase on the calibration text (:func:`ppl`; e.g. 0.05 for +5%). ``awq`` and ``fallback``
    are the pass's options (docs/quantize-weights.md).

    Raises:
        UserError: a bad option (see ``QuantizeWeights.Options``).
    """
    from passctl.ir import from_onnx, to_onnx
    from passctl.passes.quantize.weights import QuantizeWeights

    restore = every_position(proto) if calib_ids is not None else None
    model = from_onnx(proto)
    meta = list(proto.metadata_props)
    with tempfile.TemporaryDirectory(prefix="passctl-decoder-calib-") as folder:
        calib = ""
        if calib_ids is not None:
            calib = folder
            for k, feed in enumerate(decoder_feeds(proto, np.asarray(calib_ids), window)):
                np.savez(os.path.join(folder, f"feed{k:03d}.npz"), **feed)
        qw = QuantizeWeights(bits=bits, block=block, symmetric=symmetric, method=method,
                             accuracy_level=accuracy_level, exclude=exclude, calib=calib,
                             budget=budget, metric="mean-rel" if metric == "ppl" else metric,
                             sensitivity=sensitivity, float_zero_points=float_zero_points,
                             awq=awq, fallback=fallback)
        if metric == "ppl":
            qw.output_metric = ppl
        result = qw.run(model)
    out = to_onnx(model)
    if restore is not None:
        restore(proto)
        restore(out)
    if not list(out.metadata_props):
        out.metadata_props.extend(meta)
    return out, result.stats


def ppl(feeds, reference, candidate) -> float:
    """``perplexity(candidate) / perplexity(reference) - 1`` of the next tokens of the feeds'
    ``input_ids`` under every position's logits (:func:`every_position`), natural log, float64:
    the decoder's budget metric ``metric="ppl"``."""
    def nll(outputs):
        total, count = 0.0, 0
        for feed, out in zip(feeds, outputs):
            ids = np.asarray(feed["input_ids"])[0]
            z = np.asarray(out["logits"], np.float64)[0][:-1]
            z = z - z.max(-1, keepdims=True)
            total -= float((z[np.arange(len(ids) - 1), ids[1:]]
                            - np.log(np.exp(z).sum(-1))).sum())
            count += len(ids) - 1
        return total / count

    return float(np.exp(nll(candidate) - nll(reference)) - 1.0)


def every_position(proto: onnx.ModelProto):
    """Make ``passctl-static-kv`` decoder ``proto`` return every position's logits (in place):
    the last-token ``Slice``'s start becomes 0 and the logits shape ``[batch, -1, vocab]``.
    Returns a function that puts a proto (this one, or the graph written from it) back."""
    from onnx import numpy_helper

    g = proto.graph
    inits = {t.name: t for t in g.initializer}
    if "last.start" not in inits or "logits.tail" not in inits:
        return lambda p: None
    saved = {k: onnx.TensorProto() for k in ("last.start", "logits.tail")}
    for k, t in saved.items():
        t.CopyFrom(inits[k])
    vocab = int(g.output[0].type.tensor_type.shape.dim[-1].dim_value)
    dim = onnx.TensorShapeProto.Dimension()
    dim.CopyFrom(g.output[0].type.tensor_type.shape.dim[1])
    inits["last.start"].CopyFrom(numpy_helper.from_array(np.array([0], np.int64), "last.start"))
    inits["logits.tail"].CopyFrom(numpy_helper.from_array(np.array([-1, vocab], np.int64),
                                                          "logits.tail"))
    g.output[0].type.tensor_type.shape.dim[1].CopyFrom(onnx.TensorShapeProto.Dimension(
        dim_param="sequence"))

    def restore(p: onnx.ModelProto) -> None:
        for t in p.graph.initializer:
            if t.name in saved:
                t.CopyFrom(saved[t.name])
        p.graph.output[0].type.tensor_type.shape.dim[1].CopyFrom(dim)

    return restore


def decoder_feeds(proto: onnx.ModelProto, ids: np.ndarray, window: int = 256):
    """Prefill feeds of a ``passctl-static-kv`` graph: ``ids`` in chunks of ``window`` tokens
    (the last one dropped when shorter than 2), batch 1, caches of zeros."""
    shapes = {}
    for v in proto.graph.input:
        if v.name.startswith("past_key_values."):
            dims = v.type.tensor_type.shape.dim
            shapes[v.name] = (1,) + tuple(d.dim_value for d in dims[1:])
    for start in range(0, len(ids), window):
        chunk = ids[start:start + window]
        if len(chunk) < 2:
            continue
        feed = {"input_ids": chunk[None].astype(np.int64),
                "seqlens_k": np.array([len(chunk) - 1], np.int32),
                "total_sequence_length": np.array(len(chunk), np.int32)}
        feed.update({k: np.zeros(s, np.float32) for k, s in shapes.items()})
        yield feed


__all__ = ["WEIGHT_FORMATS", "decoder_feeds", "every_position", "ppl", "quantize_decoder"]
