"""Rewrite rules: op-call patterns (alternatives, optional inputs, named nodes), checks, rewrites, rule sets."""

from passctl.passes.rewrite.pattern import AttrVar, ConstantPattern, Opt, Or, PatternBuilder, constant_value
from passctl.passes.rewrite.context import MatchResult, RuleContext
from passctl.passes.rewrite.rule import Replacement, RewriteRule
from passctl.passes.rewrite.ruleset import (RuleSet, get_rule, list_rules, register_rule,
                                            register_rule_set)
from passctl.passes.rewrite.explain import explain
from passctl.passes.rewrite.tracer import MatchTracer


__all__ = ["AttrVar", "ConstantPattern", "MatchResult", "MatchTracer", "Opt", "Or", "PatternBuilder",
           "Replacement",
           "RewriteRule", "RuleContext", "RuleSet", "constant_value", "explain",
           "get_rule", "list_rules", "register_rule", "register_rule_set"]
