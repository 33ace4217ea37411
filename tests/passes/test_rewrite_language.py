"""The rewrite language: alternatives, named bindings, optional and further inputs, attributes, check
results handed to rewrite, rule objects and aliases; every rewrite checked against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_same_outputs, parse

from passctl.ir import from_onnx, to_onnx
from passctl.passes.manager import PassManager
from passctl.passes.pipeline_text import build_pipeline
from passctl.passes.rewrite import (AttrVar, MatchResult, Opt, Or, RewriteRule, RuleSet, explain, get_rule,
                                    list_rules, register_rule)
from passctl.passes.rewrite import ruleset


def _run(proto, rules):
    """infer-shapes, then the rules as one pass; returns (IR model, the rule set's record, proto)."""
    model = from_onnx(proto)
    result = PassManager(build_pipeline("infer-shapes") + [RuleSet(rules)]).run(model)
    return model, result.records[-1], to_onnx(model)


def _ops(proto):
    return [n.op_type for n in proto.graph.node]


class SqrtOfSquare(RewriteRule):
    """Sqrt(x^2) -> Abs(x), the square written as Pow(x, 2) or Mul(x, x) (a named alternative)."""

    name = "sqrt-of-square"
    variant = "sqrt-of-square-{square}"
    seen = []

    def pattern(self, op, x):
        return op.Sqrt(Or(op.Pow(x, 2.0), op.Mul(x, x), name="square", labels=("pow", "mul")))

    def check(self, context, x, square):
        self.seen.append(square)
        return MatchResult()

    def rewrite(self, op, x, square):
        return op.Abs(x)


SQUARES = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[3,4] x, float[3,4] y) => (float[3,4] out) {
        two = Constant <value = float {2.0}> ()
        p = Pow (x, two)
        a = Sqrt (p)
        m = Mul (y, y)
        b = Sqrt (m)
        out = Add (a, b)
    }"""


def test_alternatives_match_either_form_and_count_per_label():
    SqrtOfSquare.seen = []
    proto = parse(SQUARES)
    _, record, out = _run(proto, [SqrtOfSquare()])
    assert record.stats == {"sqrt-of-square-pow": 1, "sqrt-of-square-mul": 1}
    assert SqrtOfSquare.seen == ["pow", "mul"]  # check received the label of the alternative
    assert _ops(out) == ["Constant", "Abs", "Abs", "Add"]
    assert_same_outputs(proto, out, seed=4)
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    y = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    import onnxruntime as ort
    got = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "y": y})[0]
    np.testing.assert_allclose(got, np.abs(x) + np.abs(y), rtol=1e-6)
    assert SqrtOfSquare().describe_pattern() == "Sqrt((Pow(%x, const(2.0)) | Mul(%x, %x)))"
    assert SqrtOfSquare().variant_names() == ["sqrt-of-square-pow", "sqrt-of-square-mul"]


def test_alternative_with_other_ops_does_not_match_and_explain_says_why():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[3,4] x) => (float[3,4] out) {
            m = Mul (x, x)
            e = Exp (m)
            out = Sqrt (e)
        }""")
    _, record, out = _run(proto, [SqrtOfSquare()])
    assert record.stats == {} and _ops(out) == ["Mul", "Exp", "Sqrt"]
    report = explain(SqrtOfSquare(), from_onnx(proto))
    assert "1 candidate Sqrt node(s); the rule would fire at 0" in report
    # the reason of the last alternative tried (both stopped one op deep)
    assert "matched 1 of 2 pattern ops; stopped: expected Mul, found Exp" in report


class ScaleByReciprocal(RewriteRule):
    """x / c or x * Reciprocal(c) -> Mul(x, 1/c) for a constant c: an Or at the pattern's root."""

    name = "scale-by-reciprocal"

    def pattern(self, op, x, c):
        return op.Div(x, c) | op.Mul(x, op.Reciprocal(c))

    def check(self, context, c):
        arr = context.constant(c)
        if arr is None:
            return MatchResult().fail(f"'{c.name}' is not a constant")
        return MatchResult(inverse=(1.0 / arr).astype(arr.dtype))

    def rewrite(self, op, x, inverse):
        return op.Mul(x, op.constant(inverse, "inverse"))


def test_or_at_the_root_is_tried_at_each_root_op_and_check_values_reach_rewrite():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x, float[3] d) => (float[2,3] out) {
            c = Constant <value = float[3] {2.0, 4.0, 0.5}> ()
            a = Div (x, c)
            r = Reciprocal (c)
            b = Mul (a, r)
            out = Div (b, d)
        }""")
    rule = ScaleByReciprocal()
    assert rule.root_ops == (("", "Div"), ("", "Mul"))
    report = explain(rule, from_onnx(proto))
    assert "3 candidate Div / Mul node(s); the rule would fire at 2" in report
    assert "check failed: 'd' is not a constant" in report
    _, record, out = _run(proto, [rule])
    assert record.stats == {"scale-by-reciprocal": 2}
    assert _ops(out).count("Reciprocal") == 0 and _ops(out).count("Div") == 1
    assert not hasattr(rule, "inverse")  # nothing kept on the rule between check and rewrite
    assert_same_outputs(proto, out, seed=2)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    d = np.array([1.0, -2.0, 3.0], np.float32)
    import onnxruntime as ort
    got = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "d": d})[0]
    c = np.array([2.0, 4.0, 0.5], np.float32)
    np.testing.assert_allclose(got, x / c / c / d, rtol=1e-6)


class SameActivation(RewriteRule):
    """Add(f(a), f(b)) with f Relu or Neg, both the same (two alternatives of one name)."""

    name = "same-activation"

    def pattern(self, op, a, b):
        return op.Add(Or(op.Relu(a), op.Neg(a), name="f", labels=("relu", "neg")),
                      Or(op.Relu(b), op.Neg(b), name="f", labels=("relu", "neg")))

    def rewrite(self, op, a, b, f):
        return op.Neg(op.Add(a, b)) if f == "neg" else op.Add(op.Relu(a), op.Relu(b))


def test_alternatives_of_one_name_choose_alike():
    mixed = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] a, float[4] b) => (float[4] out) { ra = Relu (a)  nb = Neg (b)  out = Add (ra, nb) }""")
    _, record, _ = _run(mixed, [SameActivation()])
    assert record.stats == {}
    both = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] a, float[4] b) => (float[4] out) { na = Neg (a)  nb = Neg (b)  out = Add (na, nb) }""")
    _, record, out = _run(both, [SameActivation()])
    assert record.stats == {"same-activation": 1} and _ops(out) == ["Add", "Neg"]
    assert_same_outputs(both, out, seed=9)


class ReluOfLeakyRelu(RewriteRule):
    """Relu(LeakyRelu(x)) -> Relu(x) when alpha >= 0: the LeakyRelu as a named node, its attribute
    read in check."""

    name = "relu-of-leaky-relu"

    def pattern(self, op, x):
        return op.Relu(op.LeakyRelu(x, _name="leaky"))

    def check(self, context, leaky):
        alpha = leaky.attr("alpha", 0.01)
        if alpha < 0:
            return MatchResult().fail(f"alpha {alpha} < 0: LeakyRelu flips negative values", leaky)
        return MatchResult()

    def rewrite(self, op, x, leaky):
        assert leaky.op_type == "LeakyRelu"
        return op.Relu(x)


@pytest.mark.parametrize("alpha,fires", [(0.2, True), (-0.5, False)])
def test_named_node_and_its_attributes(alpha, fires):
    proto = parse(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[8] x) => (float[8] out) {{ l = LeakyRelu <alpha = {alpha}> (x)  out = Relu (l) }}""")
    _, record, out = _run(proto, [ReluOfLeakyRelu()])
    assert record.stats == ({"relu-of-leaky-relu": 1} if fires else {})
    assert _ops(out) == (["Relu"] if fires else ["LeakyRelu", "Relu"])
    assert_same_outputs(proto, out, seed=5)
    if not fires:
        report = explain(ReluOfLeakyRelu(), from_onnx(proto))
        assert "check failed: alpha -0.5 < 0: LeakyRelu flips negative values [at LeakyRelu" in report


class ClipToMinMax(RewriteRule):
    """Clip(x[, lo][, hi]) -> Max / Min (both bounds optional inputs, bound to None when omitted)."""

    name = "clip-to-min-max"
    variant = "clip-to-min-max"

    def pattern(self, op, x, lo, hi):
        return op.Clip(x, Opt(lo), Opt(hi))

    def reported_name(self, bindings):
        return "clip-" + "-".join(k for k in ("lo", "hi") if bindings[k] is not None) if (
            bindings["lo"] is not None or bindings["hi"] is not None) else "clip-none"

    def rewrite(self, op, x, lo, hi):
        y = x if lo is None else op.Max(x, lo)
        y = y if hi is None else op.Min(y, hi)
        return op.Identity(y) if y is x else y


def test_optional_inputs_bind_none_when_omitted():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[6] x) => (float[6] out) {
            lo = Constant <value = float {-0.5}> ()
            hi = Constant <value = float {0.75}> ()
            a = Clip (x, lo, hi)
            b = Clip (a, lo)
            c = Clip (b, , hi)
            out = Clip (c)
        }""")
    model, record, out = _run(proto, [ClipToMinMax()])
    assert record.stats == {"clip-lo-hi": 1, "clip-lo": 1, "clip-hi": 1, "clip-none": 1}
    assert _ops(out) == ["Constant", "Constant", "Max", "Min", "Max", "Min", "Identity"]
    x = np.array([-2.0, -0.6, -0.1, 0.3, 0.8, 3.0], np.float32)
    assert_same_outputs(proto, out, inputs={"x": x})
    assert ClipToMinMax().describe_pattern() == "Clip(%x, %lo?, %hi?)"


class SumToAdds(RewriteRule):
    """Sum(a, b, ...) of two or more inputs -> a chain of Adds (further inputs allowed)."""

    name = "sum-to-adds"

    def pattern(self, op, a, b):
        return op.Sum(a, b, _other_inputs=True, _name="total")

    def rewrite(self, op, total, **_):
        acc = total.inputs[0]
        for v in total.inputs[1:]:
            acc = op.Add(acc, v)
        return acc


def test_other_inputs_are_allowed_but_not_fewer():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[5] a, float[5] b, float[5] c, float[5] d) => (float[5] out) {
            one = Sum (a)
            two = Sum (one, b)
            four = Sum (two, c, d, a)
            out = Neg (four)
        }""")
    report = explain(SumToAdds(), from_onnx(proto))
    assert "Sum <from Sum@0> has 1 inputs, the pattern's Sum has at least 2" in report
    assert "the rule would fire at 2" in report
    _, record, out = _run(proto, [SumToAdds()])
    assert record.stats == {"sum-to-adds": 2}
    assert _ops(out) == ["Sum", "Add", "Add", "Add", "Add", "Neg"]
    assert_same_outputs(proto, out, seed=7)
    assert SumToAdds().describe_pattern() == "Sum(%a, %b, ...)"


class TransposePair(RewriteRule):
    """Transpose(Transpose(x, p), q) -> one Transpose (the composed perm computed in check)."""

    name = "transpose-pair-composed"

    def pattern(self, op, x):
        return op.Transpose(op.Transpose(x, perm=AttrVar("p")), perm=AttrVar("q"))

    def check(self, context, p, q):
        if p is None or q is None:
            return MatchResult().fail("a Transpose without perm")
        return MatchResult(perm=[p[i] for i in q])

    def rewrite(self, op, x, perm, **_):
        return op.Transpose(x, perm=perm)


def test_check_result_values_reach_rewrite():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3,4] x) => (float[4,2,3] out) {
            t = Transpose <perm = [1, 2, 0]> (x)
            out = Transpose <perm = [1, 2, 0]> (t)
        }""")
    model, record, out = _run(proto, [TransposePair()])
    assert record.stats == {"transpose-pair-composed": 1}
    (node,) = list(model.graph)
    assert node.attr("perm") == (2, 0, 1)
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert_same_outputs(proto, out, inputs={"x": x})


def test_rule_objects_register_with_variant_aliases():
    rule = register_rule(SqrtOfSquare())
    assert rule() is rule  # registry entries are used as entry()
    assert get_rule("sqrt-of-square") is rule and get_rule("sqrt-of-square-mul") is rule
    assert rule in list_rules() and "sqrt-of-square-mul" not in {r.name for r in list_rules()}
    report = explain("sqrt-of-square-mul", from_onnx(parse(SQUARES)))
    assert report.splitlines()[0] == "'sqrt-of-square-mul' is a variant (or former name) of rule 'sqrt-of-square'"
    assert "the rule would fire at 2" in report

    class Other(SqrtOfSquare):
        pass

    with pytest.raises(ValueError, match="already registered"):
        register_rule(Other())


def test_bad_patterns_are_programmer_errors():
    class RootOfTwoOutputs(RewriteRule):
        name = "two-outputs-or"

        def pattern(self, op, x):
            return op.Split(x, _outputs=2)[0] | op.Relu(x)

    with pytest.raises(TypeError, match="outputs of single-output ops"):
        RootOfTwoOutputs()
    with pytest.raises(TypeError, match="two or more"):
        Or(1.0)
    with pytest.raises(TypeError, match="two or more"):
        Or(Opt(1.0), 2.0)
    with pytest.raises(TypeError, match="labels"):
        Or(1.0, 2.0, labels=("a",))


def test_former_rule_names_still_name_their_rules():
    from passctl.passes.fusion.fold_batchnorm import fold_conv_transpose_bn
    from passctl.passes.fusion.layernorm import LayerNormDecomposed, SkipLayerNorm

    assert get_rule("layernorm-pow-div-axes-attr") is LayerNormDecomposed
    assert get_rule("skip-layernorm-bias-3") is SkipLayerNorm
    assert get_rule("fold-conv-transpose-bias-bn") is fold_conv_transpose_bn
    for old in ("rmsnorm-mul-reciprocal-axes-input", "layernorm-scale", "rmsnorm-scale",
                "layernorm-from-onnx-no-bias", "gelu-erf-div-x-h", "gelu-tanh-cube-half-h",
                "hardswish-x-mul-clip-attrs", "conv-bias-add-relu", "conv-add-clip-attr",
                "gemm-transpose-b-bias", "squeeze-unsqueeze-attr-input", "fold-conv-bias-bn"):
        assert ruleset.resolve_rule_name(old) is not None, old


def test_every_attention_variant_is_a_named_module_level_rule():
    from pathlib import Path

    from passctl.passes.attention import patterns

    source = Path(patterns.__file__).read_text()
    assert len(patterns.PATTERNS) == 72
    for n, rule in enumerate(patterns.PATTERNS, start=1):
        assert getattr(patterns, f"pattern_{n}") is rule and get_rule(rule.name) is rule
        assert f'pattern_{n} = register_rule(AttentionPattern("{rule.name}"))' in source
        assert rule.name.startswith(f"attention-{n}-")


def test_no_generated_rule_classes_in_passes():
    from pathlib import Path

    import passctl.passes

    root = Path(passctl.passes.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert "globals()" not in text and 'type(f"' not in text, path


def test_graph_with_both_layernorm_forms_counts_each_variant():
    # Two decomposed LayerNorms in one graph, one per alternative of rule 1: each counts under the
    # former rule's name; ONNX Runtime agrees with the original after lowering.
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,8] x, float[2,8] z) => (float[2,8] y) {
            two = Constant <value = float {2.0}> ()
            e = Constant <value = float {1e-5}> ()
            m = ReduceMean <axes = [-1]> (x)
            d = Sub (x, m)
            p = Pow (d, two)
            v = ReduceMean <axes = [-1]> (p)
            ve = Add (v, e)
            s = Sqrt (ve)
            n1 = Div (d, s)
            m2 = ReduceMean <axes = [-1]> (z)
            d2 = Sub (z, m2)
            p2 = Mul (d2, d2)
            v2 = ReduceMean <axes = [-1]> (p2)
            ve2 = Add (v2, e)
            s2 = Sqrt (ve2)
            r2 = Reciprocal (s2)
            n2 = Mul (d2, r2)
            y = Add (n1, n2)
        }""")
    model = from_onnx(proto)
    result = PassManager(build_pipeline("infer-shapes,fuse-layernorm,lower-onnxruntime")).run(model)
    stats = result.records[1].stats
    assert stats["layernorm"] == 2
    assert stats["layernorm-pow-div-axes-attr"] == 1 and stats["layernorm-mul-reciprocal-axes-attr"] == 1
    out = to_onnx(model)
    # (the two Constants, now unused, are left for dce)
    assert _ops(out) == ["Constant", "Constant", "LayerNormalization", "LayerNormalization", "Add"]
    assert_same_outputs(proto, out, seed=6, rtol=1e-4)
