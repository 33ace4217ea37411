"""The pattern matcher: structural matches of a pattern at a graph node, and why matching stopped."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

from passctl.ir import Node, Value
from passctl.passes.rewrite.pattern import (COMMUTATIVE_OPS, AttrVar, ConstantPattern,
                                            NodePattern, OptionalPattern, OrPattern, PatternInput,
                                            ValuePattern, callable_text, constant_close, constant_value,
                                            node_label, pattern_size)


@dataclass
class Match:
    """A structural match: pattern node id -> graph node, variable bindings, attribute bindings,
    and named bindings (``_name`` nodes, the labels of named alternatives)."""

    nodes: Dict[int, Node] = field(default_factory=dict)
    values: Dict[str, Optional[Value]] = field(default_factory=dict)
    attrs: Dict[str, Any] = field(default_factory=dict)
    named: Dict[str, Any] = field(default_factory=dict)

    def copy(self) -> "Match":
        return Match(dict(self.nodes), dict(self.values), dict(self.attrs), dict(self.named))

    def bindings(self) -> Dict[str, Any]:
        """Everything ``check`` and ``rewrite`` receive by name: variables, attributes, names."""
        out: Dict[str, Any] = dict(self.values)
        out.update(self.attrs)
        out.update(self.named)
        return out


@dataclass
class Failure:
    """Why matching stopped: how many pattern nodes matched, the reason, the graph node concerned."""

    matched: int
    reason: str
    node: Optional[Node] = None
    partial: Optional[Match] = None
    # A failure about the graph's values (a constant's shape), not about the pattern's structure:
    # a later structural failure at the same depth (the other operand order) does not replace it.
    sticky: bool = False


class Matcher:
    """Matches a pattern (its root: an op output, or an :class:`OrPattern` of op outputs) at a graph
    node, backtracking over alternatives and, when ``commute`` is set, over the input orders of
    commutative ops. Never mutates the graph. Alternatives sharing a name choose the same label
    (as variables of one name match one value).

    ``size`` is the most pattern ops a full match holds (:func:`pattern_size`).
    """

    def __init__(self, root: PatternInput, commute: bool = False):
        if isinstance(root, NodePattern):  # the root op itself (the API before alternatives)
            root = root.outputs[0]
        self.root = root
        self.commute = commute
        self.size = pattern_size(root)
        self.best = Failure(0, "not tried")
        # The default-domain opset of the model matched (for inferring a value's shape when a
        # check needs it); the rule sets it per attempt.
        self.opset = 21

    def iter_matches(self, node: Node) -> Iterator[Match]:
        """Every structural match of the pattern rooted at ``node`` (several only through
        alternatives and commuted inputs). After the generator ends, :attr:`best` holds the deepest
        failure seen."""
        self.best = Failure(0, "not tried", node)
        yield from self._root(self.root, node, Match())

    def match(self, node: Node) -> Tuple[Optional[Match], Failure]:
        """The first structural match at ``node`` and the best failure (``match`` None on failure)."""
        for m in self.iter_matches(node):
            return m, self.best
        return None, self.best

    def _root(self, pat: PatternInput, node: Node, m: Match):
        if isinstance(pat, OrPattern):
            for label, alt in pat.items():
                m2 = self._choose(pat, label, m)
                if m2 is not None:
                    yield from self._root(alt, node, m2)
        else:
            yield from self._node(pat.node, node, m)

    @staticmethod
    def _choose(pat: OrPattern, label, m: Match) -> Optional[Match]:
        """``m`` extended by choosing alternative ``label`` of ``pat``; None when ``pat``'s name is
        already bound to another label (two alternatives of one name choose alike)."""
        if pat.name and m.named.get(pat.name, label) != label:
            return None
        m2 = m.copy()
        if pat.name:
            m2.named[pat.name] = label
        return m2

    def _fail(self, m: Match, reason: str, node: Optional[Node], sticky: bool = False) -> None:
        n = len(m.nodes)
        if (n > self.best.matched or self.best.reason == "not tried"
                or (n == self.best.matched and (sticky or not self.best.sticky))):
            self.best = Failure(n, reason, node, m.copy(), sticky)

    def _keeps(self, m: Match) -> bool:
        """Whether a failure at ``m`` would become the best one (to skip formatting a reason)."""
        return len(m.nodes) >= self.best.matched or self.best.reason == "not tried"

    def _node(self, p: NodePattern, node: Node, m: Match):
        """Generate every extension of ``m`` in which ``p`` matches ``node``."""
        if p.id in m.nodes:
            if m.nodes[p.id] is node:
                yield m
            else:
                self._fail(m, f"{p.describe()} is reached twice but through different nodes", node)
            return
        if node in m.nodes.values():
            self._fail(m, f"{node_label(node)} would match two different pattern ops", node)
            return
        if node.op_type != p.op_type or node.domain not in ((p.domain,) if p.domain not in ("", "ai.onnx")
                                                             else ("", "ai.onnx")):
            if self._keeps(m):
                self._fail(m, f"expected {p.describe()}, found {node_label(node)}", node)
            return
        ins = list(node.inputs)
        while ins and ins[-1] is None:
            ins.pop()
        want = list(p.inputs)
        while want and want[-1] is None:
            want.pop()
        least = len(want)
        while least and isinstance(want[least - 1], OptionalPattern):
            least -= 1
        if not (least <= len(ins) and (len(ins) <= len(want) or p.other_inputs)):
            if least == len(want) and not p.other_inputs:
                count = f"{len(want)}"
            elif p.other_inputs:
                count = f"at least {least}"
            else:
                count = f"{least} to {len(want)}"
            self._fail(m, f"{node_label(node)} has {len(ins)} inputs, the pattern's {p.describe()} has "
                          f"{count}", node)
            return
        m = m.copy()
        for key, want_attr in p.attributes.items():
            got = node.attr(key)
            if isinstance(want_attr, AttrVar):
                got = want_attr.default if got is None else got
                if want_attr.check is not None and not want_attr.check(got):
                    wants = want_attr.describe or callable_text(want_attr.check)
                    self._fail(m, f"attribute {key}={got!r} of {node_label(node)} fails the "
                                  f"constraint (the pattern wants {wants})", node)
                    return
                if want_attr.name in m.attrs and m.attrs[want_attr.name] != got:
                    self._fail(m, f"attribute {key} of {node_label(node)} differs from the bound "
                                  f"'{want_attr.name}'", node)
                    return
                m.attrs[want_attr.name] = got
            elif got != want_attr and not (isinstance(want_attr, (list, tuple)) and got == tuple(want_attr)):
                self._fail(m, f"attribute {key} of {node_label(node)} is {got!r}, the pattern wants "
                              f"{want_attr!r}", node)
                return
        m.nodes[p.id] = node
        if p.bind:
            m.named[p.bind] = node
        if len(ins) < len(want):
            ins.extend([None] * (len(want) - len(ins)))
        orders = [want]
        if self.commute and p.op_type in COMMUTATIVE_OPS and len(want) == 2:
            orders.append([want[1], want[0]])
        for order in orders:
            yield from self._inputs(order, ins, 0, m, node)

    def _inputs(self, want: List[PatternInput], ins: List[Optional[Value]], i: int, m: Match, node: Node):
        if i == len(want):
            yield m
            return
        pat, val = want[i], ins[i]
        if pat is None:
            if val is None:
                yield from self._inputs(want, ins, i + 1, m, node)
            else:
                self._fail(m, f"input {i} of {node_label(node)} should be omitted", node)
            return
        if isinstance(pat, OptionalPattern):
            if val is None:
                m2 = m
                if isinstance(pat.inner, ValuePattern) and pat.inner.name not in m.values:
                    m2 = m.copy()
                    m2.values[pat.inner.name] = None
                yield from self._inputs(want, ins, i + 1, m2, node)
                return
            pat = pat.inner
        if val is None:
            self._fail(m, f"input {i} of {node_label(node)} is omitted", node)
            return
        for m2 in self._value(pat, val, i, m, node):
            yield from self._inputs(want, ins, i + 1, m2, node)

    def _value(self, pat: PatternInput, val: Value, i: int, m: Match, node: Node):
        """Every extension of ``m`` in which the (present) input ``i`` of ``node``, ``val``, matches
        ``pat``: a variable, a constant, an op output or alternatives."""
        if isinstance(pat, ValuePattern):
            bound = m.values.get(pat.name)
            if bound is not None and bound is not val:
                self._fail(m, f"'{pat.name}' is bound to '{bound.name}' but input {i} of {node_label(node)} "
                              f"is '{val.name}'", node)
                return
            m2 = m.copy()
            m2.values[pat.name] = val
            yield m2
        elif isinstance(pat, ConstantPattern):
            arr = constant_value(val)
            if arr is None:
                self._fail(m, f"input {i} of {node_label(node)} ('{val.name}') is not a constant", node)
                return
            if not constant_close(arr, pat.value, pat.rtol):
                self._fail(m, f"input {i} of {node_label(node)} is not the constant {pat.value.tolist()}", node)
                return
            why = _broadcasts_up(arr, pat, node, i, self.opset)
            if why is not None:
                self._fail(m, why, node, sticky=True)
                return
            yield m
        elif isinstance(pat, OrPattern):
            for label, alt in pat.items():
                m2 = self._choose(pat, label, m)
                if m2 is not None:
                    yield from self._value(alt, val, i, m2, node)
        else:
            producer = val.producer
            if producer is None or val.index != pat.index:
                if self._keeps(m):
                    what = "a graph input or initializer" if producer is None else f"output {val.index} of " \
                           f"{node_label(producer)}"
                    self._fail(m, f"input {i} of {node_label(node)} ('{val.name}') is {what}, the pattern "
                                  f"wants {pat.node.describe()}", node)
                return
            yield from self._node(pat.node, producer, m)


_BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Pow"})


def _broadcasts_up(arr, pat: ConstantPattern, node: Node, i: int, opset: int = 21) -> Optional[str]:
    """Why a constant matching a scalar pattern (``0.5``, ``3.0``...) is no scalar for the
    broadcasting op ``node``: its shape (``[1, 1, 8]`` of 0.5) would broadcast the other operand
    to another rank or size, which the fused op does not do; None when the constant has no axis
    the other operand lacks or has as 1 (proven from the other operand's shape; a constant of more
    than one element, or of rank > 1, next to an operand of unknown shape is not proven)."""
    if pat.value.size != 1 or arr.ndim == 0 or node.op_type not in _BROADCASTING or len(node.inputs) != 2:
        return None
    other = node.inputs[1 - i]
    shape = None if other is None else other.shape
    if shape is None and other is not None:  # infer it from its producers (bounded)
        from passctl.passes.rewrite.types import infer_upstream

        t = infer_upstream([other], opset, {}).get(id(other))
        shape = getattr(t, "shape", None)
    if shape is None:
        if arr.ndim <= 1 and arr.size == 1:
            return None
        return (f"input {i} of {node_label(node)} is the constant {pat.value.tolist()} of shape "
                f"{list(arr.shape)}, and the shape of '{other.name}' is unknown, so it may broadcast "
                "it to another shape (run infer-shapes first)")
    if arr.ndim > shape.rank:
        return (f"input {i} of {node_label(node)} is the constant {pat.value.tolist()} of shape "
                f"{list(arr.shape)}: it broadcasts '{other.name}' (rank {shape.rank}) up to rank "
                f"{arr.ndim}")
    for k, d in enumerate(arr.shape):
        have = shape.dims[shape.rank - arr.ndim + k]
        if d != 1 and have != d:
            return (f"input {i} of {node_label(node)} is the constant {pat.value.tolist()} of shape "
                    f"{list(arr.shape)}: axis {shape.rank - arr.ndim + k} of '{other.name}' is "
                    f"{'unknown' if not isinstance(have, int) else have}, not {d}, so the constant "
                    "may broadcast it")
    return None


__all__ = ["Failure", "Match", "Matcher"]
