"""clone_model (used by the crash reproducer): equal structure, independent nodes, shared tensors."""

from __future__ import annotations

import numpy as np
import onnx.numpy_helper
from helpers import assert_same_outputs, parse

from passctl.ir import from_onnx, to_onnx
from passctl.ir.equality import structural_diff
from passctl.passes._snapshot import clone_model


def _proto():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17, "local" : 1]>
        g (bool c, float[2] x) => (float[2] y) {
            outer = Mul (x, w)
            y = If (c) <
                then_branch = t () => (float[2] ty) { ty = local.Twice (outer) },
                else_branch = e () => (float[2] ey) { ey = Neg (outer) }
            >
        }
        <domain: "local", opset_import: ["" : 17]>
        Twice (a) => (b) { b = Add (a, a) }""", check=False)
    proto.graph.initializer.append(onnx.numpy_helper.from_array(np.array([2.0, 3.0], np.float32), "w"))
    return proto


def test_clone_is_structurally_equal_and_runs_the_same():
    model = from_onnx(_proto())
    model.metadata_props["k"] = "v"
    copy = clone_model(model)
    assert structural_diff(model, copy) is None
    assert copy.metadata_props == {"k": "v"} and copy.metadata_props is not model.metadata_props
    for flag in (True, False):
        assert_same_outputs(to_onnx(model), to_onnx(copy),
                            inputs={"c": np.array(flag), "x": np.array([1.0, -2.0], np.float32)})


def test_clone_is_independent_but_shares_weights():
    model = from_onnx(_proto())
    copy = clone_model(model)
    assert copy.graph.initializers["w"].const is model.graph.initializers["w"].const
    mul = next(n for n in copy.graph if n.op_type == "Mul")
    mul.op_type = "Sub"
    then = next(n for n in copy.graph if n.op_type == "If").attributes["then_branch"].value
    # The subgraph reads the copied outer value, not the original's.
    (twice,) = list(then)
    assert twice.inputs[0] is mul.outputs[0]
    assert [n.op_type for n in model.graph] == ["Mul", "If"]
    assert structural_diff(model, copy) is not None
