"""Example plugin (docs/writing-a-pass.md): Paddle's decomposed hard-swish -> x * HardSigmoid(x)."""

from passctl.passes.rewrite import MatchResult, RewriteRule, register_rule, register_rule_set


@register_rule
class DecomposedHardSwish(RewriteRule):
    """x * Clip(x + 3, 0, 6) / 6  ->  x * HardSigmoid(x, alpha=1/6, beta=0.5)  (ONNX op spec)."""

    name = "hardswish-to-hardsigmoid"
    commute = True  # also match Mul(Clip(...), x) and Add(3, x)

    def pattern(self, op, x):
        return op.Div(op.Mul(x, op.Clip(op.Add(x, 3.0), 0.0, 6.0)), 6.0)

    def check(self, context, x):
        add = next(n for n in context.nodes if n.op_type == "Add")
        three = add.inputs[1] if add.inputs[0] is x else add.inputs[0]
        if context.constant(three).dtype.kind != "f":
            return MatchResult().fail("x + 3 is not floating point; HardSigmoid takes floats", add)
        return MatchResult()

    def rewrite(self, op, x):
        return op.Mul(x, op.HardSigmoid(x, alpha=1 / 6, beta=0.5))


register_rule_set("fuse-hardswish", [DecomposedHardSwish],
                  "rewrite x * Clip(x + 3, 0, 6) / 6 into x * HardSigmoid(x)")
