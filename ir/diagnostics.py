"""The verifier's diagnostics: their kinds, the :class:`Diagnostic` record and the ONNX schema
spelling of value types, shared by the verifier and its schema and type checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from passctl.ir._core import Node
from passctl.ir._types import MapType, OptionalType, SequenceType, SparseTensorType, TensorType, Type

# Diagnostic kinds (``Diagnostic.kind``).
SSA = "ssa"  # a value defined twice (two producers, or an input/initializer that a node produces)
DUPLICATE_NAME = "duplicate-name"  # two distinct values with one name in a model's graphs
USE_BEFORE_DEF = "use-before-def"  # a node reads a value its graph produces later
DANGLING_USE = "dangling-use"  # a node reads a value that no visible scope defines
USE_LIST = "use-list"  # a value's use list disagrees with the nodes' inputs (internal invariant)
UNDEFINED_OUTPUT = "undefined-output"  # a graph output that nothing in scope defines
SUBGRAPH_SCOPE = "subgraph-scope"  # a subgraph reads an outer value defined after its node
ARITY = "arity"  # input/output count, or a missing required input, against the op schema
ATTRIBUTE = "attribute"  # unknown, missing required, or wrong-kind attribute
TYPE = "type"  # an input element type outside the schema's type constraint, or a negative dim
OUTPUT_TYPE = "output-type"  # declared graph-output type disagrees with shape inference (warning)
UNKNOWN_OP = "unknown-op"  # an op the default ONNX domain lacks (warning: only at this opset)
KINDS = (SSA, DUPLICATE_NAME, USE_BEFORE_DEF, DANGLING_USE, USE_LIST, UNDEFINED_OUTPUT,
         SUBGRAPH_SCOPE, ARITY, ATTRIBUTE, TYPE, OUTPUT_TYPE, UNKNOWN_OP)


@dataclass
class Diagnostic:
    """One problem found by :func:`verify`.

    Attributes:
        severity: ``"error"`` (the IR is invalid) or ``"warning"`` (suspicious but runnable).
        kind: which check found it, one of :data:`KINDS` (e.g. ``"use-before-def"``).
        message: one sentence saying what is wrong.
        node: the offending node, or None for graph-level problems.
        ir_line: the node's line in the IR text form (``passctl.ir.printer``), when there is a node.
        line: the 1-based line number of ``ir_line`` in ``print_model(model)``, when known.
        highlight: a value name to underline in ``ir_line``; the whole line when None.
        in_operands: look for ``highlight`` among the node's inputs (right of ``=``) first.
    """

    severity: str
    kind: str
    message: str
    node: Optional[Node] = None
    ir_line: Optional[str] = None
    line: Optional[int] = None
    highlight: Optional[str] = None
    in_operands: bool = False

    def __str__(self) -> str:
        out = [f"{self.severity}[{self.kind}]: {self.message}"]
        if self.node is not None:
            where = f"node '{self.node.name}' ({self.node.qualified_op})"
            if self.line is not None:
                where += f", line {self.line}"
            out.append(f"  --> {where}")
        if self.ir_line is not None:
            text = self.ir_line.rstrip("\n")
            gutter = f"{self.line} | " if self.line is not None else "  | "
            pad = " " * (len(gutter) - 2) + "| "
            start, width = _span(text, self.highlight, self.in_operands)
            out.append(gutter + text)
            out.append(pad + " " * start + "^" * max(width, 1))
        return "\n".join(out)


def _span(text: str, highlight: Optional[str], in_operands: bool = False):
    if highlight:
        eq = text.find(" = ")
        starts = ([eq + 3] if in_operands and eq >= 0 else []) + [0]
        for begin in starts:
            for cand in (f"%{highlight}", highlight):
                at = _find_token(text, cand, begin)
                if at >= 0:
                    return at, len(cand)
    stripped = text.lstrip()
    return len(text) - len(stripped), len(stripped.rstrip())


def _find_token(text: str, token: str, begin: int = 0) -> int:
    at = text.find(token, begin)
    while at >= 0:
        end = at + len(token)
        if end >= len(text) or not (text[end].isalnum() or text[end] in "_."):
            return at
        at = text.find(token, at + 1)
    return -1


def type_string(t: Optional[Type]) -> Optional[str]:
    """The ONNX schema spelling of a value type, e.g. ``tensor(float)``, ``seq(tensor(int64))``.

    Returns None when the type (or its element type) is unknown.
    """
    if isinstance(t, (TensorType, SparseTensorType)):
        if t.dtype == 0:
            return None
        kind = "tensor" if isinstance(t, TensorType) else "sparse_tensor"
        return f"{kind}({t.dtype.name.lower()})"
    if isinstance(t, (SequenceType, OptionalType)):
        inner = type_string(t.elem)
        if inner is None:
            return None
        return f"{'seq' if isinstance(t, SequenceType) else 'optional'}({inner})"
    if isinstance(t, MapType):
        inner = type_string(t.value)
        return None if inner is None else f"map({t.key.name.lower()}, {inner})"
    return None
