"""flash-attn on real exports: every attention fused, outputs within 1e-4 of ONNX Runtime on the original."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_export import EXPORTS, export_path  # noqa: E402

from corpus import CORPUS  # noqa: E402
from passctl.ir import load, save  # noqa: E402
from passctl.passes.manager import PassManager  # noqa: E402
from passctl.passes.pipeline_text import build_pipeline  # noqa: E402
from passctl.support.check import compare, make_inputs, run_onnxruntime  # noqa: E402
from zoo import ZOO  # noqa: E402

RTOL = 1e-4
DIMS = {"batch": 2, "sequence": 16}

# export -> (attention layers, causal layers, grouped-query layers). Causal detection needs the
# mask's Range comparison with provably equal ranges: GPT-2's legacy export takes the key range from
# the reshaped attention_mask's unnamed length, so its layers fuse with the full mask and is_causal=0
# (the same result; only a hint is missing).
EXPECTED: Dict[str, tuple] = {}
for _name in EXPORTS:
    _kind, _impl, _exporter = _name.split("_")
    _layers = {"bert": 12, "llama": 2, "gpt2": 2, "vit": 12}[_kind]
    _causal = _layers if _kind == "llama" or (_kind == "gpt2" and _exporter == "dynamo") else 0
    EXPECTED[_name] = (_layers, _causal, _layers if _kind == "llama" else 0)


GQA_KERNEL = {"llama_sdpa_legacy"}  # the one export whose mask fills -inf


def _fuse(path: str, pipeline: str, tmp_path: Path, target: Optional[str] = None):
    model = load(path)
    result = PassManager(build_pipeline(pipeline, target)).run(model)
    stats = {r.name: dict(r.stats) for r in result.records}
    out = tmp_path / "fused.onnx"
    save(model, str(out))
    return stats, str(out)


def _inputs(path: str) -> Dict[str, np.ndarray]:
    inputs = make_inputs(path, seed=0, dim_values=DIMS)
    if "attention_mask" in inputs:
        inputs["attention_mask"][1, :4] = 0  # left padding: fully masked query rows too
    return inputs


def _check(original: str, fused: str) -> None:
    inputs = _inputs(original)
    ref = run_onnxruntime(original, inputs)
    result = compare(ref, run_onnxruntime(fused, inputs, optimize=True))
    assert result.ok(RTOL), result.failures(RTOL)


def _ops(path: str) -> Dict[str, int]:
    counts: Dict[str, int] = {}
    for n in onnx.load(path, load_external_data=False).graph.node:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts


@pytest.mark.parametrize("name", list(EXPORTS))
def test_small_exports_fuse_and_match(name, tmp_path):
    layers, causal, gqa = EXPECTED[name]
    path = export_path(name)
    stats, fused = _fuse(path, "flash-attn", tmp_path)
    fuse = stats["fuse-attention"]
    assert (fuse["attention"], fuse["causal"], fuse["grouped_query"]) == (layers, causal, gqa), fuse
    assert fuse["unfused_softmax"] == 0, fuse["unfused"]
    ops = _ops(fused)
    # GroupQueryAttention for causal GQA layers whose mask fills -inf;
    # a finite fill (eager's finfo.min) keeps MultiHeadAttention (see lower.py).
    gqa_kernel = ops.get("GroupQueryAttention", 0)
    assert gqa_kernel + ops.get("MultiHeadAttention", 0) == layers and "Softmax" not in ops, ops
    assert gqa_kernel == (layers if name in GQA_KERNEL else 0), ops
    _check(path, fused)


@pytest.mark.parametrize("name", ["llama_eager_legacy", "llama_eager_dynamo", "vit_eager_legacy",
                                  "vit_eager_dynamo", "bert_eager_legacy"])
def test_fuse_before_flash_attn(name, tmp_path):
    """`cleanup,fuse,flash-attn`: fuse-gemm turns eager Q . K^T into FusedMatMul(transB=1) (llama,
    ViT), which fuse-attention reads back: every attention still fuses (issue 15, item 8)."""
    layers = EXPECTED[name][0]
    path = export_path(name)
    stats, fused = _fuse(path, "cleanup,fuse,flash-attn", tmp_path)
    fuse = stats["fuse-attention"]
    assert fuse["attention"] == layers and fuse["unfused_softmax"] == 0, fuse
    assert fuse["fused_matmul_read"] == (0 if name.startswith("bert") else layers), fuse
    ops = _ops(fused)
    assert "Softmax" not in ops and "FusedMatMul" not in ops, ops
    _check(path, fused)


@pytest.mark.parametrize("name", ["llama_sdpa_dynamo", "gpt2_eager_legacy", "vit_sdpa_legacy"])
def test_decomposed_lowering_matches(name, tmp_path):
    path = export_path(name)
    stats, fused = _fuse(path, "flash-attn", tmp_path, target="tensorrt")
    assert stats["lower-standard"]["Attention->decomposed"] == EXPECTED[name][0]
    _check(path, fused)


@pytest.mark.parametrize("corpus_id", ["minilm_legacy", "minilm_dynamo"])
def test_minilm_six_layers(corpus_id, tmp_path):
    path = CORPUS[corpus_id].path
    stats, fused = _fuse(path, "flash-attn", tmp_path)
    fuse = stats["fuse-attention"]
    assert fuse["attention"] == 6 and fuse["unfused_softmax"] == 0, fuse
    assert _ops(fused).get("MultiHeadAttention") == 6
    _check(path, fused)


@pytest.mark.slow
@pytest.mark.parametrize("zoo_id,layers,causal,gqa", [("bert_base", 12, 0, 0), ("smollm2", 30, 30, 30)])
def test_zoo_models(zoo_id, layers, causal, gqa, tmp_path):
    path = ZOO[zoo_id].path
    stats, fused = _fuse(path, "flash-attn", tmp_path)
    fuse = stats["fuse-attention"]
    assert (fuse["attention"], fuse["causal"], fuse["grouped_query"]) == (layers, causal, gqa), fuse
    assert fuse["unfused_softmax"] == 0
    _check(path, fused)

