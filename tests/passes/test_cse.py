"""cse: equal nodes merged (chains, small constants by value); random ops and outputs kept; ORT numerics."""

from __future__ import annotations

import numpy as np
import onnx.numpy_helper
from helpers import apply, assert_same_outputs, op_types, parse

from passctl.passes.common.cse import CommonSubexpressionElimination


def test_chain_merged_and_equal_small_constants_compared_by_value():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x) => (float[2,3] y) {
            a1 = Add (x, c1)
            a2 = Add (x, c2)
            r1 = Relu (a1)
            r2 = Relu (a2)
            s1 = Softmax <axis = 1> (r1)
            s2 = Softmax <axis = 0> (r2)
            y = Add (s1, s2)
        }""", check=False)
    for name in ("c1", "c2"):  # two initializers with equal values
        proto.graph.initializer.append(onnx.numpy_helper.from_array(np.full(3, 0.5, np.float32), name))
    _, result, out = apply(proto, CommonSubexpressionElimination())
    # Add and Relu merge; the Softmaxes differ in their axis attribute.
    assert result.stats == {"eliminated": 2}
    assert op_types(out) == ["Add", "Relu", "Softmax", "Softmax", "Add"]
    assert_same_outputs(proto, out)


def test_random_ops_and_graph_outputs_not_merged():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x) => (float[4] y1, float[4] y2, float[4] z) {
            y1 = Neg (x)
            y2 = Neg (x)
            r1 = RandomUniformLike (x)
            r2 = RandomUniformLike (x)
            z = Sub (r1, r2)
        }""")
    _, result, out = apply(proto, CommonSubexpressionElimination())
    assert result.stats == {"eliminated": 0}
    assert [o.name for o in out.graph.output] == ["y1", "y2", "z"]


def test_constant_nodes_merged_by_value():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2] x) => (float[2] y) {
            k1 = Constant <value = float[2] {1.0, 2.0}> ()
            k2 = Constant <value = float[2] {1.0, 2.0}> ()
            k3 = Constant <value = float[2] {1.0, 3.0}> ()
            a = Mul (x, k1)
            b = Mul (x, k2)
            c = Mul (x, k3)
            s = Add (a, b)
            y = Add (s, c)
        }""")
    _, result, out = apply(proto, CommonSubexpressionElimination())
    # k2 merges into k1, then b into a; k3 and c differ.
    assert result.stats == {"eliminated": 2}
    assert op_types(out).count("Mul") == 2
    assert_same_outputs(proto, out)
