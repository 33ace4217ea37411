"""``explain``: the best partial match of a rewrite rule in a model and why it stopped."""

from __future__ import annotations

from typing import Optional, Type, Union

from passctl.ir import Model, Node
from passctl.passes.rewrite.pattern import node_label
from passctl.passes.rewrite.rule import APPLIED, BLOCKED, RewriteRule
from passctl.passes.rewrite.tracer import MatchTracer


def _label(node: Optional[Node]) -> str:
    return "?" if node is None else node_label(node)


def explain(rule: Union[str, RewriteRule, Type[RewriteRule]], model: Model, limit: int = 20) -> str:
    """Why ``rule`` does (not) fire in ``model``: for each node of the pattern's root op type, the
    best partial match and the reason it stopped. Never mutates the model.

    Args:
        rule: a registered rule name (or an alias: a variant's or former name), a rule class or
            a rule object.
        model: the model to inspect.
        limit: most anchors listed (the best first); the rest are counted.

    Returns:
        A multi-line report for people (the CLI's ``passctl explain RULE MODEL`` prints it).

    Raises:
        UserError: an unknown rule name (with the closest names).
    """
    asked = None
    if isinstance(rule, str):
        from passctl.passes.rewrite.ruleset import get_rule

        asked = rule
        rule = get_rule(rule)
    if isinstance(rule, type):
        rule = rule()
    tracer = MatchTracer()
    op_types = {op_type for _, op_type in rule.root_ops}
    op_type = " / ".join(dict.fromkeys(op_type for _, op_type in rule.root_ops))
    size = rule.matcher.size
    anchors = 0
    for g in model.graphs():
        for node in g:
            if node.op_type not in op_types:
                continue
            anchors += 1
            for score, reason, where, m, _ in rule.attempts(node, model):
                tracer.record(rule, node, score, reason, where, m)
    lines = [f"rule '{rule.name}': {rule.describe_pattern()}"]
    if asked is not None and asked != rule.name:
        lines.insert(0, f"'{asked}' is a variant (or former name) of rule '{rule.name}'")
    if not anchors:
        lines.append(f"no {op_type} node in the model, so the pattern's root op never appears")
        return "\n".join(lines)
    rows = tracer.entries(rule.name)
    fires = sum(1 for r in rows if r[0] == size + APPLIED)
    lines.append(f"{anchors} candidate {op_type} node(s); the rule would fire at {fires}")
    for score, reason, where, anchor, _ in rows[:limit]:
        if score == size + APPLIED:
            status = "fires"
        elif score >= size + BLOCKED:
            if score == size + BLOCKED:
                status = f"full pattern matched, blocked: {reason}"
            elif reason.startswith("replacement refused: "):
                status = f"full pattern matched, {reason}"
            else:
                status = f"full pattern matched, check failed: {reason.removeprefix('check failed: ')}"
        else:
            status = f"matched {score} of {size} pattern ops; stopped: {reason}"
        at = (f" [at {_label(where)}]" if where is not None and where is not anchor
              and _label(where) not in reason else "")
        lines.append(f"  at {_label(anchor)}: {status}{at}")
    if len(rows) > limit:
        lines.append(f"  ... {len(rows) - limit} more")
    return "\n".join(lines)


__all__ = ["explain"]
