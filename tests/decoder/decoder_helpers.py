"""Tiny random transformers decoders and a word-level tokenizer for the decoder tests."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

VOCAB = 320


def tiny_model(family: str = "llama", seed: int = 0, **overrides):
    """A random 2-layer ``*ForCausalLM`` (hidden 64, 4 heads): llama (GQA 2 kv heads, tied
    embeddings), qwen2 (q/k/v biases, untied LM head), mqa (llama with 1 kv head, untied),
    mistral (sliding window 128, beyond the tests' caches)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=256, eos_token_id=VOCAB - 1,
                  bos_token_id=1)
    if family == "mistral":
        cfg = transformers.MistralConfig(num_key_value_heads=2, tie_word_embeddings=False,
                                         sliding_window=128, **{**common, **overrides})
        return _noisy(transformers.MistralForCausalLM(cfg))
    if family == "qwen2":
        cfg = transformers.Qwen2Config(num_key_value_heads=2, tie_word_embeddings=False,
                                       **{**common, **overrides})
        model = transformers.Qwen2ForCausalLM(cfg)
    else:
        kv = 1 if family == "mqa" else 2
        cfg = transformers.LlamaConfig(num_key_value_heads=kv, tie_word_embeddings=family == "llama",
                                       **{**common, **overrides})
        model = transformers.LlamaForCausalLM(cfg)
    return _noisy(model)


def _noisy(model):
    import torch

    with torch.no_grad():  # norm weights of exactly 1 and zero biases would hide mistakes
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 0.05)
    return model.eval()


def word_tokenizer():
    """A ``transformers`` fast tokenizer over words ``w0 .. w{VOCAB-1}`` (whitespace split)."""
    import tokenizers
    import transformers

    vocab = {f"w{i}": i for i in range(VOCAB)}
    vocab["[UNK]"] = 0
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
