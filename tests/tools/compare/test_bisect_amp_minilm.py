"""Acceptance of issue 19 on MiniLM (tests/corpus.py minilm_legacy): ``amp{dtype=fp16,budget=1e-6}``
forced (``force=``) onto three layer-0 nodes; ``passctl bisect`` must name the one whose fp16 change
crosses the bound. The expectation comes from ONNX Runtime runs of the original model with those
nodes put in fp16 by hand (Casts written with onnx.helper), not from passctl's numbers. Plus the
``force=`` errors on a small model."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from compare_helpers import max_rel, run_all_tensors
from onnx import TensorProto, helper

from corpus import corpus_path
from passctl.support.inputs import make_inputs
from test_compare_pairing import _fp16_sensitive_model

L0 = "/model/encoder/layer.0"
QUERY = f"{L0}/attention/self/query/MatMul"
SOFTMAX = f"{L0}/attention/self/Softmax"
LAYERNORM = f"{L0}/attention/output/LayerNorm/LayerNormalization"
BOUND = 2e-4
SIZES = {"batch": 1, "sequence": 16}


def with_fp16(proto: onnx.ModelProto, names, ref) -> onnx.ModelProto:
    """A copy of ``proto`` where each node named in ``names`` computes on fp16 values: every float32
    input (weights included) rounded to fp16 and back, the node in float32, its output rounded to
    fp16 and back (the correctly rounded fp16 result for an elementwise op; float32 accumulation
    for MatMul and the norm, as fp16 hardware does). ``ref``: the float32 run's tensors (to know
    which inputs are float32)."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    floats = {k for k, v in ref.items() if v.dtype == np.float32}
    floats |= {i.name for i in proto.graph.initializer if i.data_type == TensorProto.FLOAT}
    floats |= {i.name for i in proto.graph.input if i.type.tensor_type.elem_type == TensorProto.FLOAT}
    out = []
    for n in proto.graph.node:
        if n.name not in names:
            out.append(n)
            continue
        ins = []
        for k, x in enumerate(n.input):
            if x not in floats:
                ins.append(x)
                continue
            out += [helper.make_node("Cast", [x], [f"{n.name}_h{k}"], to=TensorProto.FLOAT16),
                    helper.make_node("Cast", [f"{n.name}_h{k}"], [f"{n.name}_f{k}"],
                                     to=TensorProto.FLOAT)]
            ins.append(f"{n.name}_f{k}")
        res = n.output[0]
        node = onnx.NodeProto()
        node.CopyFrom(n)
        node.input[:] = ins
        node.output[0] = res + "_wide"
        out += [node, helper.make_node("Cast", [res + "_wide"], [res + "_h"], to=TensorProto.FLOAT16),
                helper.make_node("Cast", [res + "_h"], [res], to=TensorProto.FLOAT)]
    del proto.graph.node[:]
    proto.graph.node.extend(out)
    return proto


@pytest.fixture(scope="module")
def minilm():
    return corpus_path("minilm_legacy")


@pytest.mark.slow
def test_bisect_names_the_forced_node_whose_fp16_crosses_the_bound(minilm, cli, tmp_path):
    feeds = make_inputs(minilm, seed=0, dim_values=SIZES)
    proto = onnx.load(minilm)
    outputs = [o.name for o in proto.graph.output]
    ref = run_all_tensors(proto, feeds)

    def error(names) -> float:
        got = run_all_tensors(with_fp16(proto, set(names), ref), feeds)
        return max(max_rel(ref[o], got[o]) for o in outputs)

    # independently: the two forced nodes before the LayerNorm (graph order) keep max-rel 2e-4
    # together; the LayerNorm alone crosses it, and so do all three
    assert error([QUERY, SOFTMAX]) < BOUND
    assert error([LAYERNORM]) > BOUND
    assert error([QUERY, SOFTMAX, LAYERNORM]) > BOUND
    force = ";".join([SOFTMAX, LAYERNORM, QUERY])  # any order: bisect steps in graph order
    res = cli("bisect", minilm, "--dim", "batch=1", "--dim", "sequence=16", "-p",
              f"amp{{dtype=fp16,budget=1e-6,dims=batch=1;sequence=16,force={force}}}",
              "--bound", f"max-rel={BOUND}", "-o", tmp_path / "repro")
    assert res.rc == 0, res.err
    assert "mixed-precision" in res.out
    line = next(l for l in res.out.splitlines() if l.startswith("first rewrite breaking it"))
    assert f"rule 'precision fp16' at node '{LAYERNORM}' (LayerNormalization)" in line, res.out
    with open(tmp_path / "repro" / "rewrite.json") as f:
        info = json.load(f)
    # bisect's own numbers agree with the hand-made fp16 graphs (its emulation rounds the same way)
    before = float(info["error_before"].split()[1].rstrip(","))
    after = float(info["error_after"].split()[1].rstrip(","))
    assert before == pytest.approx(error([QUERY, SOFTMAX]), rel=0.3)
    assert after == pytest.approx(error([QUERY, SOFTMAX, LAYERNORM]), rel=0.3)


def test_force_makes_a_node_fp16_that_the_search_keeps_float32(cli, tmp_path):
    """budget 1e-6 keeps every node of the small model float32; force=shift makes the Add fp16
    anyway, and bisect names it."""
    from test_compare_pairing import _error_with_fp16

    model = tmp_path / "sensitive.onnx"
    _fp16_sensitive_model(model)
    feeds = make_inputs(str(model), seed=0)
    assert _error_with_fp16(model, {"shift"}, feeds) > 1e-2
    res = cli("bisect", model, "-p", "amp{dtype=fp16,budget=1e-6,force=shift}", "--bound",
              "max-rel=1e-2", "-o", tmp_path / "repro")
    assert res.rc == 0, res.err
    line = next(l for l in res.out.splitlines() if l.startswith("first rewrite breaking it"))
    assert "rule 'precision fp16' at node 'shift' (Add)" in line, res.out
    res = cli(model, "-p", "amp{dtype=fp16,budget=1e-6,force=shift}", "-o", tmp_path / "art", "-q")
    assert res.rc == 0, res.err
    with open(tmp_path / "art" / "report.json") as f:
        report = json.load(f)
    stats = next(p["stats"] for p in report["passes"] if p["name"] == "mixed-precision")
    rows = {e["name"]: e for e in stats["nodes"]}
    assert rows["shift"]["precision"] == "fp16" and rows["shift"]["forced"] is True
    assert rows["mm"]["precision"] == "fp32"


@pytest.mark.parametrize("force, words", [
    ("nosuchnode", ["'nosuchnode'", "not in the graph", "mixed-precision"]),
    ("shift;also_missing", ["'also_missing'", "not in the graph"]),
])
def test_force_unknown_node_is_one_line_user_error(cli, tmp_path, force, words):
    model = tmp_path / "sensitive.onnx"
    _fp16_sensitive_model(model)
    res = cli(model, "-p", f"amp{{dtype=fp16,force={force}}}", "-o", tmp_path / "art", "-q")
    assert res.rc == 2, res.err
    assert len(res.err.strip().splitlines()) == 1, res.err
    assert all(w in res.err for w in words), res.err
