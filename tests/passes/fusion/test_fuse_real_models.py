"""``cleanup,fuse`` on real models (MiniLM, PP-OCRv4 rec): fusion counts and ORT numerics at 1e-5."""

from __future__ import annotations

from collections import Counter

import pytest
from corpus import CORPUS

from passctl.ir import load, to_onnx
from passctl.passes.manager import PassManager
from passctl.passes.pipeline_text import build_pipeline
from passctl.support.check import compare, run_onnxruntime

# Per corpus model: the statistics `fuse` must report (pass -> key -> count) and the ops the lowered
# model must contain (op type -> count), per target. MiniLM: 13 LayerNorms (1 embedding + 2 per layer,
# 6 layers) and 6 GELUs (one per layer, each with the intermediate dense layer's bias).
EXPECTED = {
    "minilm_legacy": ({"fuse-layernorm": {"from_onnx": 13, "skip_layernorm": 13, "layernorm": 0},
                       "fuse-gelu": {"gelu": 6, "bias_gelu": 6}},
                      # ORT form of SkipLayerNorm: Add + LayerNormalization (lower_onnxruntime.py NOTE).
                      {"SkipLayerNormalization": 0, "BiasGelu": 6, "LayerNormalization": 13, "Erf": 0}),
    # The dynamo export adds the position embedding ([1, seq, D]) last: broadcast over the batch, so
    # the embedding LayerNorm keeps its Add (SkipLayerNorm needs equal shapes).
    "minilm_dynamo": ({"fuse-layernorm": {"from_onnx": 13, "skip_layernorm": 12, "layernorm": 0},
                       "fuse-gelu": {"gelu": 6, "bias_gelu": 6}},
                      {"SkipLayerNormalization": 0, "BiasGelu": 6, "LayerNormalization": 13, "Erf": 0}),
    # SVTR neck: 5 decomposed LayerNorms (opset 12, so ORT's own LayerNormalization registration),
    # 28 Paddle hard-swish (x * Clip(x + 3, 0, 6) / 6) and 7 swish (x * Sigmoid(1.0 * x)).
    "ppocr_rec": ({"fuse-conv-bn": {"fused": 6},
                   "fuse-layernorm": {"layernorm": 5, "layernorm-scale": 5, "layernorm-bias": 5},
                   "fuse-activations": {"hardswish": 28, "silu": 7}},
                  {"LayerNormalization": 5, "QuickGelu": 7, "Clip": 0, "Div": 0, "ReduceMean": 0}),
}


def _run(model_id: str, target: str):
    cm = CORPUS[model_id]
    model = load(cm.path)
    result = PassManager(build_pipeline("cleanup,fuse", target)).run(model)
    stats = {r.name: r.stats for r in result.records}
    out = to_onnx(model)
    feeds = cm.inputs(seed=0)
    diff = compare(run_onnxruntime(cm.path, feeds), run_onnxruntime(out, feeds))
    return stats, out, diff


@pytest.mark.parametrize("model_id", list(EXPECTED))
def test_cleanup_fuse_counts_and_numerics(model_id, record_property, capsys):
    stats, out, diff = _run(model_id, "cpu")
    want_stats, want_ops = EXPECTED[model_id]
    counts = {p: {k: v for k, v in s.items() if v} for p, s in stats.items()
              if p.startswith(("fuse", "lower"))}
    line = f"{model_id}: " + "; ".join(f"{p} {counts[p]}" for p in counts) + f"; max_rel {diff.max_rel:.2e}"
    record_property("fusion_counts", line)
    with capsys.disabled():
        print(f"\n[fuse counts] {line}")
    for pass_name, keys in want_stats.items():
        assert {k: stats[pass_name].get(k, 0) for k in keys} == keys, stats[pass_name]
    histogram = Counter(n.op_type for n in out.graph.node)
    assert {op: histogram.get(op, 0) for op in want_ops} == want_ops, histogram
    assert not any(n.domain == "passctl" for n in out.graph.node)
    assert diff.ok(1e-5), str(diff)


@pytest.mark.parametrize("model_id", ["minilm_legacy", "ppocr_rec"])
def test_cleanup_fuse_for_tvm_lowers_to_standard_onnx(model_id):
    stats, out, diff = _run(model_id, "tvm")
    assert stats["lower-standard"]["lowered"] > 0 and stats["lower-standard"]["unlowered"] == 0
    assert {o.domain for o in out.opset_import} <= {"", "ai.onnx"}
    assert diff.ok(1e-5), str(diff)
