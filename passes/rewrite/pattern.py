"""Patterns written as ordinary op calls (``op.Add(op.MatMul(x, w), b)``) and the matcher."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from passctl.ir import Node, Value

# Binary ops whose two inputs may be swapped (ONNX op spec: Add, Mul, ... are commutative).
COMMUTATIVE_OPS = frozenset({"Add", "Mul", "And", "Or", "Xor", "Equal", "Max", "Min", "Sum", "Mean"})


class ValuePattern:
    """A pattern variable: matches any value and binds it under ``name`` (same name, same value)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"%{self.name}"


@dataclass
class AttrVar:
    """An attribute constraint: binds the attribute's value under ``name`` (``None`` when absent,
    unless ``default`` is given) and, with ``check``, requires ``check(value)`` to be true.

    ``describe`` says in words what ``check`` accepts (``"absent"``, ``"0 or absent"``); pattern
    descriptions (``passctl explain``, ``list-rules``) print it instead of Python source.
    """

    name: str
    check: Optional[Callable[[Any], bool]] = None
    default: Any = None
    describe: Optional[str] = None

    def __repr__(self):
        """``?name``, ``?name=default``, ``?name if <what check accepts>``."""
        text = f"?{self.name}"
        if self.default is not None:
            text += f"={self.default!r}"
        if self.check is not None:
            text += f" if {self.describe or callable_text(self.check)}"
        return text


def callable_text(fn: Callable) -> str:
    """Readable name of a check function without a description: its ``__name__`` (e.g.
    ``is_positive``), or ``<predicate>`` for a lambda (Python source is not shown to users)."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return "<predicate>" if name == "<lambda>" else name


def dtype_rtol(dtype) -> float:
    """The relative rounding error of storing a real number in ``dtype``: half its machine epsilon
    (2^-11 for float16, 2^-8 for bfloat16, 2^-24 for float32); 0 for non-float dtypes."""
    try:
        return float(np.finfo(dtype).eps) / 2
    except (TypeError, ValueError):
        try:
            import ml_dtypes

            return float(ml_dtypes.finfo(dtype).eps) / 2
        except (ImportError, TypeError, ValueError):
            return 0.0


def constant_close(arr: np.ndarray, value, rtol: float) -> bool:
    """Whether every element of the constant ``arr`` equals ``value`` (numpy broadcasting) within
    ``rtol`` relative, or, with ``rtol > 0``, within the rounding of ``arr``'s own dtype when that
    is coarser (:func:`dtype_rtol`); ``rtol == 0`` asks for equality. False for an empty or
    non-numeric ``arr``."""
    try:
        tol = max(rtol, dtype_rtol(arr.dtype)) if rtol > 0 else 0.0
        return arr.size > 0 and bool(np.all(np.isclose(
            arr.astype(np.float64), np.asarray(value, dtype=np.float64), rtol=tol, atol=0.0)))
    except (TypeError, ValueError):
        return False


class ConstantPattern:
    """Matches a constant (initializer or ``Constant`` node output) equal to ``value`` within
    ``rtol`` (numpy broadcasting: a scalar matches a tensor whose elements all equal it). With
    ``rtol > 0`` the tolerance is at least the rounding of the constant's own floating dtype
    (:func:`dtype_rtol`: an fp16 sqrt(2) is 1.4140625, 1.1e-4 off)."""

    def __init__(self, value, rtol: float = 0.0):
        self.value = np.asarray(value)
        self.rtol = rtol

    def __repr__(self):
        return f"const({self.value.tolist()})"


class NodeOutput:
    """Output ``index`` of a :class:`NodePattern`."""

    def __init__(self, node: "NodePattern", index: int):
        self.node, self.index = node, index

    def __repr__(self):
        return f"{self.node.op_type}#{self.node.id}[{self.index}]"


PatternInput = Union[ValuePattern, NodeOutput, ConstantPattern, None]


@dataclass(eq=False)
class NodePattern:
    """One op of a pattern: op type, domain, input patterns and attribute constraints."""

    op_type: str
    domain: str
    inputs: List[PatternInput]
    attributes: Dict[str, Any]
    num_outputs: int
    id: int
    outputs: List[NodeOutput] = field(default_factory=list)

    def describe(self) -> str:
        return f"{self.op_type}" if self.domain in ("", "ai.onnx") else f"{self.domain}::{self.op_type}"


class PatternBuilder:
    """The ``op`` given to a rule's ``pattern``: ``op.Conv(x, w, group=AttrVar("g"))``.

    Special keywords: ``_domain`` (operator domain), ``_outputs`` (number of outputs; a tuple is
    returned when > 1). Other keywords are attribute constraints: a plain value must equal the
    node's attribute, an :class:`AttrVar` binds it. Python numbers as inputs become
    :class:`ConstantPattern`.
    """

    def __init__(self):
        self.nodes: List[NodePattern] = []

    def __getattr__(self, op_type: str):
        if op_type.startswith("_"):
            raise AttributeError(op_type)

        def make(*inputs, _domain: str = "", _outputs: int = 1, **attributes):
            return self.op(op_type, *inputs, _domain=_domain, _outputs=_outputs, **attributes)

        return make

    def op(self, op_type: str, *inputs, _domain: str = "", _outputs: int = 1, **attributes):
        ins: List[PatternInput] = []
        for x in inputs:
            if isinstance(x, (int, float, np.ndarray, list)) and not isinstance(x, bool):
                x = ConstantPattern(x)
            if x is not None and not isinstance(x, (ValuePattern, NodeOutput, ConstantPattern)):
                raise TypeError(f"pattern {op_type}: unsupported input {x!r}")
            ins.append(x)
        node = NodePattern(op_type, _domain, ins, dict(attributes), _outputs, len(self.nodes))
        node.outputs = [NodeOutput(node, i) for i in range(_outputs)]
        self.nodes.append(node)
        return node.outputs[0] if _outputs == 1 else tuple(node.outputs)


@dataclass
class Match:
    """A structural match: pattern node id -> graph node, variable bindings, attribute bindings."""

    nodes: Dict[int, Node] = field(default_factory=dict)
    values: Dict[str, Value] = field(default_factory=dict)
    attrs: Dict[str, Any] = field(default_factory=dict)

    def copy(self) -> "Match":
        return Match(dict(self.nodes), dict(self.values), dict(self.attrs))


@dataclass
class Failure:
    """Why matching stopped: how many pattern nodes matched, the reason, the graph node concerned."""

    matched: int
    reason: str
    node: Optional[Node] = None
    partial: Optional[Match] = None


def constant_value(v: Optional[Value]) -> Optional[np.ndarray]:
    """The constant array of ``v`` (initializer, or output of a ``Constant`` node with ``value``)."""
    if v is None:
        return None
    if v.const is not None and (v.is_initializer() or v.producer is None):
        # An initializer that is also a graph input can be overridden at run time: not a constant.
        if v.is_graph_input():
            return None
        return v.const.numpy()
    p = v.producer
    if p is not None and p.op_type == "Constant" and p.domain in ("", "ai.onnx"):
        t = p.attr("value")
        if t is not None and hasattr(t, "numpy"):
            return t.numpy()
        for name in ("value_float", "value_int"):
            if name in p.attributes:
                return np.asarray(p.attr(name))
        for name in ("value_floats", "value_ints"):
            if name in p.attributes:
                return np.asarray(p.attr(name))
    return None


class Matcher:
    """Matches a pattern (a root :class:`NodePattern`) at a graph node, backtracking over the
    input orders of commutative ops when ``commute`` is set. Never mutates the graph."""

    def __init__(self, root: NodePattern, commute: bool = False):
        self.root = root
        self.commute = commute
        self.size = len(self._reachable(root))

    @staticmethod
    def _reachable(root: NodePattern) -> List[NodePattern]:
        seen: Dict[int, NodePattern] = {}
        stack = [root]
        while stack:
            n = stack.pop()
            if n.id in seen:
                continue
            seen[n.id] = n
            stack.extend(x.node for x in n.inputs if isinstance(x, NodeOutput))
        return list(seen.values())

    def iter_matches(self, node: Node) -> Iterator[Match]:
        """Every structural match of the pattern rooted at ``node`` (several only through commuted
        inputs). After the generator ends, :attr:`best` holds the deepest failure seen."""
        self.best = Failure(0, "not tried", node)
        yield from self._node(self.root, node, Match())

    def match(self, node: Node) -> Tuple[Optional[Match], Failure]:
        """The first structural match at ``node`` and the best failure (``match`` None on failure)."""
        for m in self.iter_matches(node):
            return m, self.best
        return None, self.best

    def _fail(self, m: Match, reason: str, node: Optional[Node]) -> None:
        if len(m.nodes) >= self.best.matched or self.best.reason == "not tried":
            self.best = Failure(len(m.nodes), reason, node, m.copy())

    def _node(self, p: NodePattern, node: Node, m: Match):
        """Generate every extension of ``m`` in which ``p`` matches ``node``."""
        if p.id in m.nodes:
            if m.nodes[p.id] is node:
                yield m
            else:
                self._fail(m, f"{p.describe()} is reached twice but through different nodes", node)
            return
        if node in m.nodes.values():
            self._fail(m, f"{_label(node)} would match two different pattern ops", node)
            return
        if node.op_type != p.op_type or node.domain not in ((p.domain,) if p.domain not in ("", "ai.onnx")
                                                             else ("", "ai.onnx")):
            self._fail(m, f"expected {p.describe()}, found {_label(node)}", node)
            return
        ins = list(node.inputs)
        while ins and ins[-1] is None:
            ins.pop()
        want = list(p.inputs)
        while want and want[-1] is None:
            want.pop()
        if len(ins) != len(want):
            self._fail(m, f"{_label(node)} has {len(ins)} inputs, the pattern's {p.describe()} has "
                          f"{len(want)}", node)
            return
        m = m.copy()
        for key, want_attr in p.attributes.items():
            got = node.attr(key)
            if isinstance(want_attr, AttrVar):
                got = want_attr.default if got is None else got
                if want_attr.check is not None and not want_attr.check(got):
                    wants = want_attr.describe or callable_text(want_attr.check)
                    self._fail(m, f"attribute {key}={got!r} of {_label(node)} fails the "
                                  f"constraint (the pattern wants {wants})", node)
                    return
                if want_attr.name in m.attrs and m.attrs[want_attr.name] != got:
                    self._fail(m, f"attribute {key} of {_label(node)} differs from the bound "
                                  f"'{want_attr.name}'", node)
                    return
                m.attrs[want_attr.name] = got
            elif got != want_attr and not (isinstance(want_attr, (list, tuple)) and got == tuple(want_attr)):
                self._fail(m, f"attribute {key} of {_label(node)} is {got!r}, the pattern wants "
                              f"{want_attr!r}", node)
                return
        m.nodes[p.id] = node
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
                self._fail(m, f"input {i} of {_label(node)} should be omitted", node)
            return
        if val is None:
            self._fail(m, f"input {i} of {_label(node)} is omitted", node)
            return
        if isinstance(pat, ValuePattern):
            bound = m.values.get(pat.name)
            if bound is not None and bound is not val:
                self._fail(m, f"'{pat.name}' is bound to '{bound.name}' but input {i} of {_label(node)} "
                              f"is '{val.name}'", node)
                return
            m2 = m.copy()
            m2.values[pat.name] = val
            yield from self._inputs(want, ins, i + 1, m2, node)
        elif isinstance(pat, ConstantPattern):
            arr = constant_value(val)
            if arr is None:
                self._fail(m, f"input {i} of {_label(node)} ('{val.name}') is not a constant", node)
                return
            if not constant_close(arr, pat.value, pat.rtol):
                self._fail(m, f"input {i} of {_label(node)} is not the constant {pat.value.tolist()}", node)
                return
            yield from self._inputs(want, ins, i + 1, m, node)
        else:
            producer = val.producer
            if producer is None or val.index != pat.index:
                what = "a graph input or initializer" if producer is None else f"output {val.index} of " \
                       f"{_label(producer)}"
                self._fail(m, f"input {i} of {_label(node)} ('{val.name}') is {what}, the pattern wants "
                              f"{pat.node.describe()}", node)
                return
            for m2 in self._node(pat.node, producer, m):
                yield from self._inputs(want, ins, i + 1, m2, node)


def node_label(node: Node) -> str:
    """How reports name a node: ``Conv 'conv1'``, or ``Conv <from Conv@3>`` for a nameless node
    (its provenance), or the bare op type."""
    if node.name:
        return f"{node.op_type} '{node.name}'"
    if node.provenance:
        return f"{node.op_type} <from {', '.join(node.provenance)}>"
    return node.op_type


_label = node_label


__all__ = ["AttrVar", "COMMUTATIVE_OPS", "ConstantPattern", "Failure", "Match", "Matcher", "NodeOutput",
           "NodePattern", "PatternBuilder", "ValuePattern", "constant_value", "node_label"]
