"""Patterns as op calls (``op.Add(op.MatMul(x, w), b)``), alternatives (``a | b``), optional inputs."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from passctl.ir import Node, Value

# Binary ops whose two inputs may be swapped (ONNX op spec: Add, Mul, ... are commutative).
COMMUTATIVE_OPS = frozenset({"Add", "Mul", "And", "Or", "Xor", "Equal", "Max", "Min", "Sum", "Mean"})


class _Alternatives:
    """``a | b`` on pattern inputs makes an :class:`OrPattern` (mixed into the input kinds)."""

    def __or__(self, other) -> "OrPattern":
        left = self.alternatives if isinstance(self, OrPattern) and self.name is None else [self]
        return OrPattern([*left, _as_input(other)])

    def __ror__(self, other) -> "OrPattern":
        return OrPattern([_as_input(other), self])


class ValuePattern(_Alternatives):
    """A pattern variable: matches any value and binds it under ``name`` (same name, same value)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"%{self.name}"


class OrPattern(_Alternatives):
    """Alternatives: the first sub-pattern that matches (in order; the matcher backtracks into the
    next one when the rest of the pattern fails). ``Pow(d, 2) | Mul(d, d)`` builds one.

    With ``name``, ``check`` / ``rewrite`` / :attr:`RewriteRule.variant` receive the label of the
    alternative that matched (``labels[i]``, or its index ``i`` when no labels are given). Several
    Ors of one name must choose the same label in a match (``ReduceMean`` axes written alike twice).
    """

    def __init__(self, alternatives: Sequence[Any], name: Optional[str] = None,
                 labels: Optional[Sequence[str]] = None):
        self.alternatives = [_as_input(a) for a in alternatives]
        if len(self.alternatives) < 2 or any(a is None or isinstance(a, OptionalPattern)
                                             for a in self.alternatives):
            raise TypeError(f"Or needs two or more sub-patterns (none omitted or optional), got "
                            f"{alternatives!r}")
        if labels is not None and len(labels) != len(self.alternatives):
            raise TypeError(f"Or: {len(labels)} labels for {len(self.alternatives)} alternatives")
        self.name = name
        self.labels = list(labels) if labels is not None else list(range(len(self.alternatives)))

    def items(self) -> List[Tuple[Any, Any]]:
        """``(label, sub-pattern)`` per alternative, in matching order."""
        return list(zip(self.labels, self.alternatives))

    def __repr__(self):
        return "(" + " | ".join(repr(a) for a in self.alternatives) + ")"


def Or(*alternatives, name: Optional[str] = None, labels: Optional[Sequence[str]] = None) -> OrPattern:
    """Alternatives of sub-patterns (see :class:`OrPattern`); ``Or(a, b)`` is ``a | b``.

    Args:
        *alternatives: two or more op outputs, variables, constants (Python numbers) or Ors.
        name: bind the label of the alternative that matched under this name.
        labels: one label per alternative (default: the indexes 0, 1, ...).

    Returns:
        The :class:`OrPattern`, usable wherever an op input or the pattern's root is.

    Raises:
        TypeError: fewer than two alternatives, an omitted one, or a label count that differs.

    Note: ``op.Or(a, b)`` is the ONNX logical ``Or`` op; this function is the pattern alternative.
    """
    return OrPattern(alternatives, name, labels)


class OptionalPattern:
    """An input that may be omitted (an empty name or past the node's last input): the variable
    inside is then bound to ``None``; a present input must match the inner pattern."""

    def __init__(self, inner):
        inner = _as_input(inner)
        if inner is None or isinstance(inner, OptionalPattern):
            raise TypeError(f"Opt: unsupported inner pattern {inner!r}")
        self.inner = inner

    def __repr__(self):
        return f"{self.inner!r}?"


def Opt(inner) -> OptionalPattern:
    """An optional input (see :class:`OptionalPattern`): ``op.Conv(x, w, Opt(b))`` matches Conv with
    or without a bias, ``b`` being ``None`` without one.

    Args:
        inner: the pattern a present input must match (usually a variable).

    Returns:
        The :class:`OptionalPattern`.
    """
    return OptionalPattern(inner)


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


class ConstantPattern(_Alternatives):
    """Matches a constant (initializer or ``Constant`` node output) equal to ``value`` within
    ``rtol`` (numpy broadcasting: a scalar matches a tensor whose elements all equal it). With
    ``rtol > 0`` the tolerance is at least the rounding of the constant's own floating dtype
    (:func:`dtype_rtol`: an fp16 sqrt(2) is 1.4140625, 1.1e-4 off)."""

    def __init__(self, value, rtol: float = 0.0):
        self.value = np.asarray(value)
        self.rtol = rtol

    def __repr__(self):
        return f"const({self.value.tolist()})"


class NodeOutput(_Alternatives):
    """Output ``index`` of a :class:`NodePattern`."""

    def __init__(self, node: "NodePattern", index: int):
        self.node, self.index = node, index

    def __repr__(self):
        return f"{self.node.op_type}#{self.node.id}[{self.index}]"


PatternInput = Union[ValuePattern, NodeOutput, ConstantPattern, OrPattern, OptionalPattern, None]
_INPUT_KINDS = (ValuePattern, NodeOutput, ConstantPattern, OrPattern, OptionalPattern)


def _as_input(x):
    """A pattern input from what a rule wrote: Python numbers / arrays become constants."""
    if isinstance(x, (int, float, np.ndarray, list)) and not isinstance(x, bool):
        return ConstantPattern(x)
    if x is not None and not isinstance(x, _INPUT_KINDS):
        raise TypeError(f"unsupported pattern input {x!r}")
    return x


@dataclass(eq=False)
class NodePattern:
    """One op of a pattern: op type, domain, input patterns and attribute constraints.

    ``bind``: the name under which ``check`` / ``rewrite`` receive the matched graph node (its
    attributes through ``node.attr(...)``). ``other_inputs``: the node may have more inputs than the
    pattern lists (they are not matched).
    """

    op_type: str
    domain: str
    inputs: List[PatternInput]
    attributes: Dict[str, Any]
    num_outputs: int
    id: int
    outputs: List[NodeOutput] = field(default_factory=list)
    bind: str = ""
    other_inputs: bool = False

    def describe(self) -> str:
        return f"{self.op_type}" if self.domain in ("", "ai.onnx") else f"{self.domain}::{self.op_type}"


class PatternBuilder:
    """The ``op`` given to a rule's ``pattern``: ``op.Conv(x, w, group=AttrVar("g"))``.

    Special keywords: ``_domain`` (operator domain), ``_outputs`` (number of outputs; a tuple is
    returned when > 1), ``_name`` (bind the matched node under that name for ``check`` and
    ``rewrite``), ``_other_inputs`` (``True``: inputs after the listed ones are allowed and not
    matched). Other keywords are attribute constraints: a plain value must equal the node's
    attribute, an :class:`AttrVar` binds it. Python numbers as inputs become
    :class:`ConstantPattern`; inputs may be :func:`Or` alternatives and :func:`Opt` optional inputs.
    """

    def __init__(self):
        self.nodes: List[NodePattern] = []

    def __getattr__(self, op_type: str):
        if op_type.startswith("_"):
            raise AttributeError(op_type)

        def make(*inputs, _domain: str = "", _outputs: int = 1, _name: str = "",
                 _other_inputs: bool = False, **attributes):
            return self.op(op_type, *inputs, _domain=_domain, _outputs=_outputs, _name=_name,
                           _other_inputs=_other_inputs, **attributes)

        return make

    def op(self, op_type: str, *inputs, _domain: str = "", _outputs: int = 1, _name: str = "",
           _other_inputs: bool = False, **attributes):
        try:
            ins: List[PatternInput] = [_as_input(x) for x in inputs]
        except TypeError as e:
            raise TypeError(f"pattern {op_type}: {e}") from None
        node = NodePattern(op_type, _domain, ins, dict(attributes), _outputs, len(self.nodes),
                           bind=_name, other_inputs=_other_inputs)
        node.outputs = [NodeOutput(node, i) for i in range(_outputs)]
        self.nodes.append(node)
        return node.outputs[0] if _outputs == 1 else tuple(node.outputs)


def pattern_nodes(root: PatternInput, choice: Optional[Dict[int, int]] = None) -> List[NodePattern]:
    """The pattern ops reachable from ``root``: through every alternative, or, with ``choice``
    (``id(OrPattern)`` -> alternative index, 0 when missing), through the chosen ones only."""
    seen: Dict[int, NodePattern] = {}
    stack = [root]
    while stack:
        x = stack.pop()
        if isinstance(x, OptionalPattern):
            stack.append(x.inner)
        elif isinstance(x, OrPattern):
            if choice is None:
                stack.extend(x.alternatives)
            else:
                stack.append(x.alternatives[choice.get(id(x), 0)])
        elif isinstance(x, NodeOutput) and x.node.id not in seen:
            seen[x.node.id] = x.node
            stack.extend(x.node.inputs)
    return list(seen.values())


def or_patterns(root: PatternInput) -> List[OrPattern]:
    """Every :class:`OrPattern` reachable from ``root`` (through every alternative)."""
    out: Dict[int, OrPattern] = {}
    stack = [root]
    seen = set()
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OptionalPattern):
            stack.append(x.inner)
        elif isinstance(x, OrPattern):
            out[id(x)] = x
            stack.extend(x.alternatives)
        elif isinstance(x, NodeOutput):
            stack.extend(x.node.inputs)
    return list(out.values())


def pattern_size(root: PatternInput) -> int:
    """The most pattern ops one full match can hold (over every choice of alternatives; the count of
    all reachable ops when there are too many choices to enumerate)."""
    ors = or_patterns(root)
    combos = 1
    for o in ors:
        combos *= len(o.alternatives)
    if combos > 4096:
        return len(pattern_nodes(root))
    best = 0
    for pick in itertools.product(*(range(len(o.alternatives)) for o in ors)):
        best = max(best, len(pattern_nodes(root, {id(o): i for o, i in zip(ors, pick)})))
    return best


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


def node_label(node: Node) -> str:
    """How reports name a node: ``Conv 'conv1'``, or ``Conv <from Conv@3>`` for a nameless node
    (its provenance), or the bare op type."""
    if node.name:
        return f"{node.op_type} '{node.name}'"
    if node.provenance:
        return f"{node.op_type} <from {', '.join(node.provenance)}>"
    return node.op_type



__all__ = ["AttrVar", "COMMUTATIVE_OPS", "ConstantPattern", "NodeOutput", "NodePattern", "Opt",
           "OptionalPattern", "Or", "OrPattern", "PatternBuilder", "ValuePattern", "constant_value",
           "node_label", "pattern_nodes", "pattern_size"]
