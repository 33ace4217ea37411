"""Type inference over a few nodes, and the guard every rewrite passes: a replacement must compute
values of the same static shape and element type as the values it replaces.

The guard infers both sides from the types of the values that flow in (never from the types the
replaced values declare, which may be stale): standard ONNX ops through onnx's per-node shape
inference (``onnx.shape_inference.infer_node_outputs``, the schemas' own inference functions, with
constant inputs given as data so that Reshape / Expand / Unsqueeze... get their shapes), the
canonical ``passctl`` ops through their schemas (:data:`passctl.dialect.canonical.SCHEMAS`: every
one returns its first input's shape and element type). An op of another domain (``com.microsoft``)
or an input of unknown type gives an unknown type, which proves nothing and refuses nothing.

Used by :class:`~passctl.passes.rewrite.rule.RewriteRule` (every rule of every rule set) and by the
hand-written fusions through :func:`checked_replace`.
"""

from __future__ import annotations

import logging
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np
import onnx
import onnx.defs
import onnx.shape_inference

from passctl.ir import Node, Shape, TensorType, Type, Value
from passctl.ir._types import type_from_proto, type_to_proto

logger = logging.getLogger(__name__)

TypeEnv = Dict[int, Optional[Type]]
"""``id(value)`` -> its inferred type (None: unknown)."""

# Canonical passctl ops whose every output has the shape and element type of input 0 (their
# schemas in passctl.dialect.canonical: LayerNorm..., HardSwish; SkipRMSNorm's second output S is
# X + Skip with Skip of X's shape).
_SAME_AS_FIRST = frozenset({"LayerNorm", "SkipLayerNorm", "RMSNorm", "SkipRMSNorm", "Gelu", "SiLU",
                            "HardSwish"})
_UPSTREAM_NODES = 32
"""Most producers :func:`infer_upstream` infers for the untyped inputs of one replacement."""
_MAX_DATA = 4096
"""Constant inputs up to this many elements reach onnx's inference as data (shape tensors)."""


def declared_type(v: Value) -> Optional[Type]:
    """The type ``v`` carries: its ``type``, else its constant's (dims and element type)."""
    if v.type is not None:
        return v.type
    if v.const is not None:
        return TensorType(v.const.dtype, Shape(tuple(v.const.dims)))
    return None


def _known(v: Optional[Value], env: TypeEnv) -> Optional[Type]:
    if v is None:
        return None
    if id(v) in env:
        return env[id(v)]
    return declared_type(v)


def _const_proto(v: Value) -> Optional[onnx.TensorProto]:
    from passctl.passes.rewrite.pattern import constant_value

    arr = constant_value(v)
    if arr is None or arr.size > _MAX_DATA or arr.dtype == object:
        return None
    try:
        return onnx.numpy_helper.from_array(np.ascontiguousarray(arr), v.name)
    except (TypeError, ValueError):
        return None


# Standard ops inferred here without onnx (the common steps of the fused patterns; the same result
# as their schemas' inference): one-input elementwise ops return their input's type; the
# multidirectional-broadcasting binary ops (ONNX Broadcasting.md) input 0's element type and the
# broadcast shape.
_UNARY = frozenset({"Abs", "Ceil", "Cos", "Elu", "Erf", "Exp", "Floor", "HardSigmoid", "HardSwish",
                    "Identity", "LeakyRelu", "Log", "Neg", "Reciprocal", "Relu", "Round", "Selu",
                    "Sigmoid", "Sign", "Sin", "Softplus", "Softsign", "Sqrt", "Tanh"})
_BROADCAST = frozenset({"Add", "Sub", "Mul", "Div", "Pow"})


def _broadcast_dim(a, b):
    if a == b:
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    if isinstance(a, int) and isinstance(b, int):
        raise ValueError(f"dims {a} and {b} do not broadcast")
    if isinstance(a, int):  # b unknown or symbolic: it is 1 or a
        return a
    if isinstance(b, int):
        return b
    return None


def _broadcast(types: List[Optional[Type]]) -> Optional[Type]:
    """The result type of a broadcasting op over inputs of ``types`` (None when one is unknown)."""
    if not all(isinstance(t, TensorType) for t in types):
        return None
    first = types[0]
    if any(t.shape is None for t in types):
        return TensorType(first.dtype, None)
    rank = max(t.shape.rank for t in types)
    dims: List = [1] * rank
    for t in types:
        padded = (1,) * (rank - t.shape.rank) + tuple(t.shape.dims)
        dims = [_broadcast_dim(a, b) for a, b in zip(dims, padded)]
    return TensorType(first.dtype, Shape(tuple(dims)))


def infer_node(node: Node, opset: int, env: Optional[TypeEnv] = None) -> List[Optional[Type]]:
    """The types of ``node``'s outputs computed from the types of its inputs (``env`` first, then
    what the input values carry); None per output where they cannot be inferred. Never raises for
    an op onnx rejects: its outputs are unknown."""
    env = {} if env is None else env
    unknown: List[Optional[Type]] = [None] * len(node.outputs)
    if node.domain == "passctl":
        if node.op_type in _SAME_AS_FIRST and node.inputs and node.inputs[0] is not None:
            t = _known(node.inputs[0], env)
            return [t] * len(node.outputs)
        return unknown
    if node.domain not in ("", "ai.onnx") or node.subgraphs():
        return unknown
    if node.op_type in _UNARY and len(node.inputs) == 1 and len(node.outputs) == 1:
        t = _known(node.inputs[0], env)
        return [t if isinstance(t, TensorType) else None]
    if node.op_type in _BROADCAST and len(node.inputs) == 2 and None not in node.inputs:
        try:
            return [_broadcast([_known(v, env) for v in node.inputs])]
        except ValueError:  # shapes that do not broadcast: a model onnx would refuse
            return unknown
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError:
        return unknown
    names = ["" if v is None else f"i{i}" for i, v in enumerate(node.inputs)]
    types: Dict[str, onnx.TypeProto] = {}
    data: Dict[str, onnx.TensorProto] = {}
    for name, v in zip(names, node.inputs):
        if v is None:
            continue
        t = _known(v, env)
        if not isinstance(t, TensorType):
            return unknown
        types[name] = type_to_proto(t)
        c = _const_proto(v)
        if c is not None:
            data[name] = c
    proto = onnx.NodeProto()
    proto.op_type = node.op_type
    proto.input.extend(names)
    proto.output.extend(f"o{i}" for i in range(len(node.outputs)))
    from passctl.ir.onnx_protos import ProtoBuilder

    builder = ProtoBuilder()
    try:
        for a in node.attributes.values():
            builder.attr(a, proto.attribute.add())
        out = onnx.shape_inference.infer_node_outputs(
            schema, proto, types, data, opset_imports=[onnx.helper.make_opsetid("", opset)])
    except Exception as e:  # onnx raises InferenceError, RuntimeError, ... for a node it rejects
        logger.debug("type inference of %s failed: %s", node.op_type, e)
        return unknown
    return [type_from_proto(out[f"o{i}"]) if f"o{i}" in out else None
            for i in range(len(node.outputs))]


def infer_upstream(values: Iterable[Optional[Value]], opset: int, env: TypeEnv,
                   budget: int = _UPSTREAM_NODES) -> TypeEnv:
    """Give each of ``values`` that carries no type an inferred one in ``env``, inferring its
    producers (and theirs, up to ``budget`` nodes in all) from what flows into them; so a guard
    that runs before ``infer-shapes`` (or after a pass that left values untyped) still proves."""
    todo: List[Node] = []
    seen: set = set()
    stack = [v for v in values if v is not None]
    while stack and len(todo) < budget:
        v = stack.pop()
        p = v.producer
        if id(v) in env or declared_type(v) is not None or p is None or id(p) in seen:
            continue
        seen.add(id(p))
        todo.append(p)
        stack.extend(i for i in p.inputs if i is not None)
    return infer_nodes(_in_order(todo), opset, env)


def infer_nodes(nodes: Iterable[Node], opset: int, env: Optional[TypeEnv] = None) -> TypeEnv:
    """Infer ``nodes`` in the order given (producers first), each from its inputs' inferred or
    carried types; returns ``env`` with every output's entry."""
    env = {} if env is None else env
    for n in nodes:
        for v, t in zip(n.outputs, infer_node(n, opset, env)):
            if v is not None:
                env[id(v)] = t
    return env


def type_conflict(old: Optional[Type], new: Optional[Type]) -> Optional[str]:
    """Why a value of type ``new`` cannot stand in for one of type ``old`` (different element type,
    rank, or a static dim that differs), or None when no difference is proven."""
    if not (isinstance(old, TensorType) and isinstance(new, TensorType)):
        return None
    if old.dtype != new.dtype:
        return f"element type {old.dtype.short_name} becomes {new.dtype.short_name}"
    if old.shape is None or new.shape is None:
        return None
    if old.shape.rank != new.shape.rank:
        return f"shape [{_dims(old.shape)}] (rank {old.shape.rank}) becomes [{_dims(new.shape)}] " \
               f"(rank {new.shape.rank})"
    for i, (a, b) in enumerate(zip(old.shape.dims, new.shape.dims)):
        if isinstance(a, int) and isinstance(b, int) and a >= 0 and b >= 0 and a != b:
            return f"shape [{_dims(old.shape)}] becomes [{_dims(new.shape)}] (axis {i})"
    return None


def _dims(s: Shape) -> str:
    return ", ".join("?" if d is None else str(d) for d in s.dims)


def _in_order(nodes: Sequence[Node]) -> List[Node]:
    """``nodes`` with producers first (the order within the set, as given, otherwise)."""
    inside = {id(n) for n in nodes}
    done: set = set()
    out: List[Node] = []

    def visit(n: Node) -> None:
        if id(n) in done:
            return
        done.add(id(n))
        for v in n.inputs:
            p = None if v is None else v.producer
            if p is not None and id(p) in inside:
                visit(p)
        out.append(n)

    for n in nodes:
        visit(n)
    return out


def replacement_conflict(old_nodes: Sequence[Node], new_nodes: Sequence[Node],
                         old_values: Sequence[Value], new_values: Sequence[Value],
                         opset: int, assign_types: bool = True) -> Optional[str]:
    """Why ``new_values`` (computed by ``new_nodes``) cannot replace ``old_values`` (computed by
    ``old_nodes``): the first pair whose inferred types differ in element type or static shape,
    as one line naming the value; None when none is proven to differ.

    Both sides are inferred from the types of the values flowing in; where the old side cannot be
    inferred its declared type counts. With ``assign_types`` (the default), each new value still
    without a type then gets one: the replaced value's (inferred, else declared) type where it is
    known, else its own inferred type.
    """
    inside = {id(n) for n in old_nodes}
    for n in new_nodes:  # e.g. Add(conv, conv) -> FusedConv(..., Z=conv): Z is the removed Conv's
        for v in n.inputs:
            if v is not None and v.producer is not None and id(v.producer) in inside:
                return (f"the replacement reads '{v.name}', an output of node "
                        f"'{v.producer.name}' that the rewrite removes")
    outer = [v for n in old_nodes for v in n.inputs
             if v is not None and (v.producer is None or id(v.producer) not in inside)]
    made = {id(n) for n in new_nodes}
    outer += [v for n in new_nodes for v in n.inputs
              if v is not None and (v.producer is None or id(v.producer) not in made)]
    base = infer_upstream(outer, opset, {})
    old_env = infer_nodes(_in_order(old_nodes), opset, dict(base))
    new_env = infer_nodes(_in_order(new_nodes), opset, dict(base))
    for old, new in zip(old_values, new_values):
        old_t = old_env.get(id(old)) or old.type
        new_t = new_env.get(id(new)) if id(new) in new_env else declared_type(new)
        why = type_conflict(old_t, new_t)
        if why is not None:
            return f"the replacement of '{old.name}' would change its type: {why}"
    if not assign_types:
        return None
    created = {id(v): v for n in new_nodes for v in n.outputs if v is not None}
    for old, new in zip(old_values, new_values):
        if id(new) in created and new.type is None:
            new.type = old_env.get(id(old)) or old.type or new_env.get(id(new))
    for vid, v in created.items():
        if v.type is None and new_env.get(vid) is not None:
            v.type = new_env[vid]
    return None


class ReplacementError(ValueError):
    """A replacement would change the element type or static shape of a value it replaces."""


def checked_replace(graph, old_nodes: Sequence[Node], new_nodes: Sequence[Node],
                    old_values: Sequence[Value], new_values: Sequence[Value], opset: int) -> None:
    """``graph.replace_nodes(old_nodes, new_nodes, old_values, new_values)`` after
    :func:`replacement_conflict` found no difference; for passes that build replacements by hand.

    Raises:
        ReplacementError: the replacement changes a value's type (the graph is unchanged; the
            caller detaches ``new_nodes`` with :func:`discard_nodes` and leaves the match alone).
    """
    why = replacement_conflict(old_nodes, new_nodes, old_values, new_values, opset)
    if why is not None:
        raise ReplacementError(why)
    graph.replace_nodes(old_nodes, new_nodes, old_values, new_values)


def discard_nodes(nodes: Iterable[Node]) -> None:
    """Detach the inputs of nodes that were built but never inserted (so the values they read do
    not keep uses by them)."""
    for n in nodes:
        if n.graph is None:
            n.set_inputs(())


__all__ = ["ReplacementError", "TypeEnv", "checked_replace", "declared_type", "discard_nodes",
           "infer_node", "infer_nodes", "replacement_conflict", "type_conflict"]
