"""Rewrite rules: pattern + check (never mutates, says why) + rewrite, as the onnxscript rewriter."""

from __future__ import annotations

import inspect
import itertools
import logging
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Iterator, List, Optional, Tuple, Union

from passctl.ir import Model, Node, Value
from passctl.passes.rewrite.context import MatchResult, RewriterBuilder, RuleContext, call_with_bindings
from passctl.passes.rewrite.matcher import Match, Matcher
from passctl.passes.rewrite.types import replacement_conflict
from passctl.passes.rewrite.pattern import (NodeOutput, NodePattern, OptionalPattern, OrPattern,
                                            PatternBuilder, ValuePattern, node_label, or_patterns,
                                            pattern_nodes)

logger = logging.getLogger(__name__)

# Scores of a match attempt, for the tracer: structural progress counts matched pattern ops (0..size);
# then these steps beyond a full structural match.
BLOCKED, CHECK_FAILED, APPLIED = 1, 2, 3


class RewriteRule:
    """Base class of rewrite rules.

    Subclasses set ``name`` (kebab-case) and implement:

    - ``pattern(self, op, x, w, ...)``: ops on the pattern builder; each parameter after ``op`` is a
      variable bound to the matched value of that name. Returns the root op's output(s), or an
      :func:`~passctl.passes.rewrite.pattern.Or` of root op outputs (one rule, several root ops).
      Besides variables: ``a | b`` alternatives, :func:`~passctl.passes.rewrite.pattern.Opt`
      optional inputs, ``_name="n"`` to receive the matched node, ``_other_inputs=True``.
    - ``check(self, context, **bindings) -> MatchResult`` (optional): must not mutate; fail with a
      reason. Bindings are the variables (``None`` for an omitted optional input; a variable of an
      alternative that did not match is absent), :class:`AttrVar` names, ``_name`` nodes and the
      labels of named alternatives. ``MatchResult(key=value)`` hands values on to ``rewrite``.
    - ``rewrite(self, op, **bindings)``: builds the replacement; returns the value(s) that replace
      the root op's outputs, in order. Gets the bindings and the check result's values.

    ``commute = True`` also tries swapped inputs of commutative ops (Add, Mul, ...).
    ``variant``: a format string over the bindings (``"layernorm-{square}"``) naming what a match
    counts as in the statistics (default: ``name``); :meth:`reported_name` may compute it instead.
    ``aliases``: other names ``get_rule`` / ``passctl explain`` accept for the rule (old names of
    variants folded into it); the names ``variant`` can produce are added by ``register_rule``.
    A match whose intermediate value (an output of a matched op other than the root) is used
    outside the match, or is a graph output, is blocked (the tracer records why).

    A rule may be a subclass (registered with ``@register_rule``) or an instance of a parametrized
    rule class (``pattern_1 = register_rule(AttentionPattern(...))``); calling an instance returns
    it, so the registry's entries are all used as ``entry()``.
    """

    # Class attributes of a subclass, or set per object in a parametrized rule's __init__.
    name: str = ""
    summary: str = ""
    commute: ClassVar[bool] = False
    variant: str = ""
    aliases: Tuple[str, ...] = ()

    def __init__(self):
        if not self.name:
            raise TypeError(f"{type(self).__qualname__} must set a rule name")
        op = PatternBuilder()
        params = list(inspect.signature(self.pattern).parameters)[1:]
        self.variables = {p: ValuePattern(p) for p in params}
        out = self.pattern(op, *self.variables.values())
        if isinstance(out, OrPattern):
            roots = _root_outputs(out)
            if roots is None:
                raise TypeError(f"rule '{self.name}': the alternatives of the pattern's root must be "
                                f"outputs of single-output ops, got {out!r}")
            self.root_pattern = out
            self.root: NodePattern = roots[0].node
            self._root_ops = tuple(dict.fromkeys((o.node.domain, o.node.op_type) for o in roots))
        else:
            outs = out if isinstance(out, tuple) else (out,)
            if not outs or not all(isinstance(o, NodeOutput) for o in outs):
                raise TypeError(f"rule '{self.name}': pattern() must return op outputs, got {out!r}")
            root = outs[0].node
            if any(o.node is not root for o in outs) or [o.index for o in outs] != list(range(len(outs))):
                raise TypeError(f"rule '{self.name}': the pattern must return the outputs of one root op, "
                                "in order")
            self.root = root
            self.root_pattern = root.outputs[0]
            self._root_ops = ((root.domain, root.op_type),)
        self.matcher = Matcher(self.root_pattern, commute=self.commute)

    def __call__(self) -> "RewriteRule":
        """The rule itself: instances stand in the registry where classes do (``entry()``)."""
        return self

    def pattern(self, op, *args):
        raise NotImplementedError

    def check(self, context: RuleContext, **bindings) -> Union[MatchResult, bool]:
        return MatchResult()

    def rewrite(self, op, **bindings):
        raise NotImplementedError

    def reported_name(self, bindings: Dict[str, Any]) -> str:
        """The name an application counts under in the statistics: ``variant`` formatted with the
        bindings (and the check result's values), else ``name``."""
        return self.variant.format_map(bindings) if self.variant else self.name

    def variant_names(self) -> List[str]:
        """Every name ``variant`` can produce from the labels of the named alternatives (empty
        without ``variant``, or when it also uses a value the check computes)."""
        if not self.variant:
            return []
        named = {}
        for o in or_patterns(self.root_pattern):
            if o.name:
                named.setdefault(o.name, o.labels)
        keys = list(named)
        out = []
        for combo in itertools.product(*(named[k] for k in keys)):
            try:
                out.append(self.variant.format_map(dict(zip(keys, combo))))
            except (KeyError, IndexError):
                return []
        return list(dict.fromkeys(out))

    @property
    def root_op(self) -> Tuple[str, str]:
        """``(domain, op_type)`` of the root op (the first alternative's with an Or at the root)."""
        return self._root_ops[0]

    @property
    def root_ops(self) -> Tuple[Tuple[str, str], ...]:
        """``(domain, op_type)`` of every op the pattern's root can be (one without alternatives)."""
        return self._root_ops

    def describe_pattern(self) -> str:
        """The pattern as text, e.g. ``Add(MatMul(%x, %w), %b)``; alternatives as ``(a | b)``, an
        optional input as ``%b?``, further inputs allowed as ``...``. An op the pattern reaches
        from several places is written out once, tagged ``Sub#1(...)``, then referred to as ``Sub#1``."""
        uses: Dict[int, int] = {}
        for n in pattern_nodes(self.root_pattern):
            for i in n.inputs:
                for o in _outputs_in(i):
                    uses[o.node.id] = uses.get(o.node.id, 0) + 1
        tags: Dict[int, str] = {}

        def fmt(x) -> str:
            if x is None:
                return "_"
            if isinstance(x, OrPattern):
                return "(" + " | ".join(fmt(a) for a in x.alternatives) + ")"
            if isinstance(x, OptionalPattern):
                return f"{fmt(x.inner)}?"
            if isinstance(x, NodeOutput):
                idx = f"[{x.index}]" if x.node.num_outputs > 1 else ""
                if x.node.id in tags:
                    return tags[x.node.id] + idx
                head = x.node.describe()
                if uses.get(x.node.id, 0) > 1:
                    tags[x.node.id] = head = f"{head}#{len(tags) + 1}"
                inner = ", ".join([fmt(i) for i in x.node.inputs] + (["..."] if x.node.other_inputs else []))
                attrs = "".join(f", {k}={v!r}" for k, v in x.node.attributes.items())
                return f"{head}({inner}{attrs}){idx}"
            return repr(x)

        return fmt(self.root_pattern)

    def attempts(self, node: Node, model: Optional[Model] = None
                 ) -> Iterator[Tuple[int, str, Optional[Node], Optional[Match], Dict[str, Any]]]:
        """Try the rule at ``node`` without mutating; yields ``(score, reason, node, match, bindings)``
        per attempt, the last one being the best failure when nothing succeeded. Score: matched
        pattern ops, or ``size + BLOCKED / CHECK_FAILED / APPLIED``.

        A match whose check passes is rewritten, not yet inserted: a replacement whose values differ
        in element type or static shape from the values they replace (inferred from the inputs,
        :func:`~passctl.passes.rewrite.types.replacement_conflict`) is refused, scored as a failed
        check with the reason starting ``replacement refused:``. Otherwise the bindings of the
        ``APPLIED`` attempt carry the built replacement, which :meth:`apply` inserts; when the
        caller goes on instead (``explain``), it is dropped and the model stays as it was."""
        size = self.matcher.size
        found = False
        self.matcher.opset = model.opset if model is not None and model.opset else _DEFAULT_OPSET
        for m in self.matcher.iter_matches(node):
            found = True
            matched = list(m.nodes.values())
            blocked = _extra_consumer(matched, node)
            bindings = m.bindings()
            if blocked is not None:
                yield size + BLOCKED, blocked[0], blocked[1], m, bindings
                continue
            ctx = RuleContext(model, node.graph, node, matched)
            res = call_with_bindings(self.check, ctx, bindings)
            if isinstance(res, MatchResult) and not res:
                yield size + CHECK_FAILED, f"check failed: {res.reason}", res.node, m, bindings
                continue
            if res is False:
                yield size + CHECK_FAILED, "check failed (no reason given)", None, m, bindings
                continue
            if isinstance(res, MatchResult) and res.values:
                bindings = {**bindings, **res.values}
            plan = self._build(node, m, bindings, model)
            if plan.refused:
                plan.op.discard()
                yield size + CHECK_FAILED, f"replacement refused: {plan.refused}", node, m, bindings
                continue
            try:
                yield size + APPLIED, "matches", None, m, {**bindings, _PLAN: plan}
            finally:
                if not plan.committed:
                    plan.op.discard()
            return
        if not found:
            best = self.matcher.best
            yield best.matched, best.reason, best.node, best.partial, {}

    def apply(self, node: Node, model: Optional[Model] = None, tracer=None) -> Optional["Replacement"]:
        """Match at ``node`` and, when the check passes and the replacement keeps the replaced
        values' types, rewrite. Returns what was replaced (None when the rule did not fire).
        Replacement goes through ``Graph.replace_nodes``, so each new node's provenance is the union
        of the replaced nodes'."""
        for score, reason, where, m, bindings in self.attempts(node, model):
            if tracer is not None:
                tracer.record(self, node, score, reason, where, m)
            if score == self.matcher.size + APPLIED:
                return self._commit(bindings[_PLAN])
        return None

    def _build(self, root: Node, m: Match, bindings: Dict[str, Any], model: Optional[Model]) -> "_Plan":
        """Run ``rewrite`` (nodes and constants collected, nothing inserted) and check the types."""
        graph = root.graph
        op = RewriterBuilder(graph)
        out = call_with_bindings(self.rewrite, op, bindings)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(outs) != len(root.outputs) or not all(isinstance(v, Value) for v in outs):
            op.discard()
            raise TypeError(f"rule '{self.name}': rewrite() must return {len(root.outputs)} Value(s) "
                            f"replacing the outputs of {root.op_type}, got {out!r}")
        old_nodes, between = _in_graph_order(list(m.nodes.values()), root)
        opset = model.opset if model is not None and model.opset else _DEFAULT_OPSET
        refused = replacement_conflict(old_nodes, op.nodes, list(root.outputs), outs, opset)
        return _Plan(root, op, outs, old_nodes, between, self.reported_name(bindings), refused)

    def _commit(self, plan: "_Plan") -> "Replacement":
        plan.committed = True
        new_nodes = plan.op.nodes
        # New nodes go before the first replaced node; a value they read that is defined between the
        # replaced nodes would then be read before its definition: the caller re-sorts the graph.
        needs_sort = any(v is not None and v.producer in plan.between for n in new_nodes for v in n.inputs)
        plan.op.commit()
        plan.root.graph.replace_nodes(plan.old_nodes, new_nodes, list(plan.root.outputs), plan.outs)
        return Replacement(plan.old_nodes, new_nodes, needs_sort, plan.name)

    def __repr__(self):
        return f"<rule {self.name}: {self.describe_pattern()}>"


def _extra_consumer(matched: List[Node], root: Node) -> Optional[Tuple[str, Node]]:
    inside = set(matched)
    for n in matched:
        if n is root:
            continue
        for v in n.outputs:
            if v.is_graph_output():
                return f"intermediate value '{v.name}' of {node_label(n)} is a graph output", n
            for user in v.consumers():
                if user not in inside:
                    return (f"intermediate value '{v.name}' of {node_label(n)} has another "
                            f"consumer outside the match: {node_label(user)}", user)
    return None


def _in_graph_order(nodes: List[Node], root: Node) -> Tuple[List[Node], set]:
    """``nodes`` in graph order, found by walking back from the root (the last of them), and the
    set of other nodes lying between them."""
    want, order, between, n = set(nodes), [], set(), root
    while n is not None and len(order) < len(want):
        if n in want:
            order.append(n)
        else:
            between.add(n)
        n = n.prev
    if len(order) < len(want):  # not in topological order: keep the match order, force a sort
        return nodes, set(root.graph) - want
    return order[::-1], between


def _outputs_in(pat) -> List[NodeOutput]:
    """The op outputs a pattern input refers to directly (through alternatives and Opt)."""
    if isinstance(pat, NodeOutput):
        return [pat]
    if isinstance(pat, OptionalPattern):
        return _outputs_in(pat.inner)
    if isinstance(pat, OrPattern):
        return [o for a in pat.alternatives for o in _outputs_in(a)]
    return []


def _root_outputs(pat) -> Optional[List[NodeOutput]]:
    """The op outputs an Or at a pattern's root can be (nested Ors flattened), or None when one of
    them is not the only output of an op."""
    if isinstance(pat, OrPattern):
        out: List[NodeOutput] = []
        for alt in pat.alternatives:
            sub = _root_outputs(alt)
            if sub is None:
                return None
            out.extend(sub)
        return out
    if isinstance(pat, NodeOutput) and pat.node.num_outputs == 1:
        return [pat]
    return None


_PLAN = "__passctl_replacement__"
_DEFAULT_OPSET = 21


@dataclass
class _Plan:
    """A replacement built by :meth:`RewriteRule._build`, not yet inserted."""

    root: Node
    op: RewriterBuilder
    outs: List[Value]
    old_nodes: List[Node]
    between: set
    name: str
    refused: Optional[str] = None
    committed: bool = False


@dataclass
class Replacement:
    """One application of a rule: the nodes replaced, the nodes created, whether a sort is needed,
    and the name it counts under (:meth:`RewriteRule.reported_name`)."""

    old_nodes: List[Node]
    new_nodes: List[Node]
    needs_sort: bool = False
    name: str = ""
