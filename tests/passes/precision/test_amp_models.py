"""amp acceptance on real weights: MiniLM fp16 sentence embeddings, SmolLM2-135M fp16/bf16 perplexity."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from passctl.ir import load, to_onnx
from passctl.passes.manager import PassManager
from passctl.passes.pipeline_text import build_pipeline

logger = logging.getLogger(__name__)


def _amp(path: str, pipeline: str):
    model = load(path)
    result = PassManager(build_pipeline(pipeline, "cpu")).run(model)
    return to_onnx(model), next(r.stats for r in result.records if r.name == "mixed-precision")


def _summary(stats) -> str:
    fp32 = [f"{e['name']}: {e['why']}" for e in stats["nodes"] if e["precision"] == "fp32"]
    return (f"{stats['dtype']}: {stats['low_nodes']} low, {stats['fp32_nodes']} fp32, "
            f"search {stats.get('search')}, measure {stats.get('measure_seconds')} s; fp32: {fp32}")


def _same_with_ort_optimizations(candidate, feed, output: str, rtol: float, plain_session=None):
    """The emitted model also loads and runs with ORT_ENABLE_ALL (its fusions must accept the types);
    ``plain_session``: an ORT_DISABLE_ALL session of ``candidate`` already built."""
    from real_models import session

    plain = (plain_session or session(candidate)).run([output], feed)[0]
    optimized = session(candidate, optimize=True).run([output], feed)[0]
    assert np.abs(optimized - plain).max() <= rtol * np.abs(plain).max()


def _every_fp32_node_says_why(stats):
    assert all(e.get("why") for e in stats["nodes"] if e["precision"] == "fp32")
    assert all("why" not in e for e in stats["nodes"] if e["precision"] != "fp32")


@pytest.mark.slow
def test_minilm_fp16_sentence_embeddings(tmp_path):
    from corpus import corpus_path
    from real_models import cast_ping_pongs, mean_pooled, minilm_feeds, sentences

    texts = sentences()
    assert len(texts) == 200 and len(set(texts)) == 200
    calib = ["Calibration text is kept apart from the test sentences.",
             "The quick brown fox jumps over the lazy dog by the river bank.",
             "How many kilometers is it from Lisbon to Madrid?"]
    for k, feed in enumerate(minilm_feeds(calib, batch=1)):
        np.savez(tmp_path / f"calib{k}.npz", **feed)
    path = corpus_path("minilm_legacy")
    candidate, stats = _amp(path, f"amp{{dtype=fp16,budget=1e-2,metric=mean-rel,calib={tmp_path}}}")
    logger.info("MiniLM %s", _summary(stats))
    _every_fp32_node_says_why(stats)
    assert stats["calibration_feeds"] == 3
    matmuls = [e for e in stats["nodes"] if e["op"] == "MatMul"]
    assert len(matmuls) == 48 and all(e["precision"] == "fp16" for e in matmuls)
    assert stats["weight_bytes_saved"] > 40e6  # encoder weights and embedding tables stored in fp16
    feeds = minilm_feeds(texts)
    reference, got = mean_pooled(path, feeds), mean_pooled(candidate, feeds)
    cosine = (reference * got).sum(1) / np.linalg.norm(reference, axis=1) / np.linalg.norm(got, axis=1)
    logger.info("MiniLM fp16 cosine: min %.7f mean %.7f", cosine.min(), cosine.mean())
    assert cosine.shape == (200,) and cosine.min() >= 0.9999
    assert not np.allclose(reference, got, rtol=0, atol=1e-7)  # it really ran in fp16
    _same_with_ort_optimizations(candidate, feeds[0], "last_hidden_state", 1e-2)
    assert cast_ping_pongs(candidate) == 0


@pytest.mark.slow
def test_smollm2_perplexity_fp16_bf16():
    from real_models import cast_ping_pongs, perplexity, session, smollm2_token_ids
    from zoo import zoo_path

    ids = smollm2_token_ids()
    assert len(ids) >= 2000
    path = zoo_path("smollm2")
    fp32 = perplexity(path, ids)
    assert 5 < fp32 < 100
    for dtype in ("fp16", "bf16"):
        candidate, stats = _amp(path, f"amp{{dtype={dtype},budget=1e-2,metric=mean-rel,samples=1,"
                                      "dims=sequence=64}")
        logger.info("SmolLM2 %s", _summary(stats))
        _every_fp32_node_says_why(stats)
        matmuls = [e for e in stats["nodes"] if e["op"] == "MatMul"]
        assert len(matmuls) >= 211 and sum(e["precision"] == dtype for e in matmuls) >= 200
        plain = session(candidate)  # one ORT_DISABLE_ALL session for both checks below
        window = ids[None, :128]
        _same_with_ort_optimizations(candidate, {"input_ids": window,
                                                 "attention_mask": np.ones_like(window)}, "logits", 0.1,
                                     plain)
        assert cast_ping_pongs(candidate) == 0
        low = perplexity(plain, ids)
        logger.info("SmolLM2 perplexity fp32 %.4f, %s %.4f (%+.3f%%)", fp32, dtype, low,
                    100 * (low / fp32 - 1))
        assert low != fp32 and low <= fp32 * 1.01


@pytest.mark.slow
def test_smollm2_bf16_search_meets_a_tight_budget_in_minutes():
    from passctl.support.check import make_inputs, run_onnxruntime
    from zoo import zoo_path

    path = zoo_path("smollm2")
    budget = 3e-3  # below the all-bf16 error (~7.7e-3 mean-rel on these feeds): the search must work
    candidate, stats = _amp(path, f"amp{{dtype=bf16,budget={budget},metric=mean-rel,samples=1,"
                                  "dims=sequence=64}")
    search = stats["search"]
    logger.info("SmolLM2 bf16 budget %g: %s", budget, _summary(stats))
    _every_fp32_node_says_why(stats)
    assert search["history"][0][0] == 0 and search["history"][0][1] > budget
    assert search["within_budget"] and 0 < search["fp32_by_search"] < stats["low_nodes"]
    assert search["seconds"] < 300 and search["runs"] <= 40
    assert set(search["group_errors"]) >= {"MatMul", "Add", "Mul"}
    # the same calibration feed, recomputed independently of the pass, the candidate run as an
    # ONNX Runtime artifact ships (session.json's ORT_ENABLE_ALL), which the pass measures
    feed = make_inputs(path, seed=0, dim_values={"sequence": 64})
    ref = run_onnxruntime(path, feed)["logits"].astype(np.float64)
    got = run_onnxruntime(candidate, feed, optimize="ORT_ENABLE_ALL")["logits"].astype(np.float64)
    assert np.abs(got - ref).sum() / np.abs(ref).sum() <= budget
