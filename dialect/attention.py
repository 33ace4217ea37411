"""The canonical ``passctl::Attention`` op: schema, attribute names and a builder used by the rewrite."""

from __future__ import annotations

from passctl.dialect.canonical import SCHEMAS, CanonicalOp

OP_TYPE = "Attention"

MASK_KINDS = ("none", "additive", "boolean")

SCHEMA = CanonicalOp(
    OP_TYPE, ("Q", "K", "V", "Mask?", "past_key?", "past_value?"),
    {"scale": "float, multiplies Q.K^T (already the product of every scale constant of the match)",
     "mask_kind": "string, 'none', 'additive' (Mask is float, added to the scores) or 'boolean' "
                  "(Mask is bool, true = the key takes part; false scores become mask_fill)",
     "mask_fill": "float, optional, -inf when absent: with a boolean Mask, the score of a masked key "
                  "(Where(Mask, scores, mask_fill)); a finite fill (-1e4, finfo.min) makes a fully "
                  "masked row uniform over all keys, not NaN",
     "is_causal": "int 0/1: key j > query i is masked (top-left aligned, ONNX Attention-23; with "
                  "past_key of length P: key j > P + i, bottom-right aligned). With a "
                  "Mask the flag is a hint: the fusion sets it only when the Mask provably holds that "
                  "causal part, so a kernel may apply it again (no change) or ignore it",
     "num_heads": "int, H (Q's axis 1)",
     "kv_num_heads": "int, Hkv (K's and V's axis 1); H % Hkv == 0, head h reads KV head h // (H / Hkv)",
     "softmax_precision": "int, 0 = the scores' element type, 1 = float32 (the export cast around "
                          "Softmax)",
     "nan_to_zero": "int 0/1: a fully masked row gives 0 instead of NaN (transformers' "
                    "Where(IsNaN(p), 0, p) after Softmax)"},
    "Q [B, H, S, D], K [B, Hkv, T, D], V [B, Hkv, T, Dv] (BHSD layout); with K and V heads repeated "
    "to H: Y = softmax(mask(scale * Q.K^T), axis=-1) . V (mask(s): s + Mask, or Where(Mask, s, "
    "mask_fill)), Y [B, H, S, Dv] in Q's element type; Mask broadcasts to [B, H, S, T]. With "
    "past_key / past_value [B, Hkv, P, D] (fuse-attention-past; both or neither): K and V are this "
    "step's new keys and values [B, Hkv, S, D], attention runs over present_key = Concat(past_key, "
    "K, axis=2) and present_value alike (T = P + S), and the node has the outputs (Y, present_key, "
    "present_value)",
    "Vaswani et al. 2017 (scaled dot-product attention); ONNX Attention-23 (same inputs, is_causal, "
    "scale, kv heads by shape, softmax_precision, past_key/past_value -> present_key/present_value); "
    "torch scaled_dot_product_attention")

SCHEMAS.setdefault(OP_TYPE, SCHEMA)

__all__ = ["MASK_KINDS", "OP_TYPE", "SCHEMA"]
