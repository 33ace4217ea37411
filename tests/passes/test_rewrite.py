"""Rewrite rules: counts, numerics vs ONNX Runtime, check reasons, blocking consumers, explain."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
from helpers import assert_same_outputs, parse

from passctl.ir import from_onnx, to_onnx
from passctl.ir.errors import UserError
from passctl.passes.manager import PassManager
from passctl.passes.pipeline_text import build_pipeline
from passctl.passes.rewrite import (AttrVar, MatchResult, MatchTracer, RewriteRule, RuleSet, explain,
                                    get_rule, register_rule, register_rule_set)


class MatMulAddToGemm(RewriteRule):
    """Add(MatMul(x, w), b) -> Gemm(x, w, b) for a rank-2 x and a constant rank-2 w."""

    name = "matmul-add-to-gemm"

    def pattern(self, op, x, w, b):
        return op.Add(op.MatMul(x, w), b)

    def check(self, context, x, w, b):
        if x.shape is None or x.shape.rank != 2:
            return MatchResult().fail(f"input '{x.name}' of MatMul must have rank 2", context.root)
        if context.constant(w) is None:
            return MatchResult().fail("weight of MatMul must be a constant", w.producer)
        return MatchResult()

    def rewrite(self, op, x, w, b):
        return op.Gemm(x, w, b)


class CommutedGemm(MatMulAddToGemm):
    name = "matmul-add-to-gemm-commuted"
    commute = True


class MulByOne(RewriteRule):
    """Mul(x, 1) -> x (a constant pattern; the rewrite builds no node)."""

    name = "mul-by-one"
    commute = True

    def pattern(self, op, x):
        return op.Mul(x, 1.0)

    def rewrite(self, op, x):
        return x


class TransposeTwice(RewriteRule):
    """Transpose(Transpose(x, perm=p), perm=q) -> x when q undoes p (attribute variables)."""

    name = "transpose-twice"

    def pattern(self, op, x):
        return op.Transpose(op.Transpose(x, perm=AttrVar("p")), perm=AttrVar("q"))

    def check(self, context, p, q, **_):
        if p is None or q is None or [p[i] for i in q] != list(range(len(p))):
            return MatchResult().fail(f"perm {q} does not undo perm {p}")
        return MatchResult()

    def rewrite(self, op, x, **_):
        return op.Identity(x)


def _linear_model(w_as_input=False, extra_consumer=False, swapped=False, n=2):
    """n blocks y_i = Add(MatMul(h, W_i), B_i) chained through Relu."""
    rng = np.random.default_rng(7)
    lines, inits, h = [], [], "x"
    sig_inputs = ["float[4,8] x"]
    for i in range(n):
        w_name = f"W{i}"
        if w_as_input:
            sig_inputs.append(f"float[8,8] {w_name}")
        else:
            inits.append(onnx.numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), w_name))
        inits.append(onnx.numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), f"B{i}"))
        add = f"Add (B{i}, m{i})" if swapped else f"Add (m{i}, B{i})"
        lines += [f"m{i} = MatMul ({h}, {w_name})", f"a{i} = {add}", f"r{i} = Relu (a{i})"]
        h = f"r{i}"
    outputs = [f"float[4,8] {h}"]
    if extra_consumer:
        lines.append("side = Neg (m0)")
        outputs.append("float[4,8] side")
    text = (f'<ir_version: 8, opset_import: ["" : 17]>\n'
            f'g ({", ".join(sig_inputs)}) => ({", ".join(outputs)}) {{\n  ' + "\n  ".join(lines) + "\n}")
    proto = onnx.parser.parse_model(text)
    proto.graph.initializer.extend(inits)
    onnx.checker.check_model(proto, full_check=True)
    return proto


def _run(proto, rules):
    """infer-shapes (the Gemm rule checks ranks), then the rules as one pass."""
    model = from_onnx(proto)
    result = PassManager(build_pipeline("infer-shapes") + [RuleSet(rules)]).run(model)
    return model, result.records[-1], to_onnx(model)


def test_rule_fires_with_counts_and_same_numerics():
    proto = _linear_model(n=2)
    model, record, out = _run(proto, [MatMulAddToGemm()])
    assert record.modified and record.stats == {"matmul-add-to-gemm": 2}
    assert [n.op_type for n in out.graph.node] == ["Gemm", "Relu", "Gemm", "Relu"]
    assert_same_outputs(proto, out, seed=11)
    # Provenance of each Gemm is the union of the MatMul and Add it replaced (source names).
    gemms = [n for n in model.graph if n.op_type == "Gemm"]
    assert [tuple(sorted(g.provenance)) for g in gemms] == [
        tuple(sorted(("MatMul@0", "Add@1"))), tuple(sorted(("MatMul@3", "Add@4")))]


def test_commute_option():
    proto = _linear_model(swapped=True)
    _, record, _ = _run(proto, [MatMulAddToGemm()])
    assert not record.modified and record.stats == {}
    _, record, out = _run(proto, [CommutedGemm()])
    assert record.stats == {"matmul-add-to-gemm-commuted": 2}
    assert_same_outputs(proto, out, seed=3)


def test_check_failure_reason_is_reported_and_nothing_changes():
    proto = _linear_model(w_as_input=True, n=1)
    tracer = MatchTracer()
    model = from_onnx(proto)
    result = RuleSet([MatMulAddToGemm()], tracer=tracer)(model)
    assert not result.modified
    [(score, reason, node, anchor, _)] = tracer.entries("matmul-add-to-gemm")
    assert reason == "check failed: weight of MatMul must be a constant"
    assert anchor.op_type == "Add" and node is None  # W0 is a graph input: no producer node
    assert [n.op_type for n in model.graph] == ["MatMul", "Add", "Relu"]


def test_check_never_mutates_and_bool_results_work():
    class Refuses(MatMulAddToGemm):
        name = "refuses"

        def check(self, context, **_):
            return False

    proto = _linear_model(n=1)
    model = from_onnx(proto)
    assert not RuleSet([Refuses()])(model).modified
    assert_same_outputs(proto, to_onnx(model))
    assert "check failed (no reason given)" in explain(Refuses(), model)


def test_intermediate_value_with_outside_consumer_blocks_the_rewrite():
    proto = _linear_model(extra_consumer=True, n=2)
    model, record, out = _run(proto, [MatMulAddToGemm()])
    # The first block's MatMul output also feeds Neg: blocked. The second block fires.
    assert record.stats == {"matmul-add-to-gemm": 1}
    assert [n.op_type for n in out.graph.node] == ["MatMul", "Add", "Relu", "Gemm", "Relu", "Neg"]
    assert_same_outputs(proto, out, seed=5)
    report = explain(MatMulAddToGemm(), model)
    assert ("at Add <from Add@1>: full pattern matched, blocked: intermediate value 'm0' of MatMul "
            "<from MatMul@0> has another consumer outside the match: Neg <from Neg@6>") in report


def test_constant_pattern_and_rewrite_to_existing_value():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[3] x) => (float[3] y, float[3] z) {
            one = Constant <value = float {1.0}> ()
            two = Constant <value = float {2.0}> ()
            a = Mul (x, one)
            b = Mul (one, a)
            y = Relu (b)
            z = Mul (x, two)
        }""")
    model, record, out = _run(proto, [MulByOne()])
    assert record.stats == {"mul-by-one": 2}
    assert [n.op_type for n in out.graph.node if n.op_type != "Constant"] == ["Relu", "Mul"]
    assert_same_outputs(proto, out)


def test_attribute_variables_and_constraints():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3,4] x) => (float[2,3,4] y, float[3,2,4] z) {
            t = Transpose <perm = [2, 0, 1]> (x)
            y = Transpose <perm = [1, 2, 0]> (t)
            u = Transpose <perm = [1, 0, 2]> (x)
            v = Transpose <perm = [1, 0, 2]> (u)
            z = Transpose <perm = [1, 0, 2]> (v)
        }""")
    model, record, out = _run(proto, [TransposeTwice()])
    # y's pair undoes itself; in z's chain the first matching pair (u, v) is replaced.
    assert record.stats == {"transpose-twice": 2}
    assert_same_outputs(proto, out)
    report = explain(TransposeTwice(), from_onnx(parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3,4] x) => (float[4,3,2] y) {
            t = Transpose <perm = [2, 0, 1]> (x)
            y = Transpose <perm = [0, 2, 1]> (t)
        }""")))
    assert "check failed: perm (0, 2, 1) does not undo perm (2, 0, 1)" in report


def test_literal_attribute_constraint():
    class OnlyPerm10(RewriteRule):
        name = "only-perm-10"

        def pattern(self, op, x):
            return op.Transpose(x, perm=[1, 0])

        def rewrite(self, op, x):
            return op.Transpose(x, perm=[1, 0], _outputs=1)

    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x) => (float[3,2] y, float[2,3] z) {
            y = Transpose <perm = [1, 0]> (x)
            z = Transpose <perm = [0, 1]> (x)
        }""")
    rule = OnlyPerm10()
    model = from_onnx(proto)
    report = explain(rule, model)
    assert "the rule would fire at 1" in report
    assert "attribute perm of Transpose" in report and "is (0, 1), the pattern wants [1, 0]" in report


def test_explain_reports_best_partial_match():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4,8] x, float[8] b) => (float[4,8] y, float[4,8] z) {
            r = Relu (x)
            y = Add (r, b)
            z = Add (x, b)
        }""")
    model = from_onnx(proto)
    report = explain(MatMulAddToGemm(), model)
    lines = report.splitlines()
    assert lines[0] == "rule 'matmul-add-to-gemm': Add(MatMul(%x, %w), %b)"
    assert lines[1] == "2 candidate Add node(s); the rule would fire at 0"
    assert sorted(lines[2:]) == [
        "  at Add <from Add@1>: matched 1 of 2 pattern ops; stopped: expected MatMul, found Relu "
        "<from Relu@0>",
        "  at Add <from Add@2>: matched 1 of 2 pattern ops; stopped: input 0 of Add <from Add@2> ('x') "
        "is a graph input or initializer, the pattern wants MatMul"]
    # explain never mutates
    assert [n.op_type for n in model.graph] == ["Relu", "Add", "Add"]
    no_anchor = explain(MatMulAddToGemm(), from_onnx(parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2] x) => (float[2] y) { y = Relu (x) }""")))
    assert "no Add node in the model" in no_anchor


def test_registered_rule_set_runs_as_a_pass_from_pipeline_text():
    register_rule(MatMulAddToGemm)
    assert get_rule("matmul-add-to-gemm") is MatMulAddToGemm
    with pytest.raises(UserError, match="did you mean 'matmul-add-to-gemm'"):
        get_rule("matmul-add-to-gem")
    register_rule_set("test-gemm-fusion", ["matmul-add-to-gemm"], "MatMul+Add into Gemm")
    proto = _linear_model(n=3)
    model = from_onnx(proto)
    result = PassManager(build_pipeline("infer-shapes,test-gemm-fusion{max_sweeps=2},dce")).run(model)
    assert result.records[1].name == "test-gemm-fusion"
    assert result.records[1].stats == {"matmul-add-to-gemm": 3}
    assert_same_outputs(proto, to_onnx(model), seed=2)
    assert "fires" in explain("matmul-add-to-gemm", from_onnx(proto))


def test_rewrite_reading_a_value_defined_between_matched_nodes_resorts():
    # b is computed after the MatMul but before the Add: the Gemm (inserted where the MatMul was)
    # would read b before its definition unless the graph is re-sorted.
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4,8] x, float[8] c) => (float[4,8] y) {
            w = Constant <value = float[8,8] {""" + ",".join(["0.5"] * 64) + """}> ()
            m = MatMul (x, w)
            b = Neg (c)
            y = Add (m, b)
        }""")
    model, record, out = _run(proto, [MatMulAddToGemm()])
    assert record.stats == {"matmul-add-to-gemm": 1}
    ops = [n.op_type for n in out.graph.node]
    assert ops.index("Neg") < ops.index("Gemm")
    assert_same_outputs(proto, out)


def test_bad_rules_are_programmer_errors():
    class NoName(RewriteRule):
        def pattern(self, op, x):
            return op.Relu(x)

    with pytest.raises(TypeError, match="must set a rule name"):
        NoName()

    class NotOps(RewriteRule):
        name = "not-ops"

        def pattern(self, op, x):
            return x

    with pytest.raises(TypeError, match="pattern\\(\\) must return op outputs"):
        NotOps()
