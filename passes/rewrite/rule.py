"""Rewrite rules: pattern + check (never mutates, says why) + rewrite, as the onnxscript rewriter."""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Iterator, List, Optional, Tuple, Union

from passctl.ir import Builder, Graph, Model, Node, Value
from passctl.passes.rewrite.pattern import (Match, Matcher, NodeOutput, NodePattern, PatternBuilder,
                                            ValuePattern, constant_value, node_label)

logger = logging.getLogger(__name__)

# Scores of a match attempt, for the tracer: structural progress counts matched pattern ops (0..size);
# then these steps beyond a full structural match.
BLOCKED, CHECK_FAILED, APPLIED = 1, 2, 3


class MatchResult:
    """Outcome of a rule's ``check``: true on success; ``fail(reason, node)`` marks a failure.

    Example: ``return MatchResult().fail("weight of Conv must be a constant", node)``.
    """

    def __init__(self):
        self.success = True
        self.reason = ""
        self.node: Optional[Node] = None

    def fail(self, reason: str = "", node: Optional[Node] = None) -> "MatchResult":
        """Mark failure with a human-readable ``reason`` (and the node it concerns); returns self."""
        self.success, self.reason, self.node = False, reason, node
        return self

    def __bool__(self):
        return self.success

    def __repr__(self):
        return "MatchResult(ok)" if self.success else f"MatchResult(failed: {self.reason})"


@dataclass
class RuleContext:
    """What ``check`` sees besides the bindings: the model, graph, the matched root and nodes."""

    model: Optional[Model]
    graph: Graph
    root: Node
    nodes: List[Node]

    @staticmethod
    def constant(value: Optional[Value]):
        """The numpy array of a constant value (initializer or Constant node), else None."""
        return constant_value(value)


class RewriterBuilder:
    """The ``op`` given to ``rewrite``: ``op.Gemm(x, w, b, transB=1)``, ``op.constant(array)``.

    Keywords ``_domain`` and ``_outputs`` as in the pattern builder; other keywords are attributes.
    Nodes are collected, not inserted: the rule hands them to ``Graph.replace_nodes``.
    """

    def __init__(self, graph: Graph):
        self.builder = Builder(graph, insert=False)
        self.graph = graph

    def __getattr__(self, op_type: str):
        if op_type.startswith("_"):
            raise AttributeError(op_type)

        def make(*inputs, _domain: str = "", _outputs: int = 1, **attrs):
            return self.builder.op(op_type, *inputs, domain=_domain, outputs=_outputs, **attrs)

        return make

    def op(self, op_type: str, *inputs, _domain: str = "", _outputs: int = 1, **attrs):
        return self.builder.op(op_type, *inputs, domain=_domain, outputs=_outputs, **attrs)

    def constant(self, array, name: str = "") -> Value:
        """A new initializer holding ``array`` (numpy array or Tensor)."""
        return self.graph.add_constant(array, name)

    @property
    def nodes(self) -> List[Node]:
        return self.builder.nodes


def _call(fn, first, bindings: Dict[str, Any]):
    params = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return fn(first, **bindings)
    return fn(first, **{k: v for k, v in bindings.items() if k in params})


class RewriteRule:
    """Base class of rewrite rules.

    Subclasses set ``name`` (kebab-case) and implement:

    - ``pattern(self, op, x, w, ...)``: ops on the pattern builder; each parameter after ``op`` is a
      variable bound to the matched value of that name. Returns the root op's output(s).
    - ``check(self, context, **bindings) -> MatchResult`` (optional): must not mutate; fail with a
      reason. Bindings are the variables plus :class:`AttrVar` names.
    - ``rewrite(self, op, **bindings)``: builds the replacement; returns the value(s) that replace
      the root op's outputs, in order.

    ``commute = True`` also tries swapped inputs of commutative ops (Add, Mul, ...).
    A match whose intermediate value (an output of a matched op other than the root) is used
    outside the match, or is a graph output, is blocked (the tracer records why).
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    commute: ClassVar[bool] = False

    def __init__(self):
        if not self.name:
            raise TypeError(f"{type(self).__qualname__} must set a rule name")
        op = PatternBuilder()
        params = list(inspect.signature(self.pattern).parameters)[1:]
        self.variables = {p: ValuePattern(p) for p in params}
        out = self.pattern(op, *self.variables.values())
        outs = out if isinstance(out, tuple) else (out,)
        if not outs or not all(isinstance(o, NodeOutput) for o in outs):
            raise TypeError(f"rule '{self.name}': pattern() must return op outputs, got {out!r}")
        root = outs[0].node
        if any(o.node is not root for o in outs) or [o.index for o in outs] != list(range(len(outs))):
            raise TypeError(f"rule '{self.name}': the pattern must return the outputs of one root op, "
                            "in order")
        self.root: NodePattern = root
        self.matcher = Matcher(root, commute=self.commute)

    def pattern(self, op, *args):
        raise NotImplementedError

    def check(self, context: RuleContext, **bindings) -> Union[MatchResult, bool]:
        return MatchResult()

    def rewrite(self, op, **bindings):
        raise NotImplementedError

    @property
    def root_op(self) -> Tuple[str, str]:
        return self.root.domain, self.root.op_type

    def describe_pattern(self) -> str:
        """The pattern as text, e.g. ``Add(MatMul(%x, %w), %b)``."""

        def fmt(x) -> str:
            if x is None:
                return "_"
            if isinstance(x, NodeOutput):
                inner = ", ".join(fmt(i) for i in x.node.inputs)
                attrs = "".join(f", {k}={v!r}" for k, v in x.node.attributes.items())
                idx = f"[{x.index}]" if x.node.num_outputs > 1 else ""
                return f"{x.node.describe()}({inner}{attrs}){idx}"
            return repr(x)

        return fmt(self.root.outputs[0])

    def attempts(self, node: Node, model: Optional[Model] = None
                 ) -> Iterator[Tuple[int, str, Optional[Node], Optional[Match], Dict[str, Any]]]:
        """Try the rule at ``node`` without mutating; yields ``(score, reason, node, match, bindings)``
        per attempt, the last one being the best failure when nothing succeeded. Score: matched
        pattern ops, or ``size + BLOCKED / CHECK_FAILED / APPLIED``."""
        size = self.matcher.size
        found = False
        for m in self.matcher.iter_matches(node):
            found = True
            matched = list(m.nodes.values())
            blocked = _extra_consumer(matched, node)
            bindings = dict(m.values)
            bindings.update(m.attrs)
            if blocked is not None:
                yield size + BLOCKED, blocked[0], blocked[1], m, bindings
                continue
            ctx = RuleContext(model, node.graph, node, matched)
            res = _call(self.check, ctx, bindings)
            if isinstance(res, MatchResult) and not res:
                yield size + CHECK_FAILED, f"check failed: {res.reason}", res.node, m, bindings
                continue
            if res is False:
                yield size + CHECK_FAILED, "check failed (no reason given)", None, m, bindings
                continue
            yield size + APPLIED, "matches", None, m, bindings
            return
        if not found:
            best = self.matcher.best
            yield best.matched, best.reason, best.node, best.partial, {}

    def apply(self, node: Node, model: Optional[Model] = None, tracer=None) -> Optional["Replacement"]:
        """Match at ``node`` and, when the check passes, rewrite. Returns what was replaced (None when
        the rule did not fire). Replacement goes through ``Graph.replace_nodes``, so each new node's
        provenance is the union of the replaced nodes'."""
        for score, reason, where, m, bindings in self.attempts(node, model):
            if tracer is not None:
                tracer.record(self, node, score, reason, where, m)
            if score == self.matcher.size + APPLIED:
                return self._replace(node, m, bindings)
        return None

    def _replace(self, root: Node, m: Match, bindings: Dict[str, Any]) -> "Replacement":
        graph = root.graph
        op = RewriterBuilder(graph)
        out = _call(self.rewrite, op, bindings)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(outs) != len(root.outputs) or not all(isinstance(v, Value) for v in outs):
            raise TypeError(f"rule '{self.name}': rewrite() must return {len(root.outputs)} Value(s) "
                            f"replacing the outputs of {root.op_type}, got {out!r}")
        new_nodes = op.nodes
        created = {id(o) for n in new_nodes for o in n.outputs}
        for old, new in zip(root.outputs, outs):
            if id(new) in created and new.type is None:
                new.type = old.type
        old_nodes, between = _in_graph_order(list(m.nodes.values()), root)
        # New nodes go before the first replaced node; a value they read that is defined between the
        # replaced nodes would then be read before its definition: the caller re-sorts the graph.
        needs_sort = any(v is not None and v.producer in between for n in new_nodes for v in n.inputs)
        graph.replace_nodes(old_nodes, new_nodes, list(root.outputs), outs)
        return Replacement(old_nodes, new_nodes, needs_sort)

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


@dataclass
class Replacement:
    """One application of a rule: the nodes replaced, the nodes created, whether a sort is needed."""

    old_nodes: List[Node]
    new_nodes: List[Node]
    needs_sort: bool = False
