"""`reparam` on timm RepVGG-A0, RepVGG-B1g4 (grouped), MobileOne-S0 vs ONNX Runtime and timm's own merge."""

from __future__ import annotations

import pytest
from reparam_helpers import max_rel, op_counts, reparam_stats, run_reparam

from reparam_export import MODELS, timm_pair


@pytest.fixture(scope="module", params=MODELS)
def timm_case(request):
    """(name, training-time export, timm reparameterize_model export, our output, manager result)."""
    train, timm_reparam = timm_pair(request.param)
    out, result = run_reparam(train)
    return request.param, train, timm_reparam, out, result


def test_each_block_is_one_conv(timm_case):
    name, train, timm_reparam, out, result = timm_case
    before, after, expected = op_counts(train), op_counts(out), op_counts(timm_reparam)
    # The exports really are the multi-branch training form: BNs and branch Adds are there.
    assert before["BatchNormalization"] > before["Conv"] / 2 and before["Add"] > 0
    assert after["Conv"] == expected["Conv"] < before["Conv"]
    assert after["BatchNormalization"] == 0 and after["Add"] == 0 and after["Constant"] == 0
    # Same graph as timm's own reparameterized model, op for op.
    assert after == expected
    stats = reparam_stats(result)
    assert stats["merged"] == expected["Conv"] and "unmerged" not in stats
    assert stats["branches"] >= 2 * stats["merged"]


def test_outputs_match_original_within_1e4(timm_case):
    name, train, _, out, _ = timm_case
    assert max_rel(train, out) <= 1e-4


def test_outputs_match_timm_reparameterize_within_1e5(timm_case):
    name, _, timm_reparam, out, _ = timm_case
    assert max_rel(timm_reparam, out) <= 1e-5


def test_grouped_and_depthwise_convs_kept(timm_case):
    """RepVGG-B1g4's grouped convs stay grouped (group 4) and MobileOne's depthwise stay depthwise:
    the merge never makes a denser kernel than the branches had."""
    name, _, timm_reparam, out, _ = timm_case
    groups = sorted(next((a.i for a in n.attribute if a.name == "group"), 1)
                    for n in out.graph.node if n.op_type == "Conv")
    import onnx

    expected = sorted(next((a.i for a in n.attribute if a.name == "group"), 1)
                      for n in onnx.load(timm_reparam).graph.node if n.op_type == "Conv")
    assert groups == expected
    if name == "repvgg_b1g4":
        assert 4 in groups
    if name == "mobileone_s0":
        assert max(groups) > 4
