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


def export_past_decoder(model, path: str, opset: int = 18) -> str:
    """``model`` (a Llama-family ``*ForCausalLM``) exported by the dynamo exporter in the Optimum
    / onnxruntime-genai layout: ``input_ids``, ``attention_mask``, ``position_ids``,
    ``past_key_values.N.key/value`` [batch, kv_heads, past, head_dim] -> ``logits``,
    ``present.N.key/value``; eager attention (Q.K^T, mask, Softmax, P.V as separate ops); weights
    in ``path``.data when the model is large."""
    import warnings

    import torch
    import transformers

    cfg = model.config
    layers = cfg.num_hidden_layers
    model.config._attn_implementation = "eager"

    class PastDecoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, input_ids, attention_mask, position_ids, past):
            cache = transformers.DynamicCache(config=cfg)
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.m(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, past_key_values=cache, use_cache=True)
            present = []
            for layer in out.past_key_values.layers:
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    kv = cfg.num_key_value_heads
    hd = cfg.hidden_size // cfg.num_attention_heads
    past, seq = 4, 3
    args = (torch.randint(0, 2, (1, seq)), torch.ones(1, past + seq, dtype=torch.int64),
            torch.arange(past, past + seq)[None],
            tuple(torch.randn(1, kv, past, hd) for _ in range(2 * layers)))
    names = ["input_ids", "attention_mask", "position_ids"] + [
        f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    outputs = ["logits"] + [f"present.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    batch = torch.export.Dim("batch", max=64)
    sequence = torch.export.Dim("sequence", max=2048)
    total = torch.export.Dim("total", max=4096)
    past_len = torch.export.Dim("past", max=2048)
    shapes = ({0: batch, 1: sequence}, {0: batch, 1: total}, {0: batch, 1: sequence},
              tuple({0: batch, 2: past_len} for _ in range(2 * layers)))
    large = sum(p.numel() for p in model.parameters()) * 4 > 100 * 2 ** 20
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(PastDecoder().eval(), args, path, dynamo=True, opset_version=opset,
                          input_names=names, output_names=outputs, dynamic_shapes=shapes,
                          external_data=large, verbose=False)
    return path


def past_decoder_feeds(model, batch: int, past: int, seq: int, seed: int = 0):
    """Seeded feeds for :func:`export_past_decoder`'s layout: random ids, a past of ``past``
    random cache rows (a non-empty past stands for earlier steps), positions past .. past+seq-1."""
    import numpy as np

    cfg = model.config
    rng = np.random.default_rng(seed)
    kv = cfg.num_key_value_heads
    hd = cfg.hidden_size // cfg.num_attention_heads
    feeds = {"input_ids": rng.integers(0, VOCAB, (batch, seq)).astype(np.int64),
             "attention_mask": np.ones((batch, past + seq), np.int64),
             "position_ids": np.tile(np.arange(past, past + seq, dtype=np.int64), (batch, 1))}
    for i in range(cfg.num_hidden_layers):
        for k in ("key", "value"):
            feeds[f"past_key_values.{i}.{k}"] = rng.standard_normal((batch, kv, past, hd)).astype(np.float32)
    return feeds
