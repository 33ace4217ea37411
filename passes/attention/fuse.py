"""fuse-attention: every guarded attention pattern -> passctl::Attention; unfused Softmaxes reported."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np

from passctl.ir import Builder, Graph, Model, Node, Shape, TensorType, Value
from passctl.dialect.attention import OP_TYPE
from passctl.passes.attention.patterns import PATTERNS
from passctl.passes.base import PassResult
from passctl.dialect.canonical import DOMAIN, MS_DOMAIN, VERSION, ensure_opset
from passctl.passes.registry import register_pass
from passctl.passes.rewrite import MatchTracer, RuleSet
from passctl.passes.rewrite.pattern import node_label

logger = logging.getLogger(__name__)

_THROUGH = {"Where", "IsNaN", "Cast"}
_TO_SOFTMAX = {"Mul", "Div", "Add", "Where", "Cast"}


@register_pass
class FuseAttention(RuleSet):
    """Replace scaled dot-product attention subgraphs by one ``passctl::Attention`` each.

    Rules: ``pattern_1`` ... ``pattern_72`` (rule objects named ``attention-<n>-<scale>-<mask>-<softmax>``
    in :mod:`passctl.passes.attention.patterns`: 6 ways to write the scale x 3 mask forms x 4 softmax
    forms), rooted at the MatMul with V and all checked by
    one guard (:mod:`passctl.passes.attention.guard`). Run ``infer-shapes`` first: the guard needs
    ranks, the static head count and head size.

    A ``com.microsoft::FusedMatMul(Q, K, transB=1, alpha)`` whose result reaches a Softmax that feeds
    a MatMul (what ``fuse-gemm`` makes of ``Q . Transpose(K)``, or ONNX Runtime's own optimizer of
    ``Q . K^T * s``) is first read as ``Mul(MatMul(Q, Transpose(K)), alpha)`` (ContribOperators.md:
    FusedMatMul = alpha * op(A) . op(B), transB transposing the last two axes), so ``fuse,flash-attn``
    fuses attention like ``flash-attn`` alone; one that then does not fuse is put back as it was.

    Statistics: ``attention`` (fused), ``causal`` and ``grouped_query`` (of those), the count per
    rule, ``fused_matmul_read`` (FusedMatMuls read as MatMul that fused), ``unfused_softmax``
    (Softmax nodes left) and ``unfused`` (one line per such Softmax: its name and the best attempt's
    reason, also logged).
    """

    name = "fuse-attention"
    summary = "Fuse scaled dot-product attention into passctl::Attention (reports unfused Softmax)"

    @dataclass
    class Options:
        """Options of fuse-attention.

        Attributes:
            any_scale: accept a scale other than 1/sqrt(head size) (T5's 1, muP's 1/d).
            max_sweeps: most sweeps over the graph.
        """

        any_scale: bool = field(default=False, metadata={"help": "accept any constant scale"})
        max_sweeps: int = 2

    def __init__(self, options=None, **kwargs):
        tracer = MatchTracer()
        super().__init__(PATTERNS, options, tracer=tracer, **kwargs)
        self.rules = [rule.with_any_scale(self.options.any_scale) for rule in self.rules]

    def run(self, model: Model) -> PassResult:
        opened = [(graph, item) for graph in model.graphs() for item in _open_fused_matmuls(graph)]
        result = super().run(model)
        read = 0
        for graph, item in opened:
            if item[1].graph is None:  # its MatMul went into an attention
                read += 1
            else:
                _close_fused_matmul(graph, *item)
        stats: Dict[str, object] = {"attention": sum(result.stats.values()), "causal": 0,
                                    "grouped_query": 0, "fused_matmul_read": read}
        for node in model.graph.all_nodes():
            if node.domain == DOMAIN and node.op_type == OP_TYPE:
                stats["causal"] += int(node.attr("is_causal", 0))
                stats["grouped_query"] += int(node.attr("kv_num_heads") != node.attr("num_heads"))
        stats.update(result.stats)
        unfused = self.unfused_reasons(model)
        stats["unfused_softmax"] = len(unfused)
        stats["unfused"] = unfused
        for line in unfused:
            logger.info("fuse-attention: not fused: %s", line)
        if result.modified:
            ensure_opset(model, DOMAIN, VERSION)
        return PassResult(result.modified, stats)

    def unfused_reasons(self, model: Model) -> List[str]:
        """``"<Softmax label>: <reason>"`` for every Softmax still in the model (main graph and
        subgraphs), the reason being the furthest any pattern got at the MatMul it feeds."""
        out = []
        for node in model.graph.all_nodes():
            if node.op_type == "Softmax" and node.domain in ("", "ai.onnx"):
                out.append(f"{node_label(node)}: {self._reason(node)}")
        return out

    def _reason(self, softmax: Node) -> str:
        anchors = _matmul_consumers(softmax)
        if not anchors:
            users = ", ".join(node_label(u) for u in softmax.outputs[0].consumers()) or "no consumer"
            return (f"its output reaches no MatMul directly (consumers: {users}; e.g. a mask added "
                    "after Softmax): not softmax(scores) . V")
        best = None
        for anchor in anchors:
            for (rule_name, anchor_id), entry in self.tracer.best.items():
                if anchor_id == id(anchor) and (best is None or entry[0] > best[0]):
                    best = entry + (rule_name,)
        if best is None:
            return "no attention pattern was tried at the MatMul it feeds"
        score, reason, _, anchor, _, rule_name = best
        return f"{reason} (best attempt: {rule_name} at {node_label(anchor)})"


def _feeds_attention_softmax(v: Value) -> bool:
    """Whether ``v`` reaches, through at most 3 of Mul / Div / Add / Where / Cast, a Softmax whose
    output reaches a MatMul as its first input (the scores of an attention)."""
    frontier = [v]
    for _ in range(4):
        nxt = []
        for x in frontier:
            for user in x.consumers():
                if user.op_type == "Softmax" and user.domain in ("", "ai.onnx"):
                    if _matmul_consumers(user):
                        return True
                elif user.op_type in _TO_SOFTMAX and user.domain in ("", "ai.onnx"):
                    nxt.extend(user.outputs)
        frontier = nxt
    return False


def _open_fused_matmuls(graph: Graph):
    """Rewrite every attention-scores ``FusedMatMul(a, b, alpha, transB)`` (no transA, no batch
    transposes) of ``graph`` as ``[Mul(] MatMul(a, [Transpose(] b [)]) [, alpha)]``; returns
    ``(what rebuilds the FusedMatMul, the new MatMul node, the new nodes, the value replacing the
    FusedMatMul's output)`` per rewrite, for :func:`_close_fused_matmul`."""
    out = []
    for node in list(graph):
        if node.domain != MS_DOMAIN or node.op_type != "FusedMatMul" or len(node.inputs) != 2:
            continue
        if any(int(node.attr(a, 0)) for a in ("transA", "transBatchA", "transBatchB")):
            continue
        a, b = node.inputs
        y = node.outputs[0]
        r = None if b.shape is None else b.shape.rank
        if r is None or r < 2 or a.dtype is None or not _feeds_attention_softmax(y):
            continue
        bld = Builder(graph, provenance=node.provenance, insert=False)
        if int(node.attr("transB", 0)):
            perm = list(range(r - 2)) + [r - 1, r - 2]
            bt = bld.op("Transpose", b, perm=perm)
            if b.dtype is not None:
                bt.type = TensorType(b.dtype, Shape([b.shape.dims[p] for p in perm]))
            b = bt
        mm = bld.op("MatMul", a, b)
        mm.type = y.type if y.shape is not None else _matmul_type(a, b)
        last = mm
        alpha = float(node.attr("alpha", 1.0))
        if alpha != 1.0:
            scale = graph.add_constant(np.array(alpha, dtype=a.dtype.numpy()), "attn_alpha")
            last = bld.op("Mul", mm, scale)
            last.type = mm.type
        # NOTE: the node to put back is built only then: a node out of the graph would still count as
        # a consumer of a and b (the patterns check single use).
        spec = (node.domain, node.op_type, list(node.inputs), list(node.attributes.values()), y.name,
                node.name, node.provenance)
        graph.replace_nodes([node], bld.nodes, [y], [last])
        out.append((spec, mm.producer, bld.nodes, last))
    return out


def _matmul_type(a: Value, b: Value):
    """``MatMul(a, b)``'s type when both ranks are known, equal (>= 2) and the batch dims agree
    (infer-shapes does not know FusedMatMul, whose output the patterns need ranked); else a's
    dtype with an unknown shape."""
    if a.shape is not None and b.shape is not None and a.shape.rank == b.shape.rank >= 2 and \
            tuple(a.shape.dims[:-2]) == tuple(b.shape.dims[:-2]):
        return TensorType(a.dtype, Shape(list(a.shape.dims[:-1]) + [b.shape.dims[-1]]))
    return TensorType(a.dtype, None)


def _close_fused_matmul(graph: Graph, spec, matmul: Node, nodes: List[Node], last: Value) -> None:
    """Put back the FusedMatMul :func:`_open_fused_matmuls` opened when no attention took it."""
    if any(n.graph is not graph for n in nodes):
        return  # a rule consumed part of it: leave the standard ops
    domain, op_type, inputs, attrs, y_name, name, provenance = spec
    y = Value(graph.fresh_name(y_name), last.type)
    fused = Node(domain, op_type, inputs, attrs, [y], name=name, provenance=provenance)
    graph.replace_nodes(nodes, [fused], [last], [y])
    for n in nodes:
        for x in n.inputs:
            if x is not None and x.is_initializer() and x.name.startswith("attn_alpha") and \
                    not x.consumers():
                graph.remove_initializer(x.name)


def _matmul_consumers(softmax: Node) -> List[Node]:
    """MatMul nodes reached from the Softmax output directly or through Where/IsNaN/Cast."""
    out, frontier, seen = [], [softmax.outputs[0]], set()
    for _ in range(3):
        nxt = []
        for v in frontier:
            for user in v.consumers():
                if user in seen:
                    continue
                seen.add(user)
                if user.op_type == "MatMul" and user.inputs[0] is v:
                    out.append(user)
                elif user.op_type in _THROUGH:
                    nxt.extend(user.outputs)
        frontier = nxt
    return out


__all__ = ["FuseAttention"]
