"""AWQ (``quantize-weights{awq=true}``, passes/quantize/awq.py) and the int8 fallback of the budget
on a tiny random Llama decoder graph (GQA, tied LM head) from ``export-decoder``: the scales'
fold is exact against ONNX Runtime on the original, AWQ lowers a layer's calibration error below
round-to-nearest's, and the budget returns layers to int8 until its error is met, with a report
whose per-layer bits and errors a re-measurement reproduces."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "decoder"))
from decoder_helpers import tiny_model  # noqa: E402

from passctl.ir import from_onnx, to_onnx  # noqa: E402
from passctl.passes.decoder.quantize import (decoder_feeds, every_position,  # noqa: E402
                                             quantize_decoder)
from passctl.passes.precision.sensitivity import output_error, run_model  # noqa: E402
from passctl.passes.quantize import awq  # noqa: E402
from passctl.passes.quantize.weights import (BlockCodes, QuantizeWeights,  # noqa: E402
                                             _weight_layers, quantize_blocks)
from passctl.tools.export_decoder import export_from_transformers  # noqa: E402

CALIB = np.random.default_rng(3).integers(2, 250, 96)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    out = tmp_path_factory.mktemp("awq") / "fp32"
    export_from_transformers(tiny_model("llama", seed=2), None, str(out), max_length=32)
    proto = onnx.load(str(out / "model.onnx"))
    every_position(proto)  # every position's logits: the fold is checked on all of them
    return proto


def _feeds(proto):
    return list(decoder_feeds(proto, CALIB, 32))


def test_awq_fold_is_exact_against_onnxruntime(decoder):
    model = from_onnx(decoder)
    layers, _ = _weight_layers(model, [])
    groups = awq.collect(model, awq.find_groups(model, [wl.layer.position for wl in layers]),
                         _feeds(decoder))
    folds = sorted(g.fold for g in groups)
    # per layer: qkv and gate_up (norm), down (linear through Split/Mul), o_proj (none: GQA);
    # the tied LM head through the last-token Slice/Reshape (norm)
    assert folds.count("norm") == 2 * 2 + 1 and folds.count("linear") == 2
    assert folds.count("none") == 2
    rng = np.random.default_rng(0)
    for g in groups:  # strong scales (e^N(0,1)), so a wrong fold could not hide in rounding
        g.alpha, g.scales = 1.0, np.exp(rng.normal(size=g.k)).astype(np.float32)
    assert awq.fold(model, groups) == 7
    folded = to_onnx(model)
    ref = run_model(from_onnx(decoder), _feeds(decoder), outputs=["logits"])
    got = run_model(from_onnx(folded), _feeds(decoder), outputs=["logits"])
    err = max(float(np.abs(a["logits"] - b["logits"]).max() / np.abs(b["logits"]).max())
              for a, b in zip(got, ref))
    assert err < 1e-5
    changed = ({t.name for t in folded.graph.initializer}
               - {t.name for t in decoder.graph.initializer})
    assert any("layernorm" in n and n.endswith("_awq") for n in changed)
    assert any("gate_up" in n and n.endswith("_awq") for n in changed)


def test_awq_lowers_layer_calibration_error_below_rtn(decoder):
    model = from_onnx(decoder)
    layers, _ = _weight_layers(model, [])
    groups = awq.collect(model, awq.find_groups(model, [wl.layer.position for wl in layers]),
                         _feeds(decoder))
    nodes = list(model.graph)
    weights = {m: awq.layer_weight(nodes[m]) for g in groups for m in g.members}

    def deq(w):
        return quantize_blocks(w, 4, 32).dequantize()

    awq.search(groups, weights, deq)
    gains = []
    for g in groups:
        if g.fold == "none":
            assert g.alpha == 0 and list(g.errors) == [0.0]
            continue
        assert set(g.errors) == set(awq.ALPHAS)
        rtn = g.errors[0.0]  # alpha 0: s = 1, plain round to nearest
        # recompute the chosen alpha's error here, independently of search()
        x, s = g.x, g.scales
        num = den = 0.0
        for m in g.members:
            ref = x @ weights[m]
            num += float(np.sum((x / s @ deq(weights[m] * s[:, None]) - ref) ** 2))
            den += float(np.sum(ref ** 2))
        assert np.sqrt(num / den) == pytest.approx(g.errors[g.alpha], rel=1e-4)
        gains.append(rtn / g.errors[g.alpha])
    assert min(gains) >= 1.0 and max(gains) > 1.05


def test_budget_returns_layers_to_int8_and_report_matches(decoder):
    ids = CALIB
    out, stats = quantize_decoder(onnx.ModelProto.FromString(decoder.SerializeToString()), 4, 32,
                                  awq=True, calib_ids=ids, window=32, budget=0.02,
                                  metric="mean-rel", fallback="int8", sensitivity="layer")
    rows = {r["name"]: r for r in stats["layers"]}
    assert stats["within_budget"] and stats["error"] <= 0.02
    assert stats["search"]["sensitivity"] == "layer" and stats["search"]["fallback"] == "int8"
    bits = sorted(r["bits"] for r in rows.values())
    assert set(bits) <= {4, 8} and 8 in bits
    assert stats["quantized_layers"] == bits.count(4) and stats["fallback_layers"] == bits.count(8)
    # the layers returned are the most sensitive by the measured layer error
    ranked = sorted(rows.values(), key=lambda r: -r["layer_error"])
    assert [r["bits"] for r in ranked] == sorted(bits, reverse=True)
    # re-measure: the emitted graph's error on the calibration feeds is the reported one
    every_position(out)
    ref = run_model(from_onnx(decoder), _feeds(decoder), outputs=["logits"], optimize=True)
    got = run_model(from_onnx(out), _feeds(decoder), outputs=["logits"], optimize=True)
    assert output_error(ref, got, "mean-rel") == pytest.approx(stats["error"], rel=1e-3)
    # each row's bits and block are those of the MatMulNBits nodes in the graph
    emitted = []
    for n in out.graph.node:
        if n.op_type == "MatMulNBits":
            a = {x.name: onnx.helper.get_attribute_value(x) for x in n.attribute}
            emitted.append((a["bits"], a["block_size"], a["K"], a["N"]))
    assert sorted(emitted) == sorted((r["bits"], r["block"], r["K"], r["N"])
                                     for r in rows.values())
    one = QuantizeWeights(bits=4)  # a budget the all-int4 model meets keeps every layer int4
    assert one.options.fallback == "float"
    _, loose = quantize_decoder(onnx.ModelProto.FromString(decoder.SerializeToString()), 4, 32,
                                calib_ids=ids, window=32, budget=10.0, fallback="int8")
    assert loose["quantized_layers"] == len(rows) and loose["fallback_layers"] == 0


def test_blockcodes_roundtrip_for_fallback():
    w = np.random.default_rng(0).normal(size=(64, 8)).astype(np.float32)
    c = quantize_blocks(w, 8, 64)
    assert isinstance(c, BlockCodes) and c.bits == 8
    assert np.abs(c.dequantize() - w).max() < np.abs(w).max() / 100


def test_ppl_metric_is_the_relative_perplexity_increase():
    from passctl.passes.decoder.quantize import ppl

    rng = np.random.default_rng(1)
    feeds = [{"input_ids": rng.integers(0, 7, (1, 5))} for _ in range(2)]
    ref = [{"logits": rng.normal(size=(1, 5, 7))} for _ in range(2)]
    cand = [{"logits": r["logits"] + rng.normal(size=(1, 5, 7))} for r in ref]

    def nll(outs):
        tot = []
        for f, o in zip(feeds, outs):
            z = o["logits"][0][:-1]
            p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
            tot += list(-np.log(p[np.arange(4), f["input_ids"][0][1:]]))
        return np.mean(tot)

    assert ppl(feeds, ref, ref) == pytest.approx(0.0, abs=1e-12)
    assert ppl(feeds, ref, cand) == pytest.approx(np.exp(nll(cand) - nll(ref)) - 1, rel=1e-9)


def test_export_decoder_ppl_budget_needs_calibration_text():
    import argparse

    from passctl.ir.errors import UserError
    from passctl.tools.export_decoder import _quantize_options

    args = argparse.Namespace(weights="int4", ppl_budget=0.05, awq=False, calib_text=None,
                              fallback="int8", max_length=64)
    with pytest.raises(UserError, match="--calib-text"):
        _quantize_options(args, tokenizer=object())
    args.ppl_budget = None
    assert _quantize_options(args, tokenizer=None) == {}


def test_int8_fallback_rows_are_the_emitted_codes():
    """budget with fallback=int8 on a 2-layer MLP (random feeds): each report row's bits, block
    and weight error are re-measured from the MatMulNBits initializers (unpacked by the layout,
    test_quantize_weights._unpack), and the model's error from ONNX Runtime."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_quantize_weights import _mlp, _unpack

    from passctl.passes.precision.sensitivity import calibration_inputs
    from passctl.support.check import cpu_session

    proto, (w1, _, w2) = _mlp(seed=3)
    # all int4 0.135 mean-rel, one layer int8 0.089, both 0.0115 (measured, not taken as 0): a
    # budget of 1e-2 is reported missed, 3e-2 returns both layers to int8
    tight = QuantizeWeights(bits=4, block=32, budget=1e-2, samples=2, fallback="int8",
                            sensitivity="layer").run(from_onnx(proto)).stats
    assert tight["within_budget"] is False and tight["error"] > 1e-2
    assert [k for k, _ in tight["search"]["history"]] == [0, 1, 2]
    budget = 3e-2
    model = from_onnx(proto)
    stats = QuantizeWeights(bits=4, block=32, budget=budget, samples=2, fallback="int8",
                            sensitivity="layer").run(model).stats
    out = to_onnx(model)
    rows = {r["name"]: r for r in stats["layers"]}
    assert stats["fallback_layers"] >= 1 and stats["float_layers"] == 0
    originals = {"mm1": w1, "mm2": w2}
    by_output = {"h": "mm1", "y": "mm2"}
    nodes = [n for n in out.graph.node if n.op_type == "MatMulNBits"]
    assert len(nodes) == 2
    for n in nodes:
        name = next(v for k, v in by_output.items() if n.output[0].startswith(k))
        w = originals[name].astype(np.float64)
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        assert (attrs["bits"], attrs["block_size"]) == (rows[name]["bits"], rows[name]["block"])
        err = np.linalg.norm(_unpack(out, n) - w) / np.linalg.norm(w)
        assert err == pytest.approx(rows[name]["weight_error"], rel=1e-3)
        assert rows[name]["layer_error"] > 0
    feeds = calibration_inputs(from_onnx(proto), samples=2)
    ref = [cpu_session(proto.SerializeToString()).run(None, f)[0] for f in feeds]
    got = [cpu_session(out.SerializeToString(), optimize=True).run(None, f)[0] for f in feeds]
    err = max(np.abs(g - r).sum() / np.abs(r).sum() for g, r in zip(got, ref))
    assert err == pytest.approx(stats["error"], rel=1e-3) and err <= budget
    assert stats["within_budget"] is True
