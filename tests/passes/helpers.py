"""Shared helpers of the pass tests: parse ONNX text, run one pass, compare with ONNX Runtime."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
import onnx
import onnx.parser

from passctl.ir import Model, from_onnx, to_onnx
from passctl.ir.verifier import verify
from passctl.passes.base import Pass, PassResult
from passctl.support.check import compare, run_onnxruntime
from passctl.support.inputs import make_inputs


def parse(text: str, check: bool = True) -> onnx.ModelProto:
    """An ``onnx.ModelProto`` from ``onnx.parser`` text, checked by ``onnx.checker``."""
    proto = onnx.parser.parse_model(text)
    if check:
        onnx.checker.check_model(proto, full_check=True)
    return proto


def apply(proto: onnx.ModelProto, p: Pass) -> Tuple[Model, PassResult, onnx.ModelProto]:
    """Import ``proto``, run pass ``p`` on it, export; returns (IR model, result, exported proto).

    The IR is verified (``passctl.ir.verifier.verify``) before and after the pass, and the export
    must pass ``onnx.checker``."""
    model = from_onnx(proto)
    assert_verifies(model)
    result = p(model)
    assert_verifies(model)
    out = to_onnx(model)
    onnx.checker.check_model(out)
    return model, result, out


def assert_verifies(model: Model) -> None:
    """The IR verifier finds no error in ``model``."""
    errors = [d for d in verify(model, check_output_types=False) if d.severity == "error"]
    assert not errors, "\n".join(str(d) for d in errors)


def assert_same_outputs(original: onnx.ModelProto, candidate: onnx.ModelProto, seed: int = 0,
                        rtol: float = 1e-5, inputs: Optional[Dict[str, np.ndarray]] = None) -> None:
    """Both models run in ONNX Runtime (no graph optimizations) on the same seeded random inputs;
    every output of ``original`` matches ``candidate``'s within ``rtol`` relative error."""
    feeds = make_inputs(original, seed=seed) if inputs is None else inputs
    ref = run_onnxruntime(original, feeds)
    cand = run_onnxruntime(candidate, feeds)
    result = compare(ref, cand)
    assert [o.name for o in original.graph.output] == [o.name for o in candidate.graph.output]
    assert result.ok(rtol), str(result)


def op_types(proto: onnx.ModelProto):
    """The op types of the main graph's nodes, in order."""
    return [n.op_type for n in proto.graph.node]
