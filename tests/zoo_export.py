"""Torch exports of the model zoo: BERT-base and timm CNNs with random weights, SmolLM2-135M from GGUF."""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path

try:
    from corpus_export import (BERT_INPUTS, LLAMA_INPUTS, NOISE_STD, _bert_wrapper, _dynamo_export,
                               _offline_torch)
except ModuleNotFoundError:  # imported as tests.zoo_export from the repository root
    from tests.corpus_export import (BERT_INPUTS, LLAMA_INPUTS, NOISE_STD, _bert_wrapper, _dynamo_export,
                                     _offline_torch)

logger = logging.getLogger(__name__)

IMAGE_INPUT = "input"
"""Name of the NCHW float32 image input of the timm exports."""


def add_noise(module, std: float = NOISE_STD, seed: int = 0) -> None:
    """Add Gaussian noise of standard deviation ``std`` to every parameter of ``module``, in place.

    Freshly initialized models have norm weights of exactly 1 and biases of exactly 0 (timm's ResNet
    even zero-initializes the last BatchNorm scale of each block), which the exporter folds away; see
    docs/facts.md. Buffers (BatchNorm running statistics) are left alone, so variances stay positive.
    """
    torch, _ = _offline_torch()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
            parameter.add_(noise * std)


def build_bert_base(seed: int = 0):
    """``BertModel(BertConfig())`` (BERT-base: 12 layers, hidden 768, eval mode) with random weights.

    Weights: ``torch.manual_seed(seed)``, the default initialization, then :func:`add_noise`, so the
    same seed gives the same weights.
    """
    torch, transformers = _offline_torch()
    torch.manual_seed(seed)
    bert = transformers.BertModel(transformers.BertConfig()).eval()
    add_noise(bert, seed=seed)
    return bert


def export_bert_base(path: Path, seed: int = 0) -> None:
    """Export :func:`build_bert_base`'s model with the legacy TorchScript exporter, opset 17, weights
    inside the file (~440 MB).

    Inputs ``input_ids``, ``attention_mask``, ``token_type_ids``: int64 ``[batch, sequence]``. Outputs
    ``last_hidden_state``: float32 ``[batch, sequence, 768]``, ``pooler_output``: float32 ``[batch, 768]``.
    """
    torch, _ = _offline_torch()
    start = time.perf_counter()
    wrapper = _bert_wrapper(build_bert_base(seed))
    outputs = ["last_hidden_state", "pooler_output"]
    args = (torch.randint(0, 1000, (1, 128)), torch.ones(1, 128, dtype=torch.int64),
            torch.zeros(1, 128, dtype=torch.int64))
    axes = {name: {0: "batch", 1: "sequence"} for name in BERT_INPUTS}
    axes["last_hidden_state"] = {0: "batch", 1: "sequence"}
    axes["pooler_output"] = {0: "batch"}
    with torch.no_grad():
        torch.onnx.export(wrapper, args, str(path), dynamo=False, opset_version=17,
                          input_names=list(BERT_INPUTS), output_names=outputs, dynamic_axes=axes)
    logger.info("exported BERT-base in %.1f s", time.perf_counter() - start)


def build_timm(name: str, seed: int = 0):
    """timm model ``name`` in eval mode: ``torch.manual_seed(seed)``, timm's random initialization
    (``pretrained=False``), then :func:`add_noise`."""
    torch, _ = _offline_torch()
    import timm

    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False).eval()
    add_noise(model, seed=seed)
    return model


def export_timm(name: str, path: Path, seed: int = 0, size: int = 224) -> None:
    """Export :func:`build_timm`'s model ``name`` in eval mode.

    The legacy TorchScript exporter, opset 17, constant folding on (so BatchNormalization is folded into
    the preceding Conv, as in a normal inference export), weights inside the file. No re-parameterization:
    RepVGG keeps its train-time branches (3x3, 1x1 and identity BN) as separate Convs and Adds.

    Input ``input``: float32 ``[1, 3, size, size]`` (NCHW); output ``logits``: float32 ``[1, 1000]``.
    """
    torch, _ = _offline_torch()
    start = time.perf_counter()
    model = build_timm(name, seed)
    example = torch.randn(1, 3, size, size)
    with torch.no_grad():
        torch.onnx.export(model, (example,), str(path), dynamo=False, opset_version=17,
                          input_names=[IMAGE_INPUT], output_names=["logits"])
    logger.info("exported timm %s in %.1f s", name, time.perf_counter() - start)


def load_smollm2(gguf_path: str):
    """``LlamaForCausalLM`` (eval, fp32) with SmolLM2-135M-Instruct's weights dequantized from GGUF.

    transformers reads the GGUF file (with the ``gguf`` package) and dequantizes its Q4_1 tensors to
    float32; see docs/facts.md.
    """
    torch, transformers = _offline_torch()
    folder, name = str(Path(gguf_path).parent), Path(gguf_path).name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.LlamaForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                              local_files_only=True)
    model.config.use_cache = False
    return model.eval()


def export_smollm2(gguf_path: str, path: Path) -> None:
    """Export SmolLM2-135M (real weights, see :func:`load_smollm2`) with the dynamo exporter.

    Inputs ``input_ids`` and ``attention_mask``: int64 ``[batch, sequence]`` (an explicit mask avoids
    ``torch.diff``, see docs/facts.md); output ``logits``: float32 ``[batch, sequence, 49152]``. No KV cache
    (``use_cache=False``), opset 18, weights in ``model.onnx.data`` (~540 MB).
    """
    torch, _ = _offline_torch()
    start = time.perf_counter()
    llama = load_smollm2(gguf_path)
    loaded = time.perf_counter()

    class LlamaLogits(torch.nn.Module):
        """LlamaForCausalLM as a function of (input_ids, attention_mask) -> logits."""

        def __init__(self):
            super().__init__()
            self.model = llama

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    args = (torch.randint(0, 49152, (1, 128)), torch.ones(1, 128, dtype=torch.int64))
    batch, sequence = torch.export.Dim("batch", max=1024), torch.export.Dim("sequence", max=2048)
    shapes = {name: {0: batch, 1: sequence} for name in LLAMA_INPUTS}
    with torch.no_grad():
        _dynamo_export(LlamaLogits().eval(), args, path, LLAMA_INPUTS, ["logits"], shapes)
    logger.info("SmolLM2: GGUF load %.1f s, export %.1f s", loaded - start, time.perf_counter() - loaded)
