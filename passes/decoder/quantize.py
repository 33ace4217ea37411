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

from typing import Any, Dict, Optional, Tuple

import onnx

WEIGHT_FORMATS = {"int4": 4, "int8": 8}


def quantize_decoder(proto: onnx.ModelProto, bits: int, block: Optional[int] = None,
                     symmetric: bool = True, method: str = "rtn", accuracy_level: int = 4,
                     exclude: str = "") -> Tuple[onnx.ModelProto, Dict[str, Any]]:
    """``(quantized ModelProto, the pass's statistics)`` of decoder ``proto`` (float32).

    Raises:
        UserError: a bad option (see ``QuantizeWeights.Options``).
    """
    from passctl.ir import from_onnx, to_onnx
    from passctl.passes.quantize.weights import QuantizeWeights

    model = from_onnx(proto)
    meta = list(proto.metadata_props)
    result = QuantizeWeights(bits=bits, block=block, symmetric=symmetric, method=method,
                             accuracy_level=accuracy_level, exclude=exclude).run(model)
    out = to_onnx(model)
    if not list(out.metadata_props):
        out.metadata_props.extend(meta)
    return out, result.stats


__all__ = ["WEIGHT_FORMATS", "quantize_decoder"]
