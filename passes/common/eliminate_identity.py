"""eliminate-identity: remove nodes that return their input unchanged (Identity, no-op Cast, ...)."""

from __future__ import annotations

import logging
from typing import Dict, Optional

import numpy as np

from passctl.ir import Graph, Model, Node, TensorType, Value
from passctl.ir.printer import type_text
from passctl.passes.base import Pass, PassResult
from passctl.passes.common.constants import constant_array, is_standard_op
from passctl.passes.common.infer_shapes import merge_types
from passctl.passes.registry import register_pass
from passctl.passes.rewrite.types import infer_node, type_conflict

logger = logging.getLogger(__name__)


@register_pass
class EliminateIdentity(Pass):
    """Remove nodes whose (first) output equals their first input.

    Rules (default-domain ops only; the stat key in brackets):
      1. ``Identity`` [identity].
      2. ``Dropout`` in inference: no ``training_mode`` input, or a constant false one; its mask
         output unused (Dropout-13 spec: in inference the output is the input) [dropout].
      3. ``Cast`` to the input's own element type [cast].
      4. ``Reshape`` whose target shape (constant; 0 copies a dim unless ``allowzero``, -1 is
         inferred) equals the input's static shape [reshape].

    For rules 3 and 4 the input's type must be proven: where its producer's output type can be
    inferred from the producer's inputs (onnx's per-node inference), that type counts, and a
    declared type it contradicts (a stale ``value_info``) is ignored with a warning, so a Reshape
    that changes the shape is never dropped.
      5. ``Transpose`` whose ``perm`` is 0, 1, ..., r-1 (without ``perm`` only rank <= 1) [transpose].

    Output names are kept: when the removed node's output is a graph output, the input value
    takes the output's name if it is produced by a node of the same graph and is neither a graph
    input nor already a graph output; otherwise the node stays. The input value keeps the more
    precise of the two types (a declared output shape is not lost). Subgraphs and function bodies
    are processed too.

    Statistics: the per-rule counts above, and ``removed`` (their sum).
    """

    name = "eliminate-identity"
    summary = "Remove Identity and no-op Dropout, Cast, Reshape and Transpose nodes"

    def run(self, model: Model) -> PassResult:
        stats = {"identity": 0, "dropout": 0, "cast": 0, "reshape": 0, "transpose": 0}
        opset = model.opset or 21
        _eliminate(model.graph, stats, opset)
        for fn in model.functions.values():
            _eliminate(fn.graph, stats, opset)
        stats["removed"] = sum(stats.values())
        return PassResult(stats["removed"] > 0, stats)


def _eliminate(graph: Graph, stats: Dict[str, int], opset: int) -> None:
    for node in graph:
        for sub in node.subgraphs():
            _eliminate(sub, stats, opset)
        kind = _noop_kind(node, opset)
        if kind is None:
            continue
        if _bypass(graph, node):
            stats[kind] += 1


def _input_type(x: Value, opset: int) -> Optional[TensorType]:
    """The type of ``x`` as far as it is proven: what its producer computes from its own inputs'
    types where that can be inferred (a stale declared shape of ``x`` then does not count), else
    the type ``x`` declares. None when inference contradicts nothing and nothing is declared."""
    declared = x.type if isinstance(x.type, TensorType) else None
    p = x.producer
    if p is None or x.const is not None:
        return declared
    inferred = infer_node(p, opset)[x.index] if x.index is not None else None
    if not isinstance(inferred, TensorType):
        return declared
    if declared is not None and type_conflict(declared, inferred) is not None:
        logger.warning("eliminate-identity: '%s' is declared %s but %s computes %s; the computed "
                       "type counts", x.name, type_text(declared), p.op_type, type_text(inferred))
        return inferred
    if declared is not None and declared.shape is not None and (
            inferred.shape is None or not inferred.shape.is_static()):
        return declared
    return inferred


def _noop_kind(node: Node, opset: int = 21) -> Optional[str]:
    """The rule name when ``node`` is a no-op, else None."""
    if not is_standard_op(node) or not node.inputs or node.inputs[0] is None:
        return None
    x = node.inputs[0]
    op = node.op_type
    if op in ("Cast", "Reshape"):
        # A no-op on the declared type is confirmed on the computed one (inference only then).
        declared = x.type if isinstance(x.type, TensorType) else None
        for xt in (declared, "proven"):
            if xt == "proven":
                xt = _input_type(x, opset)
            if op == "Cast":
                to = node.attr("to")
                if xt is None or to is None or int(xt.dtype) != int(to):
                    return None
            elif not _reshape_is_noop(node, xt):
                return None
        return op.lower()
    if op == "Identity":
        return "identity"
    if op == "Dropout":
        if len(node.outputs) > 1 and (node.outputs[1].uses() or node.outputs[1].is_graph_output()):
            return None
        training = node.inputs[2] if len(node.inputs) > 2 else None
        if training is not None:
            flag = constant_array(training)
            if flag is None or bool(np.asarray(flag).reshape(-1)[0]):
                return None
        return "dropout"
    if op == "Transpose":
        rank = x.shape.rank if x.shape is not None else None
        perm = node.attr("perm")
        if perm is None:
            return "transpose" if rank is not None and rank <= 1 else None
        return "transpose" if tuple(perm) == tuple(range(len(perm))) else None
    return None


def _reshape_is_noop(node: Node, xt: Optional[TensorType]) -> bool:
    """Whether Reshape ``node`` returns its input's shape; ``xt`` is the input's proven type."""
    shape = None if xt is None else xt.shape
    if shape is None or not shape.is_static() or len(node.inputs) < 2:
        return False
    target = constant_array(node.inputs[1])
    if target is None:
        return False
    target = [int(d) for d in np.asarray(target).reshape(-1)]
    dims = list(shape.dims)
    if len(target) != len(dims):
        return False
    allowzero = node.attr("allowzero", 0)
    resolved = []
    for i, d in enumerate(target):
        if d == 0 and not allowzero:
            d = dims[i]
        resolved.append(d)
    if resolved.count(-1) == 1:
        known = int(np.prod([d for d in resolved if d != -1], dtype=np.int64))
        total = int(np.prod(dims, dtype=np.int64))
        if known == 0 or total % known:
            return False
        resolved[resolved.index(-1)] = total // known
    return resolved == dims


def _bypass(graph: Graph, node: Node) -> bool:
    """Rewire ``node``'s first output to its first input and remove it; False when it must stay."""
    x, y = node.inputs[0], node.outputs[0]
    if node.op_type != "Cast":
        merged, conflict = merge_types(x.type, y.type)
        if merged is not None and not conflict:
            x.type = merged
    if any(o is y for o in graph.outputs):
        local = x.producer is not None and x.producer.graph is graph
        if not local or x.is_graph_input() or any(o is x for o in graph.outputs):
            return False
        y.replace_all_uses_with(x, replace_graph_outputs=True)
    else:
        y.replace_all_uses_with(x)
    graph.remove(node, safe=True)
    return True
