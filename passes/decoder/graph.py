"""One ONNX graph for prefill and decode of a Llama-style decoder, with a static KV cache.

The graph (``LAYOUT = "passctl-static-kv"``) has these inputs and outputs (``L`` layers,
``KV`` key/value heads, ``H`` head size, ``M`` the cache length chosen at export)::

    input_ids               int64   [batch, sequence]      tokens of this chunk (prompt or 1)
    seqlens_k               int32   [batch]                tokens in the cache after this chunk,
                                                           minus 1 (GroupQueryAttention's input)
    total_sequence_length   int32   []                     tokens after this chunk (max over batch)
    past_key_values.N.key   float32 [batch, KV, M, H]      the cache of layer N (N = 0 .. L-1)
    past_key_values.N.value float32 [batch, KV, M, H]
    ->
    logits                  float32 [batch, 1, vocab]      logits of the chunk's last token
    present.N.key           float32 [batch, KV, M, H]      the cache with this chunk written at
    present.N.value         float32 [batch, KV, M, H]      positions seqlens_k-sequence+1 ..
                                                           seqlens_k

The runtime binds ``present.N.*`` to the very buffers of ``past_key_values.N.*`` (ONNX Runtime I/O
binding): GroupQueryAttention then writes the new keys and values in place at the current
position and reads the rest, so a decode step (``sequence`` = 1) has fixed shapes and copies no
cache. A prompt is the same graph with ``sequence`` = prompt length.

Per layer (transformers' ``LlamaDecoderLayer``)::

    h      = RMSNorm(x) * g_in                         SimplifiedLayerNormalization
    qkv    = h @ [Wq; Wk; Wv]^T (+ bias)               one MatMul (fused projections)
    a      = GroupQueryAttention(qkv packed, past, rotary cos/sin tables, causal)
    x      = x + a @ Wo^T (+ bias);  h = RMSNorm(x) * g_post   SkipSimplifiedLayerNormalization
    gu     = h @ [Wgate; Wup]^T                        one MatMul (fused projections)
    x      = x + (silu(gate) * up) @ Wdown^T

Rotary embedding (rotate-half, Su et al. 2021, as transformers' ``apply_rotary_pos_emb``) is
GroupQueryAttention's ``do_rotary`` with tables ``cos[p, i] = cos(p * inv_freq[i]) * scaling``,
``sin`` likewise, for p < M; positions are ``seqlens_k - sequence + 1 ..`` per batch row.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from passctl.ir.errors import UserError
from passctl.passes.decoder.spec import DecoderSpec, check_max_length

LAYOUT = "passctl-static-kv"
"""The ``layout`` name of the graph :func:`build_decoder` writes (docs/generate.md)."""

DYNAMIC_LAYOUT = "past-key-values"
"""The layout of Optimum / onnxruntime-genai decoders: ``attention_mask`` [batch, total] instead of
``seqlens_k`` / ``total_sequence_length``, a cache that grows (past [.., past, ..] -> present
[.., total, ..]); :func:`build_decoder` writes it with ``layout=DYNAMIC_LAYOUT`` (for tests of
the runtime's support of user decoders)."""

OPSET = 17
MS_DOMAIN = "com.microsoft"


def past_names(layer: int):
    """``(past key, past value, present key, present value)`` names of ``layer``."""
    return (f"past_key_values.{layer}.key", f"past_key_values.{layer}.value",
            f"present.{layer}.key", f"present.{layer}.value")


def rotary_tables(inv_freq: np.ndarray, scaling: float, max_length: int):
    """``(cos, sin)`` float32 ``[max_length, len(inv_freq)]``: ``cos(p * inv_freq[i]) * scaling``.

    Computed in float64, then rounded once to float32 (transformers computes ``p * inv_freq`` in
    float32; both round the same angles to within an ulp of the float32 result).
    """
    positions = np.arange(max_length, dtype=np.float64)[:, None]
    angles = positions * np.asarray(inv_freq, dtype=np.float32).astype(np.float64)[None, :]
    return ((np.cos(angles) * scaling).astype(np.float32),
            (np.sin(angles) * scaling).astype(np.float32))


class _Builder:
    def __init__(self):
        self.nodes: List[onnx.NodeProto] = []
        self.inits: List[onnx.TensorProto] = []
        self._count = 0

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def init(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(self, op: str, inputs, outputs=None, domain: str = "", n_out: int = 1, **attrs):
        if outputs is None:
            outputs = [self.name(op.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), list(outputs), name=self.name(op),
                                           domain=domain, **attrs))
        return outputs[0] if len(outputs) == 1 else outputs


def _weight(weights: Mapping[str, np.ndarray], key: str) -> np.ndarray:
    if key not in weights:
        raise UserError(f"decoder weights: '{key}' is missing (not a Llama-style state dict?)")
    return np.asarray(weights[key], dtype=np.float32)


def _optional(weights: Mapping[str, np.ndarray], key: str) -> Optional[np.ndarray]:
    return np.asarray(weights[key], dtype=np.float32) if key in weights else None


def build_decoder(spec: DecoderSpec, weights: Mapping[str, np.ndarray], inv_freq: np.ndarray,
                  attention_scaling: float = 1.0, max_length: int = 2048,
                  layout: str = LAYOUT) -> onnx.ModelProto:
    """The decoder graph of module docstring's layout, with the weights as initializers.

    Args:
        spec: the architecture (:func:`passctl.passes.decoder.spec.spec_from_config`).
        weights: transformers state dict names (``model.layers.N.self_attn.q_proj.weight`` ...)
            to float arrays (converted to float32).
        inv_freq: float32 ``[head_dim / 2]``, the rotary inverse frequencies (transformers'
            ``model.rotary_emb.inv_freq``, which already includes any static rope scaling).
        attention_scaling: the factor transformers multiplies cos and sin with (yarn; else 1).
        max_length: the cache length ``M`` (prompt plus generated tokens).
        layout: :data:`LAYOUT` (default) or :data:`DYNAMIC_LAYOUT` (rotary tables of
            ``max_length`` rows; the cache grows instead).

    Returns:
        An ONNX model (opset 17 plus ``com.microsoft``), float32, for ONNX Runtime.

    Raises:
        UserError: a missing weight, a bad ``max_length`` (see ``check_max_length``), or
            ``inv_freq`` of the wrong size.
    """
    check_max_length(spec, max_length)
    n, kv, hd, d = spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.hidden_size
    if np.asarray(inv_freq).shape != (hd // 2,):
        raise UserError(f"rotary inv_freq has shape {np.asarray(inv_freq).shape}, expected "
                        f"({hd // 2},) for head size {hd}")
    if layout not in (LAYOUT, DYNAMIC_LAYOUT):
        raise UserError(f"decoder layout '{layout}': give {LAYOUT} or {DYNAMIC_LAYOUT}")
    b = _Builder()
    if layout == DYNAMIC_LAYOUT:
        # GroupQueryAttention's lengths from the mask, as onnxruntime-genai's model builder does
        total = b.node("ReduceSum", ["attention_mask", b.init("axis1", np.array([1], np.int64))],
                       keepdims=0)
        b.node("Cast", [b.node("Sub", [total, b.init("one", np.array(1, np.int64))])],
               ["seqlens_k"], to=TensorProto.INT32)
        width = b.node("Gather", [b.node("Shape", ["attention_mask"]),
                                  b.init("index1", np.array(1, np.int64))], axis=0)
        b.node("Cast", [width], ["total_sequence_length"], to=TensorProto.INT32)
    cos, sin = rotary_tables(inv_freq, attention_scaling, max_length)
    b.init("rotary.cos_cache", cos)
    b.init("rotary.sin_cache", sin)
    embed = b.init("model.embed_tokens.weight", _weight(weights, "model.embed_tokens.weight"))
    x = b.node("Gather", [embed, "input_ids"], axis=0)
    eps = float(spec.rms_norm_eps)
    pending = None  # the branch output (attention or MLP) not yet added to the residual x

    def norm(gamma_key: str):
        """RMSNorm of x + pending; returns (normalized, new residual)."""
        nonlocal x, pending
        gamma = b.init(gamma_key, _weight(weights, gamma_key))
        if pending is None:
            return b.node("SimplifiedLayerNormalization", [x, gamma], axis=-1, epsilon=eps,
                          stash_type=1), x
        out, total = b.name("norm"), b.name("residual")
        b.node("SkipSimplifiedLayerNormalization", [pending, x, gamma], [out, "", "", total],
               domain=MS_DOMAIN, epsilon=eps)
        return out, total

    def linear(h: str, prefix: str, parts, out_name: str) -> str:
        """h @ concat(parts' weights)^T (+ their biases, when any part has one)."""
        w = np.concatenate([_weight(weights, f"{prefix}{p}.weight") for p in parts], axis=0)
        y = b.node("MatMul", [h, b.init(f"{prefix}{out_name}.weight_t", w.T.copy())])
        biases = [_optional(weights, f"{prefix}{p}.bias") for p in parts]
        if any(v is not None for v in biases):
            rows = [_weight(weights, f"{prefix}{p}.weight").shape[0] for p in parts]
            bias = np.concatenate([v if v is not None else np.zeros(r, np.float32)
                                   for v, r in zip(biases, rows)])
            y = b.node("Add", [y, b.init(f"{prefix}{out_name}.bias", bias)])
        return y

    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        h, x = norm(p + "input_layernorm.weight")
        pending = None
        qkv = linear(h, p + "self_attn.", ["q_proj", "k_proj", "v_proj"], "qkv_proj")
        pk, pv, ok, ov = past_names(i)
        attn = b.name("attn")
        b.node("GroupQueryAttention",
                      [qkv, "", "", pk, pv, "seqlens_k", "total_sequence_length",
                       "rotary.cos_cache", "rotary.sin_cache"],
                      [attn, ok, ov], domain=MS_DOMAIN, num_heads=n, kv_num_heads=kv,
                      scale=float(hd ** -0.5), do_rotary=1, rotary_interleaved=0)
        pending = linear(attn, p + "self_attn.", ["o_proj"], "o_proj")
        h, x = norm(p + "post_attention_layernorm.weight")
        pending = None
        gu = linear(h, p + "mlp.", ["gate_proj", "up_proj"], "gate_up_proj")
        f = spec.intermediate_size
        split = b.init(b.name("split_sizes"), np.array([f, f], np.int64))
        gate, up = b.node("Split", [gu, split], [b.name("gate"), b.name("up")], axis=-1)
        act = b.node("Mul", [gate, b.node("Sigmoid", [gate])])
        pending = linear(b.node("Mul", [act, up]), p + "mlp.", ["down_proj"], "down_proj")

    h, _ = norm("model.norm.weight")
    # only the chunk's last token: generation needs no other logits, and a prompt of P tokens
    # would otherwise cost P times the LM head
    last = b.node("Slice", [h, b.init("last.start", np.array([-1], np.int64)),
                            b.init("last.end", np.array([np.iinfo(np.int64).max], np.int64)),
                            b.init("last.axis", np.array([1], np.int64))])
    if spec.tie_word_embeddings or "lm_head.weight" not in weights:
        # Gemm(transB=1) reads the embedding matrix [vocab, hidden] as it is: one copy in memory
        flat = b.node("Reshape", [last, b.init("hidden.shape2d", np.array([-1, d], np.int64))])
        logits2d = b.node("Gemm", [flat, embed], transB=1)
        batch = b.node("Slice", [b.node("Shape", ["input_ids"]),
                                 b.init("dim0.start", np.array([0], np.int64)),
                                 b.init("dim0.end", np.array([1], np.int64))])
        shape3 = b.node("Concat", [batch, b.init("logits.tail", np.array([1, -1], np.int64))],
                        axis=0)
        b.node("Reshape", [logits2d, shape3], ["logits"])
    else:
        head = b.init("lm_head.weight_t", _weight(weights, "lm_head.weight").T.copy())
        b.node("MatMul", [last, head], ["logits"])

    f32 = TensorProto.FLOAT
    cache = ["batch", kv, max_length, hd]
    present = cache
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["batch"]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    if layout == DYNAMIC_LAYOUT:
        cache, present = ["batch", kv, "past_sequence", hd], ["batch", kv, "total_sequence", hd]
        inputs[1:] = [helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                                    ["batch", "total_sequence"])]
    outputs = [helper.make_tensor_value_info("logits", f32, ["batch", 1, spec.vocab_size])]
    for i in range(spec.num_layers):
        pk, pv, ok, ov = past_names(i)
        inputs += [helper.make_tensor_value_info(pk, f32, cache),
                   helper.make_tensor_value_info(pv, f32, cache)]
        outputs += [helper.make_tensor_value_info(ok, f32, present),
                    helper.make_tensor_value_info(ov, f32, present)]
    graph = helper.make_graph(b.nodes, f"{spec.model_type}_decoder", inputs, outputs, b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid(MS_DOMAIN, 1)],
                              producer_name="passctl", ir_version=9)
    meta: Dict[str, str] = {"passctl.layout": LAYOUT, "passctl.max_length": str(max_length)} \
        if layout == LAYOUT else {}
    for key, value in meta.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    return model
