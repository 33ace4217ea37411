"""Cached ONNX exports of timm RepVGG / MobileOne, training-time (multi-branch) and reparameterized."""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path
from typing import Tuple

from corpus import REPO_ROOT, cached_export

MODELS = ("repvgg_a0", "repvgg_b1g4", "mobileone_s0")
EXPORT_RECIPE = 1
"""Bump when the export recipe below changes, so old cached exports are not reused."""


def cache_root() -> Path:
    """``$PASSCTL_CACHE_DIR`` or ``<repo>/.cache``, then ``reparam/`` keyed by torch and timm versions."""
    base = Path(os.environ.get("PASSCTL_CACHE_DIR", REPO_ROOT / ".cache"))
    key = (f"torch-{importlib.metadata.version('torch')}-timm-{importlib.metadata.version('timm')}"
           f"-r{EXPORT_RECIPE}")
    return base / "reparam" / key


def build_timm(name: str, seed: int = 0):
    """timm ``name`` with random weights and randomized BatchNorm statistics, in eval mode.

    Every BatchNorm2d gets ``weight ~ U(0.5, 1.5)``, ``bias ~ N(0, 0.2)``, ``running_mean ~ N(0, 0.2)``
    and ``running_var ~ U(0.5, 2)``, so no BN is an identity and each one's statistics matter.
    """
    import timm
    import torch

    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False, num_classes=10)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                c = m.num_features
                m.weight.copy_(torch.rand(c, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(c, generator=gen) * 0.2)
                m.running_mean.copy_(torch.randn(c, generator=gen) * 0.2)
                m.running_var.copy_(torch.rand(c, generator=gen) * 1.5 + 0.5)
    return model.eval()


def export_module(module, path: Path, size: int) -> None:
    """Legacy-exporter ONNX (opset 17) of ``module`` on a ``1x3xSxS`` input, BatchNormalization kept.

    ``training=PRESERVE`` with the module in eval mode writes inference-form BatchNormalization nodes
    (``training_mode=0``, running statistics as initializers); ``do_constant_folding=False`` stops
    the exporter folding them into the convolutions (docs/facts.md).
    """
    import torch

    x = torch.randn(1, 3, size, size)
    torch.onnx.export(module, (x,), str(path), dynamo=False, opset_version=17,
                      input_names=["input"], output_names=["logits"],
                      training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False)


def timm_export(name: str, size: int = 64, reparameterized: bool = False) -> str:
    """Path of the cached export of timm ``name`` (see :func:`build_timm`) at ``size`` x ``size``.

    Args:
        name: a timm model name, e.g. ``repvgg_a0``.
        size: input height and width in pixels.
        reparameterized: export the result of ``timm.utils.reparameterize_model`` (timm's own merge of
            the branches) instead of the training-time multi-branch form.
    """
    tag = f"{name}_{size}_{'reparam' if reparameterized else 'train'}"

    def build(path: Path) -> None:
        model = build_timm(name)
        if reparameterized:
            from timm.utils import reparameterize_model

            model = reparameterize_model(model)
        export_module(model, path, size)

    return cached_export(tag, build, root=cache_root())


def timm_pair(name: str, size: int = 64) -> Tuple[str, str]:
    """``(training-time export, timm-reparameterized export)`` paths of timm ``name``."""
    return timm_export(name, size), timm_export(name, size, reparameterized=True)


if __name__ == "__main__":  # warm the cache: python tests/reparam_export.py
    for n in MODELS:
        print(timm_pair(n))
