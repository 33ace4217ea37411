"""The lowering framework: per-target tables turning canonical passctl ops into a target's ops."""

from __future__ import annotations

import logging
from typing import Callable, Dict, List, Optional, Tuple, Union

import numpy as np

from passctl.dialect.canonical import DOMAIN, drop_unused_opset, last_dim
from passctl.ir import Builder, Graph, Model, Node, Value
from passctl.passes.base import Pass, PassResult
from passctl.passes.rewrite.types import discard_nodes, replacement_conflict

logger = logging.getLogger(__name__)

LowerFn = Callable[["LowerContext", Node], Union[Value, Tuple[Value, ...], None]]
"""Builds the replacement of one canonical node with ``ctx.b``; returns the value replacing its
first output (a tuple of values for a node with several outputs, in order), or None to leave the
node to the next candidate function."""

def typed_like(new: Value, x: Value) -> Value:
    """``new`` (x plus a [D] bias or an x-shaped skip, just built) with x's type, so the constants
    a lowering then adds next to it (sqrt(2), epsilon: :meth:`LowerContext.scalar`) take its dtype,
    not float32 (an fp16 BERT's GELU lowered to Div(fp16, fp32 sqrt(2)), which no runtime accepts).
    """
    if new.type is None and x.type is not None:
        new.type = x.type
    return new


# target -> canonical op type -> candidate functions, tried in order (first non-None wins).
_TABLES: Dict[str, Dict[str, List[LowerFn]]] = {}


def register_lowering(target: str, op_type: str, fn: LowerFn, first: bool = False) -> LowerFn:
    """Add ``fn`` as a way to lower ``passctl::<op_type>`` for ``target`` (``"onnxruntime"``,
    ``"standard"``). Other fusion families (conv + activation, ...) register theirs the same way.

    Args:
        first: try ``fn`` before the functions already registered (a more specific form).
    """
    fns = _TABLES.setdefault(target, {}).setdefault(op_type, [])
    if fn not in fns:
        fns.insert(0, fn) if first else fns.append(fn)
    return fn


class LowerContext:
    """What a lowering function gets: the model (opset), a builder collecting the new nodes, and the
    name of the rule (form) it chose, for statistics."""

    def __init__(self, model: Model, graph: Graph, node: Node, options=None):
        self.model = model
        self.graph = graph
        self.b = Builder(graph, provenance=node.provenance, insert=False)
        self.form = ""
        self.options = options
        """The lowering pass's options (None for a pass without any)."""
        self.why_not = ""

    def refuse(self, reason: str) -> None:
        """Say why this form does not take the node (a kernel constraint it breaks); the function
        then returns None and the next form is tried. :class:`Lowering` reports the reason."""
        self.why_not = reason
        return None

    @property
    def opset(self) -> int:
        """The model's default-domain opset version."""
        return self.model.opset

    def const(self, array, name: str) -> Value:
        """A new initializer."""
        return self.graph.add_constant(np.asarray(array), name)

    def scalar(self, value: float, like: Value, name: str) -> Value:
        """A one-element initializer ``[value]`` of ``like``'s element type (float32 when unknown)."""
        dtype = like.dtype.numpy() if like.dtype is not None else np.float32
        return self.const(np.array([value], dtype=dtype), name)

    def ones_scale(self, x: Value, name: str = "ones") -> Value:
        """A ``[D]`` vector of ones for x's last axis: an initializer when D is static, else
        ``ConstantOfShape(Shape(x)[-1:])`` computed at run time."""
        dtype = x.dtype.numpy() if x.dtype is not None else np.float32
        d = last_dim(x)
        if d is not None:
            return self.const(np.ones(d, dtype=dtype), f"{x.name}_{name}")
        shape = self.b.op("Shape", x)
        start = self.const(np.array([-1], dtype=np.int64), "last_start")
        end = self.const(np.array([np.iinfo(np.int64).max], dtype=np.int64), "last_end")
        dim = self.b.op("Slice", shape, start, end)
        return self.b.op("ConstantOfShape", dim, value=np.ones(1, dtype=dtype))

    def reduce_mean_last(self, v: Value) -> Value:
        """``ReduceMean(v)`` over the last axis, keepdims 1, axes as attribute (< 18) or input."""
        if self.opset >= 18:
            return self.b.op("ReduceMean", v, self.const(np.array([-1], dtype=np.int64), "axes_last"),
                             keepdims=1)
        return self.b.op("ReduceMean", v, axes=[-1], keepdims=1)


class Lowering(Pass):
    """Replaces every ``passctl::`` node by the first form of ``TARGET``'s table that applies.

    A form whose outputs would differ in element type or static shape from the canonical node's
    (inferred from the inputs, :func:`passctl.passes.rewrite.types.replacement_conflict`; forms of
    ops onnx has no schema for are not inferred) is refused with a warning, and the next form is
    tried.

    Statistics: ``lowered`` (nodes replaced), the count per form (``"LayerNorm->com.microsoft::..."``
    style names given by the lowering functions), ``unlowered`` (canonical nodes no form took,
    logged as warnings: the emitted model cannot run them), ``refused`` (forms refused for a
    type change, when any) and, when a form was passed over with a reason
    (:meth:`LowerContext.refuse` or a type change), ``fallbacks``: one line per such node,
    ``"<op> '<node>': <form chosen>; not <function>: <reason>; ..."``.
    """

    TARGET = ""
    #: ``passctl bisect``'s stepping hook: lower at most this many nodes (None: all); each one
    #: lowered is recorded in ``applied`` as ``(form, node, (node,), new nodes)``.
    max_rewrites: Optional[int] = None

    def run(self, model: Model) -> PassResult:
        stats: Dict[str, object] = {"lowered": 0, "unlowered": 0}
        self.applied: List[tuple] = []
        table = _TABLES.get(self.TARGET, {})
        opset = model.opset or 21
        for graph in model.graphs():
            for node in list(graph):
                if node.domain != DOMAIN or (self.max_rewrites is not None
                                             and len(self.applied) >= self.max_rewrites):
                    continue
                out = None
                ctx = None
                passed_over = []
                for fn in table.get(node.op_type, ()):
                    ctx = LowerContext(model, graph, node, self.options)
                    out = fn(ctx, node)
                    if out is None:
                        if ctx.why_not:
                            passed_over.append(f"not {fn.__name__}: {ctx.why_not}")
                        continue
                    outs = list(out) if isinstance(out, tuple) else [out]
                    why = replacement_conflict([node], ctx.b.nodes, list(node.outputs[:len(outs)]),
                                               outs, opset, assign_types=False)
                    if why is None:
                        break
                    # A form that would not compute the canonical op's type: the next form.
                    discard_nodes(ctx.b.nodes)
                    stats["refused"] = stats.get("refused", 0) + 1
                    logger.warning("%s: form %s of passctl::%s (node '%s') refused: %s", self.name,
                                   ctx.form or getattr(fn, "__name__", "?"), node.op_type, node.name, why)
                    passed_over.append(f"not {getattr(fn, '__name__', '?')}: {why}")
                    out = None
                if passed_over:
                    chosen = ctx.form if out is not None else "no form"
                    line = f"{node.op_type} '{node.name}': {chosen}; " + "; ".join(passed_over)
                    stats.setdefault("fallbacks", []).append(line)
                    logger.info("%s: %s", self.name, line)
                if out is None:
                    stats["unlowered"] += 1
                    logger.warning("%s: no %s form for passctl::%s (node '%s'); it stays canonical",
                                   self.name, self.TARGET, node.op_type, node.name)
                    continue
                # A tuple replaces the node's outputs in order (passctl::SkipRMSNorm's (y, sum)).
                outs = list(out) if isinstance(out, tuple) else [out]
                olds = list(node.outputs[:len(outs)])
                for old, new in zip(olds, outs):
                    if new.type is None:
                        new.type = old.type
                graph.replace_nodes([node], ctx.b.nodes, olds, outs)
                self.applied.append((ctx.form, node, (node,), tuple(ctx.b.nodes)))
                stats["lowered"] += 1
                stats[ctx.form] = stats.get(ctx.form, 0) + 1
        drop_unused_opset(model, DOMAIN)
        return PassResult(stats["lowered"] > 0, stats)


__all__ = ["LowerContext", "LowerFn", "Lowering", "register_lowering", "typed_like"]
