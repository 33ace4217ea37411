"""A ``--load`` plugin with a rewrite rule that is wrong on purpose (for the compare/bisect tests):
``LayerNormalization(x, s, b, epsilon=e)`` -> ``LayerNormalization(x, s, b)``, which drops the
model's epsilon, so the ONNX default 1e-5 applies instead."""

from passctl.passes.rewrite import AttrVar, RewriteRule
from passctl.passes.rewrite.ruleset import register_rule, register_rule_set


@register_rule
class DropLayerNormEpsilon(RewriteRule):
    name = "drop-layernorm-epsilon"
    summary = "LayerNormalization(epsilon=e) -> LayerNormalization() (WRONG: drops epsilon)"

    def pattern(self, op, x, scale, bias):
        return op.LayerNormalization(x, scale, bias, axis=AttrVar("axis", default=-1),
                                     epsilon=AttrVar("epsilon", default=1e-5))

    def check(self, context, x, scale, bias, axis, epsilon):
        return abs(epsilon - 1e-5) > 1e-9  # (an already rewritten node does not match again)

    def rewrite(self, op, x, scale, bias, axis, epsilon):
        return op.LayerNormalization(x, scale, bias, axis=axis)


register_rule_set("wrong-layernorm", ["drop-layernorm-epsilon"],
                  "a rule set that is wrong on purpose (tests of passctl bisect)")
