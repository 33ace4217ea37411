"""Acceptance of issue 19 on MiniLM (tests/corpus.py minilm_legacy): a quantize run whose error
exceeds the bound (``quantize{budget=1}``: every layer int8, mean-rel about 0.8 on the seeded
feeds) -- ``passctl bisect`` names the layer whose int8 change crosses ``mean-rel 0.05``. The
reproducer's IR before and after that one layer is run in ONNX Runtime (graph optimizations off)
and measured with numpy here, not with passctl's numbers."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from compare_helpers import run_all_tensors

from corpus import corpus_path
from passctl.ir.onnx_export import to_onnx
from passctl.ir.parser import parse_model
from passctl.support.inputs import make_inputs

BOUND = 0.05
SIZES = {"batch": 1, "sequence": 16}


def _mean_rel(ref: np.ndarray, got: np.ndarray) -> float:
    a, b = ref.astype(np.float64), got.astype(np.float64)
    return float(np.sum(np.abs(a - b)) / np.sum(np.abs(a)))


def _worst(path, ref, feeds, outputs) -> float:
    with open(path, encoding="utf-8") as f:
        model = parse_model(f.read(), str(path))
    got = run_all_tensors(to_onnx(model), feeds)
    return max(_mean_rel(ref[o], got[o]) for o in outputs)


@pytest.mark.slow
def test_bisect_names_the_minilm_layer_whose_int8_crosses_the_bound(cli, tmp_path):
    minilm = corpus_path("minilm_legacy")
    res = cli("bisect", minilm, "--dim", "batch=1", "--dim", "sequence=16", "-p",
              "quantize{budget=1,samples=1,dims=batch=1;sequence=16}",
              "--bound", f"mean-rel={BOUND}", "-o", tmp_path / "repro")
    assert res.rc == 0, res.err
    assert re.search(r"first pass breaking mean-rel <= 0.05: \d+ quantize-int8", res.out), res.out
    line = next(l for l in res.out.splitlines() if l.startswith("first rewrite breaking it"))
    m = re.search(r"#(\d+) rule 'int8' at node '([^']+)' \(MatMul\), provenance (\S+)", line)
    assert m, line
    k, layer = int(m.group(1)), m.group(2)
    assert m.group(3) == layer
    proto = onnx.load(minilm)
    names = [n.name for n in proto.graph.node]
    assert layer in names and k > 1  # a real layer, and not simply the first one quantized
    feeds = make_inputs(minilm, seed=0, dim_values=SIZES)
    outputs = [o.name for o in proto.graph.output]
    ref = run_all_tensors(proto, feeds)
    # independently: int8 on the k - 1 layers before it keeps the bound, adding it breaks it
    before = _worst(tmp_path / "repro" / "before.pir", ref, feeds, outputs)
    after = _worst(tmp_path / "repro" / "after.pir", ref, feeds, outputs)
    assert before <= BOUND < after
    # and the two IRs differ in that layer alone: it reads a DequantizeLinear only after
    res = cli("diff", tmp_path / "repro" / "before.pir", tmp_path / "repro" / "after.pir")
    assert res.rc == 0, res.err
    changed = [l for l in res.out.splitlines() if l[:1] in "~*"]
    assert changed and all(layer in l for l in changed), res.out
