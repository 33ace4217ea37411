"""Recognition of multi-branch convolution blocks from the graph alone: Add trees of linear branches."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple, Union

import numpy as np

from passctl.ir import Graph, Node, Value
from passctl.passes.common.constants import constant_array, is_standard_op
from passctl.passes.fusion.bn_math import bn_scale_shift
from passctl.passes.reparam.merge import Kernel, MergeError, add, affine, compose, diagonal

# Ops a branch is made of: each is a linear (affine) map of its one non-constant input.
LINEAR_OPS = frozenset({"Conv", "BatchNormalization", "Mul", "Add", "Sub", "Div", "Pad", "AveragePool"})
MAX_DEPTH = 64
"""Deepest producer chain followed from one root (longer chains are cut into separate roots)."""


@dataclass
class Step:
    """One branch op as a map of its data input: exactly one of ``kernel`` (Conv, AveragePool),
    ``scale_shift`` (BN, per-channel constants: ``y = s * x + t``) or ``pads`` (Pad) is set."""

    node: Node
    data: Value
    kernel: Optional[Kernel] = None
    scale_shift: Optional[Tuple[np.ndarray, np.ndarray]] = None
    pads: Optional[Tuple[int, int, int, int]] = None


@dataclass
class Term:
    """``kernel(source)``; ``kernel`` None means the identity (an identity branch, or a leaf)."""

    source: Value
    kernel: Optional[Kernel] = None


@dataclass
class Form:
    """The value of a subgraph as a sum of terms, one per source value when they merged.

    Attributes:
        terms: the terms; more than one means some branches could not be merged.
        nodes: the nodes the terms replace (graph order is restored when rewriting).
        notes: why a value was not followed or two branches did not merge.
        adds: the branch Add nodes included (a chain of n Adds sums n + 1 branches).
    """

    terms: List[Term]
    nodes: Dict[Node, None] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    adds: int = 0


def _label(node: Node) -> str:
    return f"{node.op_type} '{node.name}'"


def is_sum(node: Node) -> bool:
    """An ``Add`` of two non-constant values (a branch sum; ``Add`` of a constant is a bias step)."""
    return (node.op_type == "Add" and is_standard_op(node) and len(node.inputs) == 2
            and all(v is not None and constant_array(v) is None for v in node.inputs))


def is_candidate(node: Node) -> bool:
    """Whether ``node`` may be part of a branch (by op type; :func:`linear_step` decides)."""
    return node.op_type in LINEAR_OPS and is_standard_op(node)


def _ints(node: Node, name: str, default):
    v = node.attr(name)
    return tuple(default if v is None else v)


def _conv_spatial(node: Node) -> Union[dict, str]:
    auto_pad = node.attr("auto_pad") or "NOTSET"
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if auto_pad not in ("NOTSET", "VALID"):
        return f"{_label(node)} uses auto_pad={auto_pad}; only explicit pads are merged"
    pads = (0, 0, 0, 0) if auto_pad == "VALID" else _ints(node, "pads", (0, 0, 0, 0))
    return dict(strides=_ints(node, "strides", (1, 1)), pads=pads,
                dilations=_ints(node, "dilations", (1, 1)))


def _per_channel(arr: np.ndarray) -> Optional[np.ndarray]:
    """A constant that broadcasts over NCHW per channel (shape ``[1, C, 1, 1]``, ``[C, 1, 1]``, a
    scalar...) as a vector of length C or 1; None otherwise."""
    if arr.dtype.kind != "f" or arr.ndim > 4:
        return None
    shape = (1,) * (4 - arr.ndim) + arr.shape
    if shape[0] != 1 or shape[2] != 1 or shape[3] != 1:
        return None
    return arr.astype(np.float64).reshape(-1)


def linear_step(node: Node) -> Union[Step, str]:
    """``node`` as a :class:`Step` of a branch, or a one-line reason why it is not one."""
    op, ins = node.op_type, node.inputs
    if node.op_type == "Conv":
        w = constant_array(ins[1]) if len(ins) > 1 else None
        if w is None or w.dtype.kind != "f" or w.ndim != 4:
            return f"{_label(node)}: the weight is not a constant float 2-D kernel"
        b = constant_array(ins[2]) if len(ins) > 2 and ins[2] is not None else None
        if len(ins) > 2 and ins[2] is not None and b is None:
            return f"{_label(node)}: the bias is not a constant"
        spatial = _conv_spatial(node)
        if isinstance(spatial, str):
            return spatial
        bias = np.zeros(w.shape[0]) if b is None else b.astype(np.float64).reshape(-1)
        kernel = Kernel(w.astype(np.float64), bias, int(node.attr("group") or 1), convs=1, **spatial)
        return Step(node, ins[0], kernel=kernel)
    if op == "BatchNormalization":
        params = [constant_array(v) for v in ins[1:5]] if len(ins) == 5 else [None]
        if len(node.outputs) != 1 or node.attr("training_mode"):
            return f"{_label(node)} is in training mode"
        if any(p is None for p in params):
            return f"{_label(node)}: scale, B, mean and var must be constants"
        eps = node.attr("epsilon")
        s, t = bn_scale_shift(*params, 1e-5 if eps is None else float(eps))
        return Step(node, ins[0], scale_shift=(s, t))
    if op in ("Mul", "Add", "Sub", "Div") and len(ins) == 2:
        consts = [None if v is None else constant_array(v) for v in ins]
        if (consts[0] is None) == (consts[1] is None):
            return f"{_label(node)} does not have exactly one constant input"
        i = 0 if consts[0] is None else 1
        c = _per_channel(np.asarray(consts[1 - i]))
        if c is None:
            return f"{_label(node)}: the constant is not a per-channel float vector"
        one, zero = np.ones(1), np.zeros(1)
        if op == "Mul":
            st = (c, zero)
        elif op == "Add":
            st = (one, c)
        elif op == "Sub":
            st = (one, -c) if i == 0 else (-one, c)
        elif i == 0:
            st = (1.0 / c, zero)
        else:
            return f"{_label(node)} divides a constant by a tensor"
        return Step(node, ins[i], scale_shift=st)
    if op == "Pad":
        return _pad_step(node)
    if op == "AveragePool":
        return _pool_step(node)
    return f"{_label(node)} is not a linear branch op"


def _pad_step(node: Node) -> Union[Step, str]:
    mode = node.attr("mode") or "constant"
    mode = mode.decode() if isinstance(mode, bytes) else mode
    ins = node.inputs
    pads = constant_array(ins[1]) if len(ins) > 1 and ins[1] is not None else None
    value = constant_array(ins[2]) if len(ins) > 2 and ins[2] is not None else np.zeros(1)
    axes = constant_array(ins[3]) if len(ins) > 3 and ins[3] is not None else None
    if mode != "constant" or pads is None or value is None or np.any(value != 0):
        return f"{_label(node)} is not a constant zero padding"
    if len(ins) > 3 and ins[3] is not None and axes is None:
        return f"{_label(node)}: the axes are not constant"
    axes = list(range(4)) if axes is None else [int(a) % 4 for a in axes]
    pads = [int(p) for p in pads]
    full = [0] * 8
    n = len(axes)
    if len(pads) != 2 * n:
        return f"{_label(node)} pads a tensor that is not 4-D"
    for k, a in enumerate(axes):
        full[a], full[a + 4] = pads[k], pads[k + n]
    if full[0] or full[1] or full[4] or full[5] or min(full) < 0:
        return f"{_label(node)} pads the batch or channel axis, or crops"
    return Step(node, ins[0], pads=(full[2], full[3], full[6], full[7]))


def _pool_step(node: Node) -> Union[Step, str]:
    k = node.attr("kernel_shape")
    if k is None or len(k) != 2:
        return f"{_label(node)} is not a 2-D pooling"
    spatial = _conv_spatial(node)
    if isinstance(spatial, str):
        return spatial
    if node.attr("ceil_mode"):
        return f"{_label(node)} uses ceil_mode=1"
    if any(spatial["pads"]) and not node.attr("count_include_pad"):
        return (f"{_label(node)} pads without count_include_pad, so border windows are not a "
                "convolution")
    # One channel's window, group 0: widened to the data's channel count when the step is applied.
    kernel = Kernel(np.full((1, 1) + tuple(k), 1.0 / (k[0] * k[1])), np.zeros(1), 0, diag=True,
                    **spatial)
    return Step(node, node.inputs[0], kernel=kernel)


def _channels(value: Value) -> Optional[int]:
    shape = value.shape
    if shape is None or len(shape) != 4:
        return None
    c = shape[1]
    return c if isinstance(c, int) and not isinstance(c, bool) else None


def _identity(term: Term, channels: Optional[int]) -> Kernel:
    c = channels or _channels(term.source)
    if c is None:
        raise MergeError(f"the channel count of '{term.source.name}' is unknown (run infer-shapes)")
    return diagonal(np.ones(c), np.zeros(c))


def apply_step(term: Term, step: Step) -> Term:
    """``step`` applied after ``term`` (:mod:`passctl.passes.reparam.merge` does the arithmetic).

    Raises:
        MergeError: the result is not one convolution of ``term.source``.
    """
    k = term.kernel
    if step.scale_shift is not None:
        s, t = step.scale_shift
        if k is None:
            c = max(s.size, t.size) if max(s.size, t.size) > 1 else None
            k = _identity(term, c)
        s = np.broadcast_to(s, (k.c_out,)) if s.size in (1, k.c_out) else None
        t = np.broadcast_to(t, (k.c_out,)) if t.size in (1, k.c_out) else None
        if s is None or t is None:
            raise MergeError(f"{_label(step.node)} has a constant that does not match {k.c_out} channels")
        return Term(term.source, affine(k, s, t))
    if step.pads is not None:
        k = k if k is not None else _identity(term, None)
        if not k.is_pointwise() or np.any(k.bias != 0):
            raise MergeError(f"{_label(step.node)} pads the output of a {k.describe()} with a bias "
                             "or a spatial window")
        pads = tuple(p + q for p, q in zip(k.pads, step.pads))
        return Term(term.source, replace(k, pads=pads))
    second = step.kernel
    if second.group == 0:  # average pooling: as many channels as its input
        c = k.c_out if k is not None else _identity(term, None).c_out
        window = np.broadcast_to(second.weight, (c,) + second.weight.shape[1:]).copy()
        second = replace(second, weight=window, bias=np.zeros(c), group=c)
    if k is None:
        return Term(term.source, second)
    return Term(term.source, compose(k, second))


class Recognizer:
    """Expands the value of a root node into a :class:`Form`, following only values that have no
    other consumer (a branch intermediate read elsewhere stays a separate source, with a note)."""

    def __init__(self, graph: Graph, protected: Optional[Dict[Node, str]] = None):
        self.graph = graph
        self.protected = protected or {}

    def leaf(self, value: Value, note: Optional[str] = None) -> Form:
        return Form([Term(value)], notes=[note] if note else [])

    def expand(self, value: Value, root: bool = False, depth: int = 0) -> Form:
        """The form of ``value``; ``root`` skips the single-consumer check for the root itself."""
        node = value.producer
        if node is None or node.graph is not self.graph or not is_candidate(node):
            return self.leaf(value)
        if not root:
            users = value.consumers()
            if value.is_graph_output() or len(users) != 1:
                other = next((u for u in users if u not in self._inside), None)
                why = ("is a graph output" if value.is_graph_output() else
                       f"has another consumer: {_label(other)}" if other is not None else
                       "has several consumers")
                return self.leaf(value, f"branch value '{value.name}' ({_label(node)}) {why}")
        if depth > MAX_DEPTH:
            return self.leaf(value)
        if node in self.protected:
            return self.leaf(value, f"{_label(node)} is part of a {self.protected[node]} that fuse "
                                    "fuses; folding it into a Conv would hide the pattern")
        if is_sum(node):
            self._inside.add(node)
            a = self.expand(node.inputs[0], depth=depth + 1)
            b = self.expand(node.inputs[1], depth=depth + 1)
            return self._combine(a, b, node)
        step = linear_step(node)
        if isinstance(step, str):
            return self.leaf(value, step)
        self._inside.add(node)
        inner = self.expand(step.data, depth=depth + 1)
        note = None
        if len(inner.terms) == 1:
            try:
                term = apply_step(inner.terms[0], step)
                return Form([term], {**inner.nodes, node: None}, inner.notes, inner.adds)
            except MergeError as e:
                note = str(e)
        # Cut the branch here: this op alone on its input (which becomes a root of its own).
        try:
            term = apply_step(Term(step.data), step)
        except MergeError as e:
            return self.leaf(value, str(e))
        notes = inner.notes + ([note] if note else [])
        return Form([term], {node: None}, notes)

    def _combine(self, a: Form, b: Form, node: Node) -> Form:
        terms = list(a.terms)
        notes = a.notes + b.notes
        for t in b.terms:
            i = next((i for i, u in enumerate(terms) if u.source is t.source), None)
            if i is None:
                terms.append(t)
                continue
            u = terms[i]
            try:
                ku = u.kernel if u.kernel is not None else _identity(u, _in_channels(t))
                kt = t.kernel if t.kernel is not None else _identity(t, _in_channels(u))
                terms[i] = Term(u.source, add(ku, kt))
            except MergeError as e:
                notes.append(f"{_label(node)}: {e}")
                terms.append(t)
        return Form(terms, {**a.nodes, **b.nodes, node: None}, notes, a.adds + b.adds + 1)

    def run(self, root: Node) -> Form:
        """The form of ``root``'s first output."""
        self._inside = {root}
        return self.expand(root.outputs[0], root=True)


def _in_channels(term: Term) -> Optional[int]:
    return term.kernel.c_in if term.kernel is not None else None


__all__ = ["Form", "LINEAR_OPS", "Recognizer", "Step", "Term", "apply_step", "is_candidate",
           "is_sum", "linear_step"]
