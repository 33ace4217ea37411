"""A user's past-key-values decoder (Optimum / onnxruntime-genai layout) rewritten into passctl's
``passctl-static-kv`` layout: a static cache of ``max_length`` rows that past and present share."""

from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple

import numpy as np

from passctl.dialect.attention import OP_TYPE
from passctl.dialect.canonical import DOMAIN, MS_DOMAIN, ensure_opset
from passctl.ir import Builder, DataType, Model, Node, Shape, TensorType, Value
from passctl.ir.errors import UserError
from passctl.passes.attention.layout import head_split_roles
from passctl.passes.decoder.graph import LAYOUT
from passctl.passes.registry import get_pass

logger = logging.getLogger(__name__)

FUSE_PIPELINE = ("infer-shapes", "eliminate-identity", "fold-constants", "fuse-rotary", "dce",
                 "fuse-attention", "fuse-attention-past", "fuse-projections", "dce")
# NOTE: fuse-projections last: the attention guard traces Q/K/V to their own head-split Reshapes.
"""The passes that make the canonical ops the rewrite needs (fuse-rotary gets max_positions)."""


def _run(model: Model, names, **options) -> Dict[str, dict]:
    stats = {}
    for name in names:
        stats[name] = get_pass(name)(**options.get(name, {})).run(model).stats
    return stats


def to_static_kv(model: Model, max_length: int, name: str = "model") -> Dict[str, dict]:
    """Rewrite ``model`` (the past-key-values layout, docs/generate.md) in place into the
    ``passctl-static-kv`` layout of :mod:`passctl.passes.decoder.graph`.

    Steps: the canonical passes (:data:`FUSE_PIPELINE`: rotary with caches of ``max_length`` rows,
    attention with past); inputs ``seqlens_k`` int32 [batch] and ``total_sequence_length`` int32
    [] replace ``attention_mask`` (all ones of the total length) and ``position_ids`` (P .. P+S-1,
    P = total - S), which the graph then computes; every ``passctl::Attention`` with past becomes
    ``com.microsoft::GroupQueryAttention`` with the cache ``[batch, kv, max_length, head_dim]``
    (past and present one buffer, written at rows P .. P+S-1; its causal mask replaces the
    model's, which fuse-attention-past proved equal for an all-ones attention_mask; the rotary of
    Q and K moves into it as ``do_rotary`` with the folded cos/sin caches); the cache's
    other readers must be ``Shape`` nodes, which then read P; ``logits`` keeps the last position
    ([batch, 1, vocab]); metadata ``passctl.layout`` / ``passctl.max_length``; canonical ops left
    are lowered for ONNX Runtime.

    Returns:
        The statistics of the passes run.

    Raises:
        UserError: one line naming ``name`` and what was not recognized (an attention without
            the cache inside, a mask not proven causal, the cache read by other ops); ``model``
            may then be partly rewritten (the caller works on its own copy).
    """
    if model.opset < 15:
        raise UserError(f"{name}: opset {model.opset} is below 15; export the decoder with opset "
                        ">= 15 (torch.onnx.export(..., opset_version=18))")
    stats = _run(model, FUSE_PIPELINE, **{"fuse-rotary": {"max_positions": max_length}})
    g = model.graph
    inputs = {v.name: v for v in g.inputs}
    layers = sorted(int(k.split(".")[1]) for k in inputs if k.startswith("past_key_values.")
                    and k.endswith(".key"))
    attn: Dict[int, Node] = {}
    for node in g:
        if node.domain == DOMAIN and node.op_type == OP_TYPE:
            past = node.inputs[4] if len(node.inputs) > 5 else None
            if past is None:
                raise UserError(f"{name}: attention '{node.name}' does not read the KV cache as "
                                f"'past + new' (fuse-attention-past: "
                                f"{_why(stats, 'fuse-attention-past')}); it cannot be given a "
                                "static cache")
            attn[int(past.name.split(".")[1])] = node
    if sorted(attn) != layers:
        fused = stats["fuse-attention"]
        raise UserError(f"{name}: attention with the KV cache found in layers {sorted(attn)} of "
                        f"{layers} (fuse-attention: {fused.get('unfused') or 'no reason'}); export it "
                        "with eager attention or use the past-key-values layout as it is")
    for node in attn.values():
        if not int(node.attr("is_causal", 0)) or int(node.attr("nan_to_zero", 0)):
            raise UserError(f"{name}: attention '{node.name}' has a mask not proven causal from "
                            "attention_mask; it cannot run GroupQueryAttention's causal cache")
    first = next(iter(g))
    b = Builder(g, before=first)
    seqlens = g.add_input(Value("seqlens_k", TensorType(DataType.INT32, Shape(("batch",)))))
    total = g.add_input(Value("total_sequence_length", TensorType(DataType.INT32, Shape(()))))
    i64 = lambda v, n: g.add_constant(np.array(v, np.int64), n)  # noqa: E731
    ids = inputs["input_ids"]
    total1 = b.op("Reshape", b.op("Cast", total, to=7), i64([1], "static_kv_1d"))
    batch = b.op("Shape", ids, start=0, end=1)
    seq = b.op("Shape", ids, start=1, end=2)
    past_len = b.op("Sub", total1, seq)
    mask = b.op("ConstantOfShape", b.op("Concat", batch, total1, axis=0),
                value=np.ones(1, np.int64))
    steps = b.op("Range", i64(0, "static_kv_zero"), b.op("Squeeze", seq), i64(1, "static_kv_one"))
    pos = b.op("Expand", b.op("Unsqueeze", b.op("Add", steps, past_len), i64([0], "static_kv_ax0")),
               b.op("Concat", batch, seq, axis=0))
    for key, value in (("attention_mask", mask), ("position_ids", pos)):
        if key in inputs:
            inputs[key].replace_all_uses_with(value)
            g.remove_input(inputs[key])
    heads_done = set()
    for layer, node in attn.items():
        _attention(g, node, seqlens, total, max_length, heads_done, pos)
    for layer in layers:
        for kind in ("key", "value"):
            _shape_readers(g, inputs[f"past_key_values.{layer}.{kind}"], past_len, name)
    _last_logits(g, name)
    model.metadata_props.update({"passctl.layout": LAYOUT, "passctl.max_length": str(max_length)})
    ensure_opset(model, MS_DOMAIN, 1)
    stats.update(_run(model, ("dce", "lower-onnxruntime", "dce")))
    left = sorted({n.op_type for n in g if n.domain == DOMAIN})
    if left:
        raise UserError(f"{name}: passctl::{', passctl::'.join(left)} found no ONNX Runtime form")
    return stats


def _why(stats: Dict[str, dict], name: str) -> str:
    return "; ".join(stats.get(name, {}).get("unfused", [])) or "no Concat(past, new) found"


def _rotary_pair(q: Value, k: Value, pos: Value) -> Optional[Tuple[Value, Value, Node]]:
    """(Q and K before rotary, Q's rotary node) when both come from ``passctl::RotaryEmbedding``
    of the same caches at the positions the static layout computes (GroupQueryAttention's own
    rotary then applies it, at positions seqlens_k - S + 1 .. seqlens_k = P .. P + S - 1)."""
    rq, rk = q.producer, k.producer
    if any(r is None or r.domain != DOMAIN or r.op_type != "RotaryEmbedding" for r in (rq, rk)):
        return None
    if rq.inputs[1:4] != rk.inputs[1:4] or rq.inputs[1] is not pos or any(
            int(r.attr("rotary_embedding_dim", 0) or 0) for r in (rq, rk)) or \
            int(rq.attr("interleaved", 0)) != int(rk.attr("interleaved", 0)):
        return None
    return rq.inputs[0], rk.inputs[0], rq


def _attention(g, node: Node, seqlens: Value, total: Value, max_length: int, done: set,
               pos: Value) -> None:
    """``node`` (passctl::Attention with past) -> GroupQueryAttention on the shared cache (with
    ``do_rotary`` when rotary feeds Q and K: :func:`_rotary_pair`)."""
    q, k, v, _, past_k, past_v = node.inputs[:6]
    rotary = _rotary_pair(q, k, pos)
    extra, attrs = [], {}
    if rotary is not None:
        q, k, rq = rotary
        extra = [rq.inputs[2], rq.inputs[3]]
        attrs = {"do_rotary": 1, "rotary_interleaved": int(rq.attr("interleaved", 0))}
    heads, kv_heads = int(node.attr("num_heads")), int(node.attr("kv_num_heads"))
    hd = past_k.shape[3]
    for past in (past_k, past_v):
        if past not in done:
            past.type = TensorType(past.dtype, Shape(("batch", kv_heads, max_length, hd)))
            done.add(past)
    b = Builder(g, provenance=node.provenance, insert=False)
    flat = [_bsd(b, g, x, h, hd) for x, h in ((q, heads), (k, kv_heads), (v, kv_heads))]
    split = flat[0].producer
    if split is not None and split.op_type == "Split" and list(split.outputs) == flat and \
            split.attr("axis") in (-1, 2):
        flat = [split.inputs[0], None, None]  # packed Q/K/V (fuse-projections)
    y, pk, pv = b.op("GroupQueryAttention", *flat, past_k, past_v, seqlens, total, *extra,
                     domain=MS_DOMAIN, outputs=3, num_heads=heads, kv_num_heads=kv_heads,
                     scale=float(node.attr("scale")), **attrs)
    y4 = b.op("Transpose", b.op("Reshape", y, g.add_constant(np.array([0, 0, heads, hd], np.int64),
                                                            "static_kv_bshd")), perm=[0, 2, 1, 3])
    y4.type = node.outputs[0].type
    for new, past in ((pk, past_k), (pv, past_v)):
        new.type = past.type
    g.replace_nodes([node], b.nodes, list(node.outputs), [y4, pk, pv])


def _bsd(b: Builder, g, x: Value, heads: int, hd: int) -> Value:
    """``x`` [B, H, S, D] as [B, S, H * D]: the projection itself when ``x`` is
    ``Transpose(Reshape(y, [B, S, H, D]), (0, 2, 1, 3))`` of a 3-D ``y`` (the head split, its axis
    roles checked as the attention guard does), else Transpose + Reshape."""
    t = x.producer
    if t is not None and t.op_type == "Transpose" and list(t.attr("perm") or ()) == [0, 2, 1, 3]:
        r = t.inputs[0].producer
        if r is not None and r.op_type == "Reshape" and head_split_roles(r) == ("B", "S", "H", "D") \
                and r.inputs[0].shape is not None and r.inputs[0].shape[2] == heads * hd:
            return r.inputs[0]
    return b.op("Reshape", b.op("Transpose", x, perm=[0, 2, 1, 3]),
                g.add_constant(np.array([0, 0, heads * hd], np.int64), "static_kv_bsd"))


def _shape_readers(g, past: Value, past_len: Value, name: str) -> None:
    """Nodes other than GroupQueryAttention reading the cache: ``Shape`` nodes get the shape of
    the logical past [batch, kv, P, head_dim]; anything else is refused."""
    for node, _ in past.uses():
        if node.domain == MS_DOMAIN and node.op_type == "GroupQueryAttention":
            continue
        if node.op_type != "Shape" or node.domain != "":
            raise UserError(f"{name}: '{past.name}' is read by {node.op_type} '{node.name}' "
                            "besides attention; a static cache cannot stand in for it")
        b = Builder(g, before=node, provenance=node.provenance)
        full = b.op("Concat", b.op("Shape", past, start=0, end=2), past_len,
                    b.op("Shape", past, start=3, end=4), axis=0)
        start, end = node.attr("start", 0), node.attr("end", None)
        out = full if (start, end) in ((0, None), (0, 4)) else b.op(
            "Slice", full, g.add_constant(np.array([start], np.int64), "static_kv_s"),
            g.add_constant(np.array([4 if end is None else end], np.int64), "static_kv_e"))
        node.outputs[0].replace_all_uses_with(out)
        g.remove(node)


def _last_logits(g, name: str) -> None:
    """``logits`` [batch, sequence, vocab] -> the last position [batch, 1, vocab]."""
    outs = [v for v in g.outputs if v.name == "logits"]
    if not outs or outs[0].shape is None or outs[0].shape.rank != 3:
        raise UserError(f"{name}: 'logits' is not [batch, sequence, vocab]")
    old = outs[0]
    b = Builder(g)
    last = b.op("Slice", old, g.add_constant(np.array([-1], np.int64), "static_kv_last"),
                g.add_constant(np.array([np.iinfo(np.int64).max], np.int64), "static_kv_end"),
                g.add_constant(np.array([1], np.int64), "static_kv_axis1"))
    vocab = old.shape[2]
    old.name = g.fresh_name("logits_all")
    last.name = "logits"
    last.type = TensorType(old.dtype, Shape(("batch", 1, vocab)))
    g.outputs[g.outputs.index(old)] = last


__all__ = ["FUSE_PIPELINE", "to_static_kv"]
