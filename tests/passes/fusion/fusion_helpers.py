"""Helpers of the fusion tests: run a pipeline on ONNX text, collect stats, compare under ORT."""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
from helpers import assert_same_outputs

from passctl.ir import Model, from_onnx, to_onnx
from passctl.passes.manager import PassManager
from passctl.passes.pipeline_text import build_pipeline


def model_text(body: str, inputs: str, outputs: str, opset: int = 17, inits: Dict[str, np.ndarray] = None
               ) -> onnx.ModelProto:
    """A checked ``ModelProto`` from a graph body in ``onnx.parser`` syntax; ``inits`` are added as
    initializers (numpy arrays)."""
    text = (f'<ir_version: 8, opset_import: ["" : {opset}]>\n'
            f"g ({inputs}) => ({outputs}) {{\n{body}\n}}")
    proto = onnx.parser.parse_model(text)
    for name, arr in (inits or {}).items():
        proto.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(arr), name))
    onnx.checker.check_model(proto, full_check=True)
    return proto


def run(proto: onnx.ModelProto, pipeline: str) -> Tuple[Model, Dict[str, Dict], onnx.ModelProto]:
    """Import ``proto``, run ``pipeline`` (pass-manager text); returns (IR, {pass name: stats}, proto).
    Every pass record's stats are merged under its name (the last one wins for repeated names)."""
    model = from_onnx(proto)
    result = PassManager(build_pipeline(pipeline)).run(model)
    stats = {r.name: dict(r.stats) for r in result.records}
    return model, stats, to_onnx(model)


def ops(proto: onnx.ModelProto) -> List[str]:
    """``domain::op`` (or ``op`` for the default domain) of the main graph's non-Constant nodes."""
    return [f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in proto.graph.node
            if n.op_type != "Constant"]


def check_both_lowerings(proto: onnx.ModelProto, fuse: str, expect: Dict[str, int], seed: int = 0
                         ) -> Dict[str, onnx.ModelProto]:
    """Run ``infer-shapes,<fuse>`` then each lowering; assert ``fuse``'s stats contain ``expect``, no
    ``passctl`` op is left, and the outputs match ONNX Runtime on the original within 1e-5 relative.
    Returns the lowered protos by lowering name."""
    out = {}
    for lowering in ("lower-onnxruntime", "lower-standard"):
        _, stats, lowered = run(proto, f"infer-shapes,{fuse},dce,{lowering}")
        got = {k: stats[fuse].get(k, 0) for k in expect}
        assert got == expect, stats[fuse]
        assert stats[lowering]["unlowered"] == 0
        assert not any(n.domain == "passctl" for n in lowered.graph.node)
        assert "passctl" not in {o.domain for o in lowered.opset_import}
        assert_same_outputs(proto, lowered, seed=seed, rtol=1e-5)
        out[lowering] = lowered
    onnx.checker.check_model(out["lower-standard"], full_check=True)
    return out
