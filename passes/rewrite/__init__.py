"""Rewrite rules: patterns as op calls, check with reasons, rewrite; rule sets as passes; explain."""

from passctl.passes.rewrite.pattern import AttrVar, ConstantPattern, PatternBuilder, constant_value
from passctl.passes.rewrite.rule import MatchResult, Replacement, RewriteRule, RuleContext
from passctl.passes.rewrite.ruleset import (RuleSet, get_rule, list_rules, register_rule,
                                            register_rule_set)
from passctl.passes.rewrite.explain import explain
from passctl.passes.rewrite.tracer import MatchTracer


__all__ = ["AttrVar", "ConstantPattern", "MatchResult", "MatchTracer", "PatternBuilder", "Replacement",
           "RewriteRule", "RuleContext", "RuleSet", "constant_value", "explain",
           "get_rule", "list_rules", "register_rule", "register_rule_set"]
