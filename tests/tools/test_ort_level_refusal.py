"""ONNX Runtime's own optimizer refusing the *original* model at the level an artifact ships with
(issue 15 case 07-ort-enable-all-refuses-valid-model) is the user's error, exit 2, naming the
level that loads it; ``--emit 'onnxruntime{optimization_level=...}'`` ships at that level."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from passctl.support.check import run_onnxruntime
from passctl.targets.onnxruntime.emit import create_session
from passctl.tools.cli import main


def _case07(C: int = 8, group: int = 4) -> onnx.ModelProto:
    """Case 07's make.py, build(group=4, with_bn=1, conv2=1, relu=0): a grouped Conv ->
    BatchNormalization whose output ``t`` is both a graph output and an Add input, plus a second
    grouped (dilated) Conv into the Add; valid ONNX (full check)."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.standard_normal((C, C // group, 3, 3)).astype(np.float32), "w")]
    inits += [nh.from_array(np.ones(C, np.float32), n) for n in ("s", "v")]
    inits += [nh.from_array(np.zeros(C, np.float32), n) for n in ("b", "m")]
    nodes = [h.make_node("Conv", ["x", "w"], ["c1"], pads=[1, 1, 1, 1], group=group),
             h.make_node("BatchNormalization", ["c1", "s", "b", "m", "v"], ["t"]),
             h.make_node("Conv", ["x", "w"], ["c2"], pads=[2, 2, 2, 2], dilations=[2, 2],
                         group=group),
             h.make_node("Add", ["t", "c2"], ["s2"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, C, 6, 6])],
                     [h.make_tensor_value_info("s2", TP.FLOAT, [1, C, 6, 6]),
                      h.make_tensor_value_info("t", TP.FLOAT, [1, C, 6, 6])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def _loads(path: str, level: str) -> bool:
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    try:
        ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001
        return False
    return True


@pytest.fixture
def case07(tmp_path) -> str:
    path = str(tmp_path / "model.onnx")
    onnx.save(_case07(), path)
    return path


def _cli(capsys, *argv):
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_the_case_model_is_refused_by_ort_enable_all_only(case07):
    """The premise, checked on ONNX Runtime itself (the test fails if ONNX Runtime fixes it)."""
    assert not _loads(case07, "ORT_ENABLE_ALL")
    assert _loads(case07, "ORT_DISABLE_ALL")


def test_ort_refusing_the_original_is_the_users_error_naming_the_level(capsys, tmp_path, case07):
    out, repro = tmp_path / "out", tmp_path / "repro"
    rc, _, err = _cli(capsys, case07, "-p", "cleanup", "-o", out, "--reproducer-dir", repro)
    assert rc == 2, err
    lines = [line for line in err.splitlines() if line.startswith("passctl:")]
    assert len(lines) == 1 and lines[0].startswith("passctl: error: "), err
    levels = [n for n in ("ORT_ENABLE_LAYOUT", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_BASIC",
                          "ORT_DISABLE_ALL") if hasattr(ort.GraphOptimizationLevel, n)]
    works = next(n for n in levels if _loads(case07, n))  # ONNX Runtime's own answer
    short = {"ORT_ENABLE_LAYOUT": "layout", "ORT_ENABLE_EXTENDED": "extended",
             "ORT_ENABLE_BASIC": "basic", "ORT_DISABLE_ALL": "disable"}[works]
    assert "ONNX Runtime refuses this model itself at ORT_ENABLE_ALL" in lines[0]
    assert f"it loads at {works}" in lines[0]
    assert f"--emit 'onnxruntime{{optimization_level={short}}}'" in lines[0]
    assert "internal error" not in err and "reproducer" not in err
    assert not out.exists() and not repro.exists()


def test_the_named_level_ships_and_runs(capsys, tmp_path, case07):
    out = tmp_path / "out"
    rc, _, err = _cli(capsys, case07, "-p", "cleanup", "--emit",
                      "onnxruntime{optimization_level=extended}", "--check", "-o", out, "-q")
    assert rc == 0, err
    cfg = json.loads((out / "session.json").read_text())
    assert cfg["graph_optimization_level"] == "ORT_ENABLE_EXTENDED"
    report = json.loads((out / "report.json").read_text())
    assert report["verify"]["runtime"] == "onnxruntime ORT_ENABLE_EXTENDED"
    assert report["check"]["optimization"] == "ORT_ENABLE_EXTENDED"
    x = np.random.default_rng(5).standard_normal((1, 8, 6, 6)).astype(np.float32)
    want = run_onnxruntime(case07, {"x": x})
    got = dict(zip([o.name for o in create_session(str(out)).get_outputs()],
                   create_session(str(out)).run(None, {"x": x})))
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-6)


def test_a_pipeline_that_removes_the_trigger_still_ships_at_enable_all(capsys, tmp_path, case07):
    """cleanup,fuse folds the BatchNormalization: the artifact loads at ORT_ENABLE_ALL, so nothing
    is refused (the refusal is only for an artifact that does not load)."""
    out = tmp_path / "out"
    rc, _, err = _cli(capsys, case07, "-p", "cleanup,fuse", "-o", out, "-q")
    assert rc == 0, err
    assert json.loads((out / "session.json").read_text())["graph_optimization_level"] == \
        "ORT_ENABLE_ALL"
    assert _loads(str(out / "model.onnx"), "ORT_ENABLE_ALL")


def test_an_unknown_level_is_refused(capsys, tmp_path, case07):
    rc, _, err = _cli(capsys, case07, "--emit", "onnxruntime{optimization_level=max}", "-o",
                      tmp_path / "out")
    assert rc == 2
    assert "optimization_level='max' is not an ONNX Runtime graph optimization level" in err
    assert "extended" in err and not os.path.exists(tmp_path / "out")
