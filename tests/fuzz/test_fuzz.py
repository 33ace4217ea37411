"""The CI slice of the differential fuzzer (issue 15, build item 8): 200 seeded graphs per pass
family through ``passctl compile`` and ONNX Runtime, 0 WRONG and 0 INTERNAL allowed
(``benchmarks/fuzz.py`` runs more; ``tests/fuzz/fuzz_runner.py`` says how a run is judged)."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest

from fuzz_graphs import FOCI, generate
from fuzz_runner import FAMILIES, INTERNAL, REFUSED, WRONG, grouped, run_many

GRAPHS = 200


def _report(summary, kinds=(WRONG, INTERNAL)) -> str:
    lines = [summary.table()]
    for key, group in grouped(summary.failures(kinds)):
        seeds = ", ".join(str(o.seed) for o in group[:20])
        lines.append(f"[{len(group)}] {key}\n    seeds {seeds}\n    e.g. {group[0].line()}")
    return "\n".join(lines)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILIES))
def test_fuzz_family(name):
    """Every graph of the slice compiles to an artifact that agrees with the original (or is
    refused with a one-line user error); reproduce one with
    ``python benchmarks/fuzz.py --family NAME --seed S --graphs 1 -v``. The slice must exercise
    the family: most graphs are changed by its passes and few are refused."""
    summary = run_many([FAMILIES[name]], range(GRAPHS))
    assert len(summary.outcomes) == GRAPHS
    failures = summary.failures()
    assert not failures, f"{len(failures)} WRONG/INTERNAL runs of {name}:\n{_report(summary)}"
    refused = summary.failures((REFUSED,))
    assert len(refused) <= GRAPHS // 10, _report(summary, (REFUSED,))
    assert sum(o.changed for o in summary.outcomes) >= GRAPHS // 2, summary.table()


@pytest.mark.slow
def test_fuzz_attention_reaches_flash_attn():
    """``fuse`` before ``flash-attn`` must not take attention away from it (e.g. by turning Q.K^T
    into a FusedMatMul first): on the same graphs, ``cleanup,fuse,flash-attn`` fuses attention in
    at least 90% of the graphs where ``flash-attn`` alone does, and lowers it to an attention op."""
    full = FAMILIES["flash-attn"]
    alone = dataclasses.replace(full, name="flash-attn-alone", pipeline="flash-attn")
    summary = run_many([full, alone], range(80))
    a, b = summary.attention("flash-attn"), summary.attention("flash-attn-alone")
    assert b["fused"] >= 20, b  # the generator writes attention flash-attn recognizes
    assert a["fused"] >= 0.9 * b["fused"] and a["attention_op"] >= 0.9 * b["fused"], (a, b)


@pytest.mark.parametrize("focus", FOCI)
def test_generated_graphs_are_valid_and_seeded(focus):
    """The generator's graphs pass the full ONNX checker (it raises otherwise) and one seed gives
    one graph."""
    for seed in range(10):
        a, b = generate(seed, focus), generate(seed, focus)
        onnx.checker.check_model(a.model, full_check=True)
        assert a.model.SerializeToString() == b.model.SerializeToString()
        assert a.feeds.keys() == b.feeds.keys()
        for k in a.feeds:
            np.testing.assert_array_equal(a.feeds[k], b.feeds[k])


# The fuzzer's NaN / fully-masked-row graphs of the attention lowerings (MultiHeadAttention with
# nan_to_zero and V not finite; a finite Where fill with a NaN in a masked key's K; -inf masks with
# fully masked rows): each once WRONG on main, kept as a quick regression slice.
NAN_ATTENTION_SEEDS = (13, 43, 61, 102, 325, 336, 390, 529, 598, 667, 949, 960)


@pytest.mark.parametrize("seed", NAN_ATTENTION_SEEDS)
def test_attention_nan_and_masked_row_regressions(seed, tmp_path):
    from fuzz_runner import OK, run_one

    outcome = run_one(FAMILIES["flash-attn"], seed, str(tmp_path))
    assert outcome.kind == OK, outcome.line()
    assert outcome.attention_ops >= 1, outcome.line()  # a kernel form was taken, not the decomposed one


# The WRONG seeds of the 60-minute runs (benchmarks/results/fuzz-2026-12-02*.md), with the outcome
# each must have now: flash-attn:6883 is right (an ill-conditioned LayerNorm after fully masked
# attention: judged against the original's float64 evaluation, tests/tools/test_float64_judge.py);
# cleanup:7016 is ONNX Runtime's optimizer breaking the original's values at ORT_ENABLE_ALL,
# refused naming the level that runs right (tests/tools/test_ort_optimizer_bugs.py); fuse:8655
# (INTERNAL of the second run) is ONNX Runtime's LayerNorm fusion breaking passctl's valid graph
# with a SimplifiedLayerNormalization, refused likewise.
HOUR_RUN_REGRESSIONS = (("flash-attn", 6883, "OK"), ("cleanup", 7016, "REFUSED"),
                        ("fuse", 8655, "REFUSED"))


@pytest.mark.parametrize("name,seed,kind", HOUR_RUN_REGRESSIONS)
def test_hour_run_regressions(name, seed, kind, tmp_path):
    from fuzz_runner import run_one

    outcome = run_one(FAMILIES[name], seed, str(tmp_path))
    assert outcome.kind == kind, outcome.line()
    if name == "flash-attn":
        assert outcome.attention_ops >= 1, outcome.line()
    if kind == REFUSED:
        assert "ONNX Runtime's graph optimizer" in outcome.reason, outcome.line()


def test_fp32_comparison_uses_the_float64_answer_only_to_excuse_rounding():
    """The fuzzer's float32 judge on seed 6883's output: ONNX Runtime's fp32 original is 6e-5
    relative off the exact answer (beta69 broadcast: LayerNorm over equal rows); an artifact on
    the exact answer passes only with the float64 evaluation; one 1e-3 off it fails with it."""
    import os

    from fuzz_runner import _compare_fp32

    from passctl.support.check import run_onnxruntime

    case = os.path.join(os.path.dirname(__file__), "..", "cases", "fuzz-flash-attn-6883")
    model = onnx.load(os.path.join(case, "fuzz_flash_attn_6883.onnx"))
    beta = next(onnx.numpy_helper.to_array(t) for t in model.graph.initializer
                if t.name == "beta69")
    exact = np.broadcast_to(beta.astype(np.float64), (1, 5, 12))
    ref = run_onnxruntime(os.path.join(case, "fuzz_flash_attn_6883.onnx"),
                          dict(np.load(os.path.join(case, "inputs.npz"))))["add_70"]
    right = exact.astype(np.float32)
    assert "max abs error" in (_compare_fp32(ref, right) or "")
    assert _compare_fp32(ref, right, lambda: exact) is None
    wrong = (exact * 1.001).astype(np.float32)
    why = _compare_fp32(ref, wrong, lambda: exact)
    assert why is not None and "beyond the original's own fp32 error" in why, why
