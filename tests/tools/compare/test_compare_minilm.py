"""Acceptance of issue 19 on MiniLM (tests/corpus.py minilm_legacy): a rule loaded with --load that
drops LayerNormalization's epsilon (tests/tools/compare/wrong_rules.py) inside ``cleanup,...,fuse``.
``passctl bisect`` must name that rule and the node it rewrote, ``passctl compare`` the first wrong
tensor by its original name; both are checked against ONNX Runtime runs of the original model with
that one epsilon dropped by hand (onnx.helper), not against passctl's own numbers."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
from compare_helpers import WRONG_RULES, max_rel, run_all_tensors

from passctl.support.inputs import make_inputs
from passctl.tools.cli import main
from corpus import corpus_path

PIPELINE = "cleanup,wrong-layernorm,fuse"
DIMS = ["--dim", "batch=1", "--dim", "sequence=16"]
BOUND = 1e-4


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def minilm():
    return corpus_path("minilm_legacy")


@pytest.fixture(scope="module")
def first_layernorm(minilm):
    """(node, index) of the first LayerNormalization of the original graph, in graph order."""
    proto = onnx.load(minilm)
    return next((n, i) for i, n in enumerate(proto.graph.node) if n.op_type == "LayerNormalization")


@pytest.fixture(scope="module")
def feeds(minilm):
    return make_inputs(minilm, seed=0, dim_values={"batch": 1, "sequence": 16})


@pytest.fixture(scope="module")
def epsilon_dropped(minilm, first_layernorm, feeds):
    """ONNX Runtime on the original and on the original with only the first LayerNormalization's
    epsilon removed (so ONNX's default 1e-5 applies): every tensor of both."""
    proto = onnx.load(minilm)
    ref = run_all_tensors(proto, feeds)
    node = proto.graph.node[first_layernorm[1]]
    keep = [a for a in node.attribute if a.name != "epsilon"]
    assert len(keep) < len(node.attribute)  # the model states its epsilon (1e-12)
    del node.attribute[:]
    node.attribute.extend(keep)
    return ref, run_all_tensors(proto, feeds)


@pytest.fixture(scope="module")
def compared(minilm, tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    rc, stdout, stderr = _run(["compare", minilm, "--pipeline", PIPELINE, "--load", WRONG_RULES,
                               *DIMS, "--bound", f"max-rel={BOUND}", "-o", out])
    assert rc == 0, stderr
    with open(out / "compare.json") as f:
        return json.load(f), stdout, out


@pytest.fixture(scope="module")
def bisected(minilm, tmp_path_factory):
    out = tmp_path_factory.mktemp("bisect") / "repro"
    rc, stdout, stderr = _run(["bisect", minilm, "--pipeline", PIPELINE, "--load", WRONG_RULES,
                               *DIMS, "--bound", f"max-rel={BOUND}", "-o", out])
    assert rc == 0, stderr
    return stdout, out


def test_dropping_that_epsilon_really_breaks_the_bound(epsilon_dropped, first_layernorm, minilm):
    ref, bad = epsilon_dropped
    outputs = [o.name for o in onnx.load(minilm).graph.output]
    assert max(max_rel(ref[o], bad[o]) for o in outputs) > BOUND
    assert max_rel(ref[first_layernorm[0].output[0]], bad[first_layernorm[0].output[0]]) > BOUND


def test_compare_points_at_the_first_wrong_tensor_by_its_original_name(compared, first_layernorm,
                                                                     epsilon_dropped):
    report, stdout, _ = compared
    name = first_layernorm[0].output[0]
    assert report["first_jump"] == name
    assert report["first_over_bound"] == name
    assert f"'{name}'" in stdout
    entry = next(t for t in report["tensors"] if t["original"] == name)
    ref, bad = epsilon_dropped
    # the candidate's tensor is the hand-made wrong LayerNorm's output: same error against the
    # original (cleanup's float32 rounding aside)
    assert entry["max_rel"] == pytest.approx(max_rel(ref[name], bad[name]), rel=1e-2)
    # every paired tensor before it in the original's graph order is within the bound
    before = [t for t in report["tensors"] if t["status"] == "paired"
              and t["index"] < first_layernorm[1]]
    assert before and all(t["max_rel"] <= BOUND or t["max_abs"] <= 2.4e-7 for t in before)


def test_compare_pairs_are_same_shape_and_statuses_cover_every_float_tensor(compared, minilm,
                                                                            epsilon_dropped):
    report, _, _ = compared
    ref, _ = epsilon_dropped
    proto = onnx.load(minilm)
    floats = [name for n in proto.graph.node if n.op_type != "Constant" for name in n.output
              if name in ref and ref[name].dtype.kind == "f"]
    assert [t["original"] for t in report["tensors"]] == floats
    assert report["counts"]["paired"] + report["counts"]["fused-away"] + \
        report["counts"]["removed"] == len(floats)
    for t in report["tensors"]:
        if t["status"] == "paired":
            assert t["shape"] == list(ref[t["original"]].shape)


def test_bisect_names_the_rule_the_node_and_its_provenance(bisected, first_layernorm):
    stdout, _ = bisected
    node = first_layernorm[0].name
    assert re.search(r"first pass breaking max-rel <= 0.0001: \d+ wrong-layernorm", stdout), stdout
    line = next(l for l in stdout.splitlines() if l.startswith("first rewrite breaking it"))
    assert "rule 'drop-layernorm-epsilon'" in line
    assert f"at node '{node}'" in line
    assert line.endswith(f"provenance {node}")


def test_bisect_reproducer_shows_the_error(bisected, minilm, epsilon_dropped):
    _, folder = bisected
    assert sorted(os.listdir(folder)) == ["after.pir", "before.pir", "inputs.npz", "repro.py",
                                          "rewrite.json"]
    with open(folder / "rewrite.json") as f:
        info = json.load(f)
    assert info["rewrite"]["rule"] == "drop-layernorm-epsilon"
    assert info["rewrite"]["replaced"][0]["attributes"]["epsilon"].startswith("9.99")
    assert "epsilon" not in info["rewrite"]["new"][0]["attributes"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    run = subprocess.run([sys.executable, str(folder / "repro.py")], capture_output=True,
                         text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    errors = dict(re.findall(r"^(before|after): max-rel (\S+)", run.stdout, re.M))
    assert float(errors["before"]) <= BOUND < float(errors["after"])
    ref, bad = epsilon_dropped
    outputs = [o.name for o in onnx.load(minilm).graph.output]
    expected = max(max_rel(ref[o], bad[o]) for o in outputs)
    assert float(errors["after"]) == pytest.approx(expected, rel=2e-2)


def test_diff_of_original_and_the_rewritten_ir_names_the_epsilon_change(bisected, minilm, cli,
                                                                        first_layernorm):
    _, folder = bisected
    res = cli("diff", minilm, folder / "after.pir")
    assert res.rc == 0, res.err
    changed = [l for l in res.out.splitlines() if l.startswith("~")]
    assert len(changed) == 1
    assert f"'{first_layernorm[0].name}'" in changed[0]
    assert "epsilon: 1e-12" in changed[0] and "-> (absent)" in changed[0]


def test_compare_runs_passctl_only_ops_through_lowering_and_pairs_no_stranger(minilm, tmp_path):
    """fuse-layernorm/-gelu/-attention leave passctl::SkipLayerNorm, Gelu and Attention (ONNX
    Runtime has no kernel for them): compare runs them through lower-standard. The pipeline is
    exact in float32, so a paired tensor whose values differ is a stranger; the attention
    lowering's Q.K^T (Q scaled first) and Gelu's products (halved last) are such strangers if
    paired by op and shape, and must be reported fused away instead."""
    from passctl.tools.compare import load_candidate

    pipeline = "cleanup,fuse-layernorm,fuse-gelu,fuse-attention"
    model, _ = load_candidate(minilm, None, pipeline)
    assert {n.op_type for n in model.graph if n.domain == "passctl"} >= {"Attention", "Gelu"}
    rc, _, err = _run(["compare", minilm, "-p", pipeline, *DIMS, "-o", tmp_path])
    assert rc == 0, err
    with open(tmp_path / "compare.json") as f:
        report = json.load(f)
    paired = [t for t in report["tensors"] if t["status"] == "paired"]
    assert len(paired) > 100
    assert all(t["max_rel"] <= 1e-5 or t["max_abs"] <= 2.4e-7 for t in paired), \
        [t["original"] for t in paired if t["max_rel"] > 1e-5]
    assert report["first_jump"] is None
    by_name = {t["original"]: t for t in report["tensors"]}
    assert by_name["/model/encoder/layer.0/attention/self/MatMul_output_0"]["status"] == \
        "fused-away"
