"""The canonical ``passctl::RotaryEmbedding`` op: schema and attribute names."""

from __future__ import annotations

from passctl.dialect.canonical import SCHEMAS, CanonicalOp

OP_TYPE = "RotaryEmbedding"

SCHEMA = CanonicalOp(
    OP_TYPE, ("X", "position_ids", "cos_cache", "sin_cache"),
    {"interleaved": "int 0/1: 0 rotates the halves (x[:R/2], x[R/2:]) as transformers' rotate_half "
                    "(Llama, Mistral, Qwen2); 1 rotates the pairs (x0, x1), (x2, x3), ... as GPT-J's "
                    "rotate_every_two and Meta's original LLaMA",
     "rotary_embedding_dim": "int, optional, R: only X[..., :R] is rotated, X[..., R:] passes "
                             "through (partial rotary); 0 or absent: R = D"},
    "X [B, H, S, D] (BHSD, the layout of transformers' apply_rotary_pos_emb and of "
    "passctl::Attention's Q and K), position_ids int64 [B, S] (each < max_pos), cos_cache and "
    "sin_cache [max_pos, R/2] in X's element type. With c = cos_cache[position_ids[b, s]] and "
    "s = sin_cache[...] (both [R/2]), for i < R/2: interleaved=0: Y[i] = X[i] c[i] - X[i + R/2] "
    "s[i], Y[i + R/2] = X[i + R/2] c[i] + X[i] s[i]; interleaved=1: Y[2i] = X[2i] c[i] - X[2i+1] "
    "s[i], Y[2i+1] = X[2i+1] c[i] + X[2i] s[i]; Y[R:] = X[R:]. Y has X's shape and element type",
    "Su et al. 2021 (RoFormer, rotary position embedding); ONNX RotaryEmbedding-23 and ONNX "
    "Runtime com.microsoft.RotaryEmbedding (same inputs, BHSD 4-D form, same attributes)")

SCHEMAS.setdefault(OP_TYPE, SCHEMA)

__all__ = ["OP_TYPE", "SCHEMA"]
