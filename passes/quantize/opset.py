"""Raising a model's default-domain opset (13 for per-channel QDQ, 21 for blocked int4
DequantizeLinear) with onnx's version converter."""

from __future__ import annotations

import logging

from passctl.ir import Model, from_onnx, to_onnx
from passctl.ir.errors import UserError

logger = logging.getLogger(__name__)


def raise_opset(model: Model, opset: int, owner: str = "quantize-int8",
                what: str = "per-channel int8") -> int:
    """Convert ``model`` in place to default-domain ``opset`` when it is lower; return the old one.

    Uses ``onnx.version_converter.convert_version`` (the ONNX project's adapters between opsets,
    e.g. Squeeze/Unsqueeze/ReduceSum ``axes`` attributes becoming inputs at 13). The converted
    model replaces ``model``'s graph, opset imports, IR version and functions; each node keeps the
    provenance of the node of the same name (the converter drops node metadata).

    Args:
        owner, what: the pass and the form needing ``opset``, for the messages.

    Raises:
        UserError: the converter fails (e.g. a custom-domain op it has no schema for); names the
            opsets and says to convert the model first.
    """
    old = model.opset
    if old >= opset:
        return old
    import onnx.version_converter

    try:
        # weights memory-mapped from the model's folder stay external references: the converter
        # reads the graph only, and a 7B model's weights are neither copied nor embedded
        converted = onnx.version_converter.convert_version(to_onnx(model, keep_external=True),
                                                           opset)
    except Exception as e:  # the converter raises RuntimeError / ConvertError / ValidationError
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise UserError(f"{owner}: {what} needs opset >= {opset} but the model has "
                        f"opset {old}, and onnx's version converter failed ({first}); convert the "
                        f"model to opset {opset} first (or quantize before `fuse`)") from e
    new = from_onnx(converted, model.base_dir)
    # The converter drops node metadata (where provenance is written): restore it by node name,
    # so exclude= entries naming source nodes (Conv@1) still match after cleanup,fuse.
    provenance = {n.name: n.provenance for n in model.graph if n.name and n.provenance}
    for n in new.graph:
        if n.name in provenance:
            n.provenance = provenance[n.name]
    adopt(model, new)
    logger.info("%s: opset raised from %d to %d", owner, old, opset)
    return old


def adopt(model: Model, source: Model) -> None:
    """Put ``source``'s graph, opset imports, IR version and functions into ``model`` (in place:
    the caller's ``Model`` object stays the one it holds)."""
    model.graph = source.graph
    model.opset_imports = source.opset_imports
    model.ir_version = source.ir_version
    model.functions = source.functions
