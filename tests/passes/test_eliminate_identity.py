"""eliminate-identity: each no-op rule, graph-output names kept, kept cases; ORT numerics."""

from __future__ import annotations

from helpers import apply, assert_same_outputs, op_types, parse

from passctl.passes.common.eliminate_identity import EliminateIdentity


def test_all_rules():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x) => (float[3,2] y) {
            a = Identity (x)
            b = Dropout (a)
            c = Cast <to = 1> (b)
            shp = Constant <value = int64[2] {0, -1}> ()
            d = Reshape (c, shp)
            e = Transpose <perm = [0, 1]> (d)
            f = Relu (e)
            y = Transpose <perm = [1, 0]> (f)
        }""")
    _, result, out = apply(proto, EliminateIdentity())
    assert result.stats == {"identity": 1, "dropout": 1, "cast": 1, "reshape": 1, "transpose": 1,
                            "removed": 5}
    assert op_types(out) == ["Constant", "Relu", "Transpose"]
    assert out.graph.node[1].input[0] == "x"
    assert_same_outputs(proto, out)


def test_graph_output_identity_renames_producer():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x) => (float[4] y) {
            r = Relu (x)
            y = Identity (r)
        }""")
    _, result, out = apply(proto, EliminateIdentity())
    assert result.stats["identity"] == 1
    assert op_types(out) == ["Relu"]
    assert out.graph.node[0].output[0] == "y" and out.graph.output[0].name == "y"
    assert_same_outputs(proto, out)


def test_kept_when_output_identity_reads_input_or_other_output():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x) => (float[4] y, float[4] r, float[4] z) {
            y = Identity (x)
            r = Relu (x)
            z = Identity (r)
        }""")
    _, result, out = apply(proto, EliminateIdentity())
    assert result.stats["removed"] == 0
    assert [o.name for o in out.graph.output] == ["y", "r", "z"]
    assert_same_outputs(proto, out)


def test_not_noops_kept():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x) => (float[3,2] y, double[2,3] c, float[2,3] m, bool[2,3] mask) {
            shp = Constant <value = int64[2] {3, 2}> ()
            y = Reshape (x, shp)
            c = Cast <to = 11> (x)
            ratio = Constant <value_float = 0.5> ()
            mode = Constant <value = bool {1}> ()
            m, mask = Dropout (x, ratio, mode)
        }""")
    _, result, out = apply(proto, EliminateIdentity())
    assert result.stats["removed"] == 0
    assert op_types(out).count("Constant") == 3 and len(out.graph.node) == 6


def test_inside_loop_body():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2] x) => (float[2] y) {
            n = Constant <value = int64 {3}> ()
            y = Loop (n, , x) <body = b (int64 i, bool cond, float[2] v) => (bool co, float[2] vo) {
                co = Identity (cond)
                t = Identity (v)
                vo = Add (t, t)
            }>
        }""")
    _, result, out = apply(proto, EliminateIdentity())
    # co = Identity(cond): cond is a body input, so that Identity stays; t goes.
    assert result.stats["identity"] == 1
    body = out.graph.node[1].attribute[0].g
    assert [n.op_type for n in body.node] == ["Identity", "Add"]
    assert_same_outputs(proto, out)


def test_stale_declared_shape_does_not_make_a_reshape_a_noop():
    """Case 09's class without infer-shapes first: r is declared [3,2] (value_info) but Relu(x[2,3])
    computes [2,3], so Reshape(r, [3,2]) changes the shape and stays (ORT runs the original and
    returns y of shape [3,2])."""
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x) => (float[3,2] y) <float[3,2] r> {
            r = Relu (x)
            shp = Constant <value = int64[2] {3, 2}> ()
            y = Reshape (r, shp)
        }""", check=False)
    _, result, out = apply(proto, EliminateIdentity())
    assert result.stats["reshape"] == 0
    assert op_types(out) == ["Relu", "Constant", "Reshape"]
    assert_same_outputs(proto, out)


def test_true_noop_reshape_still_removed():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x) => (float[2,3] y) <float[2,3] r> {
            r = Relu (x)
            shp = Constant <value = int64[2] {2, -1}> ()
            s = Reshape (r, shp)
            y = Neg (s)
        }""")
    _, result, out = apply(proto, EliminateIdentity())
    assert result.stats["reshape"] == 1
    assert op_types(out) == ["Relu", "Constant", "Neg"]
    assert_same_outputs(proto, out)
