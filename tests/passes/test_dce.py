"""dce: dead nodes (also in subgraphs), unused initializers and functions removed; ORT numerics."""

from __future__ import annotations

import numpy as np
import onnx.numpy_helper
from helpers import apply, assert_same_outputs, op_types, parse

from passctl.passes.common.dce import DeadCodeElimination


def test_dead_chain_and_initializers_removed_graph_input_initializer_kept():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[3] x, float[3] keep) => (float[3] y) {
            d1 = Relu (x)
            d2 = Mul (d1, unused_w)
            d3 = Neg (d2)
            y = Add (x, keep)
        }""", check=False)
    for name in ("unused_w", "keep", "orphan"):
        proto.graph.initializer.append(onnx.numpy_helper.from_array(np.ones(3, np.float32), name))
    _, result, out = apply(proto, DeadCodeElimination())
    assert result.stats == {"nodes_removed": 3, "initializers_removed": 2, "functions_removed": 0}
    assert op_types(out) == ["Add"]
    assert [t.name for t in out.graph.initializer] == ["keep"]
    assert_same_outputs(proto, out)


def test_dead_nodes_inside_if_branches_and_outer_values():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (bool c, float[2] x) => (float[2] y) {
            outer = Sigmoid (x)
            y = If (c) <
                then_branch = t () => (float[2] ty) { dead_t = Mul (outer, outer)  ty = Relu (x) },
                else_branch = e () => (float[2] ey) { ey = Neg (x) }
            >
        }""")
    _, result, out = apply(proto, DeadCodeElimination())
    # The branch's dead Mul goes first, then the outer Sigmoid that only it read.
    assert result.stats["nodes_removed"] == 2
    assert op_types(out) == ["If"]
    then = next(a.g for a in out.graph.node[0].attribute if a.name == "then_branch")
    assert [n.op_type for n in then.node] == ["Relu"]
    for flag in (True, False):
        assert_same_outputs(proto, out, inputs={"c": np.array(flag),
                                                "x": np.array([-1.0, 2.0], np.float32)})


def test_unused_function_removed_called_one_kept():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17, "local" : 1]>
        g (float[2] x) => (float[2] y) {
            y = local.Used (x)
        }
        <domain: "local", opset_import: ["" : 17, "local" : 1]>
        Used (a) => (b) { b = local.Inner (a) }
        <domain: "local", opset_import: ["" : 17]>
        Inner (a) => (b) { b = Relu (a) }
        <domain: "local", opset_import: ["" : 17]>
        Unused (a) => (b) { b = Neg (a) }
        """)
    model, result, out = apply(proto, DeadCodeElimination())
    assert result.stats["functions_removed"] == 1
    assert sorted(f.name for f in out.functions) == ["Inner", "Used"]
    assert_same_outputs(proto, out)


def test_nothing_to_do_is_not_modified():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2] x) => (float[2] y) { y = Relu (x) }""")
    _, result, _ = apply(proto, DeadCodeElimination())
    assert not result.modified
