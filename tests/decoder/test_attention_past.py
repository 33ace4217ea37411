"""fuse-attention-past on tiny Llama decoders (GQA, MQA) exported with past_key_values by the
dynamo exporter: the KV-cache Concat moves into passctl::Attention, and the lowerings (ONNX
Runtime's GroupQueryAttention with its cache, or Concat + attention) keep ONNX Runtime's results
on the original graph."""

from __future__ import annotations

import numpy as np
import pytest

from decoder_helpers import past_decoder_feeds
from passctl.ir import Shape, TensorType, load
from passctl.ir.onnx_export import to_onnx
from passctl.passes.registry import get_pass
from passctl.support.check import run_onnxruntime

FUSE = ["infer-shapes", "eliminate-identity", "fold-constants", "fuse-rotary", "dce",
        "fuse-attention", "fuse-attention-past", "dce"]
CASES = ((1, 0, 5), (1, 6, 1), (1, 4, 3))
"""(batch, past, new tokens): a prefill, a decode step on a non-empty past, a chunk on a past."""


def _rel(got, ref) -> float:
    return float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30))


def _run(model, names, edit=None):
    stats = {}
    for name in names:
        if edit is not None and name == "fuse-attention-past":
            edit(model)
        stats[name] = get_pass(name)().run(model).stats
    return stats


def _pin_batch(model):
    """Batch 1 for every graph input (what a single-sequence generator runs)."""
    for v in model.graph.inputs:
        if v.shape is not None and v.shape.rank:
            v.type = TensorType(v.dtype, Shape((1,) + tuple(v.shape.dims[1:])))


def _ops(model):
    return [(n.domain, n.op_type) for n in to_onnx(model).graph.node]


def _assert_same(model, path, decoder, cases):
    proto = to_onnx(model)
    for batch, past, seq in cases:
        feeds = past_decoder_feeds(decoder, batch, past, seq, seed=past + 7)
        ref = run_onnxruntime(path, feeds)
        got = run_onnxruntime(proto, feeds)
        assert set(got) == set(ref)
        for name in ref:
            assert _rel(got[name], ref[name]) < 1e-5, (name, batch, past, seq)


def test_cache_concat_moves_into_attention_and_gqa_keeps_logits_and_presents(past_decoder):
    """One passctl::Attention with past per layer, its mask proven causal; with batch 1,
    lower-onnxruntime gives GroupQueryAttention with the cache (no Concat, no repeat_kv Expand
    left) and the original's logits and presents within 1e-5."""
    decoder, path = past_decoder
    layers = decoder.config.num_hidden_layers
    model = load(path)
    _pin_batch(model)
    stats = _run(model, FUSE)
    assert stats["fuse-attention-past"]["attention_past"] == layers
    assert stats["fuse-attention-past"]["causal"] == layers
    attn = [n for n in model.graph if n.domain == "passctl" and n.op_type == "Attention"]
    assert len(attn) == layers and all(len(n.inputs) == 6 and len(n.outputs) == 3 for n in attn)
    assert all(n.attr("kv_num_heads") == decoder.config.num_key_value_heads for n in attn)
    stats = _run(model, ["lower-onnxruntime", "dce"])
    ops = _ops(model)
    assert ops.count(("com.microsoft", "GroupQueryAttention")) == layers, stats
    assert ("", "Softmax") not in ops
    readers = {n.op_type for n in to_onnx(model).graph.node
               if any(i.startswith("past_key_values.") for i in n.input)}
    assert readers <= {"GroupQueryAttention", "Shape"}  # no Concat of the cache, no repeat_kv
    _assert_same(model, path, decoder, CASES)


@pytest.mark.parametrize("lower", ["lower-onnxruntime", "lower-standard"])
def test_dynamic_batch_takes_concat_and_attention_and_stays_exact(past_decoder, lower):
    """With a dynamic batch the kernel's batch-1 limit for chunks on a past is not provable: the
    cache Concat + an attention form without past, the reason in ``fallbacks``; exact for batch 2
    too."""
    decoder, path = past_decoder
    model = load(path)
    stats = _run(model, FUSE + [lower, "dce"])
    assert stats[lower]["Attention+past->Concat+decomposed"] == decoder.config.num_hidden_layers
    if lower == "lower-onnxruntime":
        assert any("batch nor sequence is static 1" in line for line in stats[lower]["fallbacks"])
    _assert_same(model, path, decoder, CASES + ((2, 4, 3), (3, 0, 4)))


def test_a_mask_that_is_not_causal_keeps_the_kernel_away(past_decoder):
    """A mask whose diagonal is dropped (key j < P + i instead of <=) is stricter than causal:
    the node keeps is_causal=0, GroupQueryAttention is not chosen, and the result stays the
    (edited) original's."""
    decoder, path = past_decoder
    model = load(path)
    _pin_batch(model)

    def edit(m):
        (le,) = [n for n in m.graph if n.op_type == "LessOrEqual"]
        le.op_type = "Less"

    stats = _run(model, FUSE + ["lower-onnxruntime"], edit=edit)
    assert stats["fuse-attention-past"] == {"attention_past": 2, "causal": 0}
    assert ("com.microsoft", "GroupQueryAttention") not in _ops(model)
    edited = load(path)
    edit(edited)
    from passctl.ir.onnx_export import save

    save(edited, str(path) + ".edited.onnx")
    # NOTE: fully masked first rows (no key kept without the diagonal at past 0) give the same
    # uniform softmax in both; cases with a past keep every row's earlier keys.
    _assert_same(model, str(path) + ".edited.onnx", decoder, ((1, 4, 3), (1, 6, 1)))


def test_a_concat_of_no_graph_input_is_left_alone(past_decoder):
    """K = Concat(x, new) where x is computed (not the past_key_values input): unfused with a
    reason, nothing rewritten."""
    decoder, path = past_decoder
    model = load(path)

    def edit(m):
        past = next(v for v in m.graph.inputs if v.name == "past_key_values.0.key")
        from passctl.ir import Builder

        cat = next(n for n in m.graph if n.op_type == "Concat" and n.inputs[0] is past)
        neg = Builder(m.graph, before=cat).op("Neg", past)
        cat.set_input(0, neg)

    stats = _run(model, FUSE, edit=edit)
    assert stats["fuse-attention-past"]["attention_past"] == decoder.config.num_hidden_layers - 1
    assert any("is not a rank-4 graph input" in line for line in stats["fuse-attention-past"]["unfused"])
