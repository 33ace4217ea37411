"""Example plugin (docs/writing-a-pass.md): x * Relu6(x + 3) / 6 -> x * HardSigmoid(x, 1/6, 0.5)."""

from passctl.passes.rewrite import MatchResult, RewriteRule, register_rule, register_rule_set


@register_rule
class DecomposedHardSwish(RewriteRule):
    name = "hardswish-to-hardsigmoid"
    commute = True  # also match Mul(Clip(...), x) and Add(3, x)

    def pattern(self, op, x):
        add = op.Add(x, 3.0, _name="add")  # check() receives the matched Add node as `add`
        return op.Div(op.Mul(x, op.Clip(add, 0.0, 6.0) | op.Min(op.Relu(add), 6.0)), 6.0)

    def check(self, context, x, add):
        three = context.constant(add.inputs[1] if add.inputs[0] is x else add.inputs[0])
        return MatchResult() if three.dtype.kind == "f" else MatchResult().fail("x + 3 is not floating point", add)

    def rewrite(self, op, x):
        return op.Mul(x, op.HardSigmoid(x, alpha=1 / 6, beta=0.5))


register_rule_set("fuse-hardswish", [DecomposedHardSwish],
                  "rewrite x * Clip(x + 3, 0, 6) / 6 into x * HardSigmoid(x)")
