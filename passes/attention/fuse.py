"""fuse-attention: every guarded attention pattern -> passctl::Attention; unfused Softmaxes reported."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, List

from passctl.ir import Model, Node
from passctl.dialect.attention import OP_TYPE
from passctl.passes.attention.patterns import PATTERNS
from passctl.passes.base import PassResult
from passctl.dialect.canonical import DOMAIN, VERSION, ensure_opset
from passctl.passes.registry import register_pass
from passctl.passes.rewrite import MatchTracer, RuleSet
from passctl.passes.rewrite.pattern import node_label

logger = logging.getLogger(__name__)

_THROUGH = {"Where", "IsNaN", "Cast"}


@register_pass
class FuseAttention(RuleSet):
    """Replace scaled dot-product attention subgraphs by one ``passctl::Attention`` each.

    Rules: ``pattern_1`` ... ``pattern_72`` (rule objects named ``attention-<n>-<scale>-<mask>-<softmax>``
    in :mod:`passctl.passes.attention.patterns`: 6 ways to write the scale x 3 mask forms x 4 softmax
    forms), rooted at the MatMul with V and all checked by
    one guard (:mod:`passctl.passes.attention.guard`). Run ``infer-shapes`` first: the guard needs
    ranks, the static head count and head size.

    Statistics: ``attention`` (fused), ``causal`` and ``grouped_query`` (of those), the count per
    rule, ``unfused_softmax`` (Softmax nodes left) and ``unfused`` (one line per such Softmax: its
    name and the best attempt's reason, also logged).
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
        result = super().run(model)
        stats: Dict[str, object] = {"attention": sum(result.stats.values()), "causal": 0,
                                    "grouped_query": 0}
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
