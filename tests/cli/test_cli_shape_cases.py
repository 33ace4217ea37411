"""Issue 15 cases through the CLI, without --check: what the artifact returns is what the original
returns (shape and values), and the report / explain say what happened.

- 04-rmsnorm-checker: the RMSNorm artifact (opset 17) is ONNX Runtime-only, and
  ``report.json``'s ``artifact.runtime_only_ops`` says so.
- 09-stale-value-info-reshape-removed: the Reshape stays; y has shape [3, 2].
- 11-fusion-drops-broadcast-rank: the three fusions are refused; y has shape [1, 2, 8];
  ``passctl explain`` gives the reason (the matcher's: the "scalar" constant broadcasts its
  operand up a rank).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from passctl.support.check import run_onnxruntime
from passctl.support.inputs import make_inputs

CASES = Path(__file__).resolve().parents[1] / "cases"


def _same_as_original(original: Path, out: Path) -> None:
    proto = onnx.load(str(original))
    feeds = make_inputs(proto, seed=0)
    want = run_onnxruntime(proto, feeds)
    got = run_onnxruntime(str(out / "model.onnx"), feeds)
    for name, ref in want.items():
        assert got[name].shape == ref.shape, (name, got[name].shape, ref.shape)
        np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-6)


def test_case_04_report_names_the_runtime_only_op(cli, tmp_path):
    model = CASES / "04-rmsnorm-checker" / "model.onnx"
    out = tmp_path / "out"
    r = cli(model, "-p", "cleanup,fuse", "-o", out, "-q")
    assert r.rc == 0, r.err
    report = json.loads((out / "report.json").read_text())
    assert report["artifact"]["runtime_only_ops"] == {"::SimplifiedLayerNormalization": 1}
    _same_as_original(model, out)


def test_portable_artifact_reports_no_runtime_only_ops(cli, tmp_path):
    proto = onnx.version_converter.convert_version(
        onnx.load(str(CASES / "04-rmsnorm-checker" / "model.onnx")), 23)
    model = tmp_path / "rms23.onnx"
    onnx.save(proto, str(model))
    out = tmp_path / "out"
    r = cli(model, "-p", "cleanup,fuse", "-o", out, "-q")
    assert r.rc == 0, r.err
    report = json.loads((out / "report.json").read_text())
    assert report["artifact"]["runtime_only_ops"] == {}
    onnx.checker.check_model(str(out / "model.onnx"), full_check=True)
    _same_as_original(model, out)


def test_case_09_reshape_kept(cli, tmp_path):
    model = CASES / "09-stale-value-info-reshape-removed" / "model.onnx"
    out = tmp_path / "out"
    r = cli(model, "-p", "cleanup", "-o", out, "-q")
    assert r.rc == 0, r.err
    report = json.loads((out / "report.json").read_text())
    assert report["passes"][0]["name"] == "infer-shapes" and report["passes"][0]["stats"]["conflicts"] == 1
    assert [n.op_type for n in onnx.load(str(out / "model.onnx")).graph.node] == ["Relu", "Reshape"]
    _same_as_original(model, out)


@pytest.mark.parametrize("name,rule", [("gelu", "gelu-erf"), ("hardswish", "hardswish-relu6"),
                                       ("layernorm", "layernorm-decomposed")])
def test_case_11_rank_kept_and_explained(cli, tmp_path, name, rule):
    model = CASES / "11-fusion-drops-broadcast-rank" / f"{name}.onnx"
    out = tmp_path / "out"
    r = cli(model, "-p", "cleanup,fuse", "-o", out, "-q")
    assert r.rc == 0, r.err
    _same_as_original(model, out)
    r = cli("explain", rule, model)
    assert r.rc == 0, r.err
    assert "would fire at 0" in r.out
    assert "of shape [1, 1, 8]: it broadcasts" in r.out or "of shape [1, 1, 1]: it broadcasts" in r.out
    assert "(rank 2) up to rank 3" in r.out
