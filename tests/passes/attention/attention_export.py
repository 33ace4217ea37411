"""Small-config torch exports for the attention tests (BERT, LLaMA GQA, GPT-2, ViT-Tiny), cached."""

from __future__ import annotations

import importlib.metadata
import os
import warnings
from pathlib import Path
from typing import Callable, Dict, Tuple

from corpus import REPO_ROOT, cached_export
from corpus_export import NOISE_STD, _offline_torch

RECIPE = 1
"""Bump when a recipe below changes, so old cached exports are not reused."""

TEXT_SEQ = 16


def cache_dir() -> Path:
    """``<cache>/attention/torch-<v>-transformers-<v>-timm-<v>-a<RECIPE>`` (versions from metadata)."""
    base = Path(os.environ.get("PASSCTL_CACHE_DIR", REPO_ROOT / ".cache"))
    key = "-".join(f"{p}-{importlib.metadata.version(p)}" for p in ("torch", "transformers", "timm"))
    return base / "attention" / f"{key}-a{RECIPE}"


def _noise(module, seed: int = 0):
    torch, _ = _offline_torch()
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * NOISE_STD)
    return module.eval()


def _export(module, args, path: Path, names, outputs, dynamo: bool, axes) -> None:
    torch, _ = _offline_torch()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            batch = torch.export.Dim("batch", max=1024)
            seq = torch.export.Dim("sequence", max=1024)
            shapes = tuple({0: batch, 1: seq} for _ in names)
            torch.onnx.export(module, args, str(path), dynamo=True, opset_version=18,
                              input_names=list(names), output_names=list(outputs),
                              dynamic_shapes={"inputs": shapes}, external_data=False)
        else:
            dyn = {n: {i: f"{n}_{i}" if i > 1 else ("batch" if i == 0 else "sequence")
                       for i in axes[n]} for n in names}
            torch.onnx.export(module, args, str(path), dynamo=False, opset_version=17,
                              input_names=list(names), output_names=list(outputs), dynamic_axes=dyn)


def _text_model(kind: str, impl: str):
    """A small-config transformers model and its forward wrapper returning one tensor."""
    torch, _ = _offline_torch()
    import transformers as tf

    torch.manual_seed(0)
    if kind == "bert":
        cfg = tf.BertConfig(hidden_size=64, num_hidden_layers=12, num_attention_heads=4,
                            intermediate_size=128, vocab_size=1000, max_position_embeddings=128)
        model = tf.BertModel(cfg, add_pooling_layer=False)
        names = ("input_ids", "attention_mask", "token_type_ids")
    elif kind == "llama":
        cfg = tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                             max_position_embeddings=256, use_cache=False)
        model = tf.LlamaForCausalLM(cfg)
        names = ("input_ids", "attention_mask")
    else:
        cfg = tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=1000, n_positions=256,
                            use_cache=False)
        model = tf.GPT2LMHeadModel(cfg)
        names = ("input_ids", "attention_mask")
    model.config._attn_implementation = impl
    _noise(model)

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *inputs):
            out = self.model(**dict(zip(names, inputs)), return_dict=True)
            return out.last_hidden_state if kind == "bert" else out.logits

    args = (torch.randint(0, 1000, (2, TEXT_SEQ)), torch.ones(2, TEXT_SEQ, dtype=torch.int64))
    if kind == "bert":
        args = args + (torch.zeros(2, TEXT_SEQ, dtype=torch.int64),)
    return Wrapper().eval(), args, names


def export_text(kind: str, impl: str, dynamo: bool, path: Path) -> None:
    """Export the small ``kind`` model (bert: 12 layers, hidden 64, 4 heads; llama: 2 layers, 4 heads,
    2 KV heads; gpt2: 2 layers, 4 heads, packed QKV) with attention ``impl`` ("sdpa" / "eager")."""
    module, args, names = _text_model(kind, impl)
    out = "last_hidden_state" if kind == "bert" else "logits"
    _export(module, args, path, names, [out], dynamo, {n: (0, 1) for n in names})


def export_vit(fused_attn: bool, dynamo: bool, path: Path) -> None:
    """timm ``vit_tiny_patch16_224`` (random weights plus noise), input float32 [1, 3, 224, 224];
    ``fused_attn`` picks timm's F.scaled_dot_product_attention path or its ``q * scale @ k^T`` form."""
    torch, _ = _offline_torch()
    import timm
    import timm.layers

    timm.layers.set_fused_attn(fused_attn)
    try:
        model = _noise(timm.create_model("vit_tiny_patch16_224", pretrained=False))
    finally:
        timm.layers.set_fused_attn(True)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            torch.onnx.export(model, (x,), str(path), dynamo=True, opset_version=18,
                              input_names=["pixels"], output_names=["logits"], external_data=False)
        else:
            torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17,
                              input_names=["pixels"], output_names=["logits"])


EXPORTS: Dict[str, Callable[[Path], None]] = {}
for _kind in ("bert", "llama", "gpt2"):
    for _impl in ("sdpa", "eager"):
        for _exp in ("legacy", "dynamo"):
            EXPORTS[f"{_kind}_{_impl}_{_exp}"] = (
                lambda p, k=_kind, i=_impl, d=_exp == "dynamo": export_text(k, i, d, p))
for _impl, _fused in (("sdpa", True), ("eager", False)):
    for _exp in ("legacy", "dynamo"):
        EXPORTS[f"vit_{_impl}_{_exp}"] = lambda p, f=_fused, d=_exp == "dynamo": export_vit(f, d, p)


def export_path(name: str) -> str:
    """The cached ``model.onnx`` of export ``name`` (built on first use)."""
    return cached_export(name, EXPORTS[name], cache_dir())


def try_export(name: str) -> Tuple[str, str]:
    """``(path, "")`` or ``("", error line)`` when the exporter fails on this model."""
    try:
        return export_path(name), ""
    except Exception as e:  # an exporter limitation is a fact to report, not a test error
        return "", f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
