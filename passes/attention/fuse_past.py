"""fuse-attention-past: ``present = Concat(past, new)`` feeding a ``passctl::Attention`` -> one
``passctl::Attention`` with past inputs and present outputs (the KV cache inside the op)."""

from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple

import numpy as np

from passctl.dialect.attention import OP_TYPE
from passctl.dialect.canonical import DOMAIN
from passctl.ir import Builder, Graph, Model, Node, Value
from passctl.passes.attention.cone import subgraph_model
from passctl.passes.attention.layout import dims
from passctl.passes.base import Pass, PassResult
from passctl.passes.common.constants import constant_array, constant_tensor
from passctl.passes.registry import register_pass

logger = logging.getLogger(__name__)

_CONE_LIMIT = 300
_PROBES = ((1, 0, 3), (2, 3, 2), (1, 5, 1))
"""(batch, past length, new tokens) the mask is evaluated on."""


@register_pass
class FuseAttentionPast(Pass):
    """Move the KV-cache concatenation of a decoder into ``passctl::Attention`` (past/present).

    Rules (after ``fuse-attention``; K and V alike):
      1. ``Attention(Q, K, V, Mask)`` with ``K = Concat(past_key, K_new, axis=2)`` where
         ``past_key`` is a rank-4 graph input ``[B, Hkv, P, D]`` -> ``Attention(Q, K_new, V_new,
         Mask, past_key, past_value)`` with outputs ``(Y, present_key, present_value)``; the Concat
         outputs (the model's ``present.N.*``) become the op's outputs.
      2. K taken through transformers' ``repeat_kv`` (``Reshape(Expand(Unsqueeze(present, 2)))``
         to ``[B, H, T, D]``, both exporters) for GQA and MQA: ``kv_num_heads`` becomes the
         cache's head count Hkv (head h reads KV head h // (H / Hkv), what repeat_kv computes).
    ``is_causal`` is set (with past: key j is masked for query i when j > P + i, bottom-right
    aligned) only when the mask provably holds that causal part: the mask's computation, which may
    read only the Optimum / onnxruntime-genai inputs (``input_ids``, ``attention_mask``,
    ``position_ids``, ``past_key_values.*``), is run in ONNX Runtime for several (batch, past,
    new) sizes with an all-ones attention_mask (it must be exactly the causal mask: 0 / True where
    kept, <= -1e4 / False elsewhere) and with padding (it must keep no key the causal mask drops).
    A node whose K and V are not both a cache concat is left alone (statistic ``unfused``).

    Statistics: ``attention_past`` (nodes rewritten), ``causal`` (of those, proven causal).
    """

    name = "fuse-attention-past"
    summary = "Move KV-cache Concat(past, new) into passctl::Attention (past inputs, present outputs)"

    def run(self, model: Model) -> PassResult:
        stats: Dict[str, object] = {"attention_past": 0, "causal": 0}
        unfused: List[str] = []
        self._model = model
        causal_masks: Dict[Value, bool] = {}
        for graph in model.graphs():
            for node in list(graph):
                if node.domain != DOMAIN or node.op_type != OP_TYPE or len(node.inputs) > 4:
                    continue
                why = self._rewrite(graph, node, causal_masks, stats)
                if why:
                    unfused.append(f"Attention '{node.name}': {why}")
        if unfused:
            stats["unfused"] = unfused
        return PassResult(stats["attention_past"] > 0, stats)

    def _rewrite(self, graph: Graph, node: Node, causal_masks: dict, stats: dict) -> Optional[str]:
        q, k, v = node.inputs[:3]
        mask = node.inputs[3] if len(node.inputs) > 3 else None
        heads = node.attr("num_heads")
        found = []
        for x in (k, v):
            present, why = _unrepeat(x, heads)
            if why:
                return why
            cat = present.producer
            if cat is None or cat.op_type != "Concat" or cat.domain != "" or len(cat.inputs) != 2 \
                    or cat.attr("axis") not in (2, -2):
                return f"'{present.name}' is not Concat(past, new, axis=2)"
            past, new = cat.inputs
            if not past.is_graph_input() or dims(past) is None or len(dims(past)) != 4:
                return f"'{past.name}' (the past of '{present.name}') is not a rank-4 graph input"
            found.append((cat, past, new, present))
        (kcat, past_k, k_new, present_k), (vcat, past_v, v_new, present_v) = found
        kv_heads = dims(past_k)[1]
        if not isinstance(kv_heads, int) or dims(past_v)[1] != kv_heads or heads % kv_heads:
            return f"the cache's head count {kv_heads} does not divide {heads} query heads"
        causal = causal_masks.get(mask) if mask is not None else False
        if causal is None:
            causal = _causal_mask(self._model, node, mask, past_k, q)
            causal_masks[mask] = causal
        attrs = {name: node.attr(name) for name in node.attributes}
        attrs.update(kv_num_heads=kv_heads, is_causal=1 if causal else 0)
        b = Builder(graph, provenance=node.provenance, insert=False)
        ins = [q, k_new, v_new, mask, past_k, past_v]
        y, pk, pv = b.op(OP_TYPE, *ins, domain=DOMAIN, outputs=3, **attrs,
                         output_names=[node.outputs[0].name, present_k.name + "_", present_v.name + "_"])
        for new, old in ((y, node.outputs[0]), (pk, present_k), (pv, present_v)):
            new.type = old.type
        try:
            graph.replace_nodes([node, kcat, vcat], b.nodes, [node.outputs[0], present_k, present_v],
                                [y, pk, pv])
        except ValueError as e:
            return str(e)
        stats["attention_past"] += 1
        stats["causal"] += int(bool(causal))
        return None


def _ints(v: Optional[Value]) -> Optional[List[int]]:
    arr = constant_array(v)
    return None if arr is None else [int(i) for i in np.asarray(arr).reshape(-1)]


def _unrepeat(x: Value, heads: int) -> Tuple[Optional[Value], str]:
    """(the [B, Hkv, T, D] value that transformers' repeat_kv read, or x itself, "") or why not."""
    reshape = x.producer
    if reshape is None or reshape.op_type != "Reshape":
        return x, ""
    expand = reshape.inputs[0].producer
    unsq = expand.inputs[0].producer if expand is not None and expand.op_type == "Expand" else None
    if unsq is None or unsq.op_type != "Unsqueeze":
        return x, ""
    axes = _ints(unsq.inputs[1]) if len(unsq.inputs) > 1 else unsq.attr("axes")
    src = unsq.inputs[0]
    xd, sd = dims(x), dims(src)
    if list(axes or []) != [2] or xd is None or sd is None or len(xd) != 4 or len(sd) != 4:
        return None, f"'{x.name}' is not repeat_kv of a [B, Hkv, T, D] cache"
    if xd[1] != heads or not isinstance(sd[1], int) or heads % sd[1] or xd[2:] != sd[2:] \
            or xd[0] != sd[0]:
        return None, (f"'{x.name}' {xd} is not repeat_kv of '{src.name}' {sd} to {heads} heads "
                      "(axes 0, 2, 3 kept, heads multiplied)")
    return src, ""


def _cone(mask: Value):
    """(nodes computing ``mask`` in graph order, the graph inputs they read) or (reason, None)."""
    nodes: Dict[Node, None] = {}
    leaves: Dict[Value, None] = {}
    stack, seen = [mask], set()
    while stack:
        v = stack.pop()
        if v is None or v in seen:
            continue
        seen.add(v)
        if v.producer is None:
            if constant_tensor(v) is None:
                leaves[v] = None
            continue
        node = v.producer
        if node.subgraphs() or node.domain not in ("", "ai.onnx"):
            return "the mask is computed with control flow or non-standard ops", None
        nodes[node] = None
        if len(nodes) > _CONE_LIMIT:
            return f"the mask takes more than {_CONE_LIMIT} nodes", None
        stack.extend(node.inputs)
    order = {n: i for i, n in enumerate(mask.producer.graph)}
    return sorted(nodes, key=lambda n: order.get(n, 0)), list(leaves)


def _feed(leaf: Value, batch: int, past: int, new: int, padded: bool) -> Optional[np.ndarray]:
    """A value of one decoder-layout input for the probe (None: not such an input)."""
    name = leaf.name
    if name == "input_ids":
        return np.zeros((batch, new), np.int64)
    if name == "position_ids":
        return np.tile(np.arange(past, past + new, dtype=np.int64), (batch, 1))
    if name == "attention_mask":
        m = np.ones((batch, past + new), np.int64)
        if padded and past + new > 1:
            m[0, 0] = 0  # a left-padded first row
        return m
    if name.startswith("past_key_values.") and dims(leaf) is not None and len(dims(leaf)) == 4:
        kv, d = dims(leaf)[1], dims(leaf)[3]
        if isinstance(kv, int) and isinstance(d, int):
            return np.zeros((batch, kv, past, d), leaf.dtype.numpy())
    return None


def _causal_mask(model: Model, node: Node, mask: Value, past: Value, q: Value) -> bool:
    """Whether ``mask`` provably holds the bottom-right causal part (see :class:`FuseAttentionPast`)."""
    kind = node.attr("mask_kind", "none")
    if kind not in ("additive", "boolean"):
        return False
    cone, leaves = _cone(mask)
    if leaves is None:
        logger.info("fuse-attention-past: mask '%s': %s", mask.name, cone)
        return False
    from passctl.support.check import cpu_session

    try:
        session = cpu_session(subgraph_model(model, cone, leaves, [mask]).SerializeToString(),
                              optimize=False, threads=1)
        for batch, p, s in _PROBES:
            causal = np.arange(p + s)[None, :] <= (p + np.arange(s))[:, None]  # [S, T]
            for padded in (False, True):
                feeds = {leaf.name: _feed(leaf, batch, p, s, padded) for leaf in leaves}
                if any(a is None for a in feeds.values()):
                    return False
                (got,) = session.run(None, feeds)
                got = np.broadcast_to(got, (batch, got.shape[1], s, p + s))
                kept = got if kind == "boolean" else got == 0
                dropped = ~got if kind == "boolean" else got <= -1e4
                if not np.all(kept | dropped):
                    return False
                if np.any(kept & ~causal):
                    return False
                if not padded and not np.all(kept == causal):
                    return False
    except Exception as e:  # noqa: BLE001 - a mask ONNX Runtime cannot run alone: not proven
        logger.info("fuse-attention-past: mask '%s' not evaluated: %s", mask.name, e)
        return False
    return True


__all__ = ["FuseAttentionPast"]
