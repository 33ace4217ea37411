"""--check without --rtol bounds each budget pass's metric by its budget, whatever its size."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from passctl.support.inputs import make_inputs
from small_graphs import conv_relu_conv  # tests/small_graphs.py

MIXED = "quantize{metric=cosine,budget=1e-3},amp{metric=max-rel,budget=0.05}"


@pytest.fixture
def convs(tmp_path) -> str:
    """x [1, 8, 16, 16] -> Conv(16, 3x3) -> Relu -> Conv(8, 3x3) -> y, saved in ``tmp_path``."""
    return conv_relu_conv(tmp_path / "convs.onnx")


def _errors(model: str, artifact) -> dict:
    """Independent errors of the artifact (its session.json level, ORT_ENABLE_ALL) against the
    original (unoptimized) on the check's seed-0 inputs: max-rel, mean-rel, 1 - cosine."""
    feed = make_inputs(model, seed=0)
    level = ort.GraphOptimizationLevel
    runs = []
    for path, opt in ((model, level.ORT_DISABLE_ALL),
                      (str(artifact / "model.onnx"), level.ORT_ENABLE_ALL)):
        options = ort.SessionOptions()
        options.graph_optimization_level = opt
        runs.append(ort.InferenceSession(path, options).run(None, feed)[0].astype(np.float64))
    r, c = (v.ravel() for v in runs)
    return {"max-rel": np.abs(r - c).max() / np.abs(r).max(),
            "mean-rel": np.abs(r - c).sum() / np.abs(r).sum(),
            "cosine": 1 - r @ c / (np.linalg.norm(r) * np.linalg.norm(c))}


def _check(out) -> dict:
    return json.loads((out / "report.json").read_text())["check"]


def test_a_budget_below_the_default_rtol_bounds_its_metric(cli, convs, tmp_path):
    # cosine 9e-5 is below DEFAULT_RTOL 1e-4: the check used to fall back to max-rel 1e-4 (rc 3).
    # cpu-avx2's form (7-bit weights) runs exactly on any CPU, so one int8 layer meets 9e-5 on
    # every machine (the all-int8 graph measures 1.45e-4)
    out = tmp_path / "out"
    r = cli(convs, "--pipeline", "quantize{metric=cosine,budget=9e-5}", "--target", "cpu-avx2",
            "--check", "-o", out)
    assert r.rc == 0, r.err
    assert "the check accepts cosine error 9e-05, the quantize pass's budget" in r.out
    check, want = _check(out), _errors(convs, out)
    assert check["metric"] == "cosine" and check["rtol"] == 9e-5 and check["ok"]
    assert check["metric_error"] == pytest.approx(want["cosine"], rel=1e-6)
    assert check["bounds"] == [{"metric": "cosine", "rtol": 9e-5, "source": "quantize-int8",
                                "ok": True, "error": check["metric_error"]}]
    assert want["max-rel"] > 1e-4  # int8 did happen: the old max-rel 1e-4 bound fails it


def test_an_amp_budget_below_the_default_rtol_is_the_bound(cli, convs, tmp_path):
    out = tmp_path / "out"
    r = cli(convs, "--pipeline", "amp{metric=max-rel,budget=5e-5}", "--check", "-o", out)
    assert r.rc == 0, r.err
    check = _check(out)
    assert check["rtol"] == 5e-5 and check["metric"] == "max-rel"
    assert check["bounds"][0]["source"] == "mixed-precision"


def test_mixed_metrics_are_each_checked_against_their_own_budget(cli, convs, tmp_path):
    out = tmp_path / "out"
    r = cli(convs, "--pipeline", MIXED, "--check", "-o", out)
    assert r.rc == 0, r.err
    check, want = _check(out), _errors(convs, out)
    assert [(b["metric"], b["rtol"], b["source"], b["ok"]) for b in check["bounds"]] == [
        ("cosine", 1e-3, "quantize-int8", True), ("max-rel", 0.05, "mixed-precision", True)]
    assert check["bounds"][0]["error"] == pytest.approx(want["cosine"], rel=1e-6)
    assert check["bounds"][1]["error"] == pytest.approx(want["max-rel"], rel=1e-6)
    assert (check["metric"], check["rtol"]) == ("cosine", 1e-3)  # the first bound
    assert check["metric_error"] == check["bounds"][0]["error"]
    assert "(bound 0.05)" in r.out and "cosine error" in r.out and "(bound 0.001)" in r.out


def test_mixed_metrics_fail_on_the_bound_that_is_exceeded(cli, convs, tmp_path):
    # cosine 0.5 used to be taken as the bound (the largest number); max-rel 1e-3 is not met
    out = tmp_path / "out"
    r = cli(convs, "--pipeline", "quantize{metric=cosine,budget=0.5},"
            "amp{metric=max-rel,budget=0.001}", "--check", "-o", out,
            "--reproducer-dir", tmp_path / "crash")
    assert r.rc == 3
    assert "max_rel" in r.err and "> 0.001" in r.err
    assert "loosen the amp pass's budget (now max-rel 0.001" in r.err
    assert not out.exists()


def test_rtol_replaces_every_budget(cli, convs, tmp_path):
    out = tmp_path / "out"
    r = cli(convs, "--pipeline", MIXED, "--check", "--rtol", "0.2", "-o", out)
    assert r.rc == 0, r.err
    check = _check(out)
    assert check["bounds"] == [{"metric": "max-rel", "rtol": 0.2, "source": "--rtol", "ok": True,
                                "error": check["max_rel"]}]


def test_check_each_applies_every_bound(cli, convs, tmp_path):
    """--check-each marks a pass FAILED when any of the budget passes' bounds fails, not only the
    first one: after amp the max-rel 1e-3 bound of amp is exceeded (quantize's cosine 0.5 holds)."""
    r = cli(convs, "--pipeline", "quantize{metric=cosine,budget=0.5},"
            "amp{metric=max-rel,budget=0.001}", "--check-each", "-o", tmp_path / "out",
            "--reproducer-dir", tmp_path / "crash")
    lines = [line for line in r.out.splitlines() if line.startswith("check after")]
    quantize = next(line for line in lines if "quantize-int8" in line)
    assert "FAILED" in quantize and "max_rel" in quantize and "> 0.001" in quantize
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    entry = next(e for e in report["check_each"] if e["pass"] == "quantize-int8")
    assert entry["ok"] is False
    rel = float(quantize.split("max_rel ")[1].split(" ")[0].rstrip(","))
    assert rel > 1e-3  # the max-rel the line reports is indeed over amp's bound


def test_cosine_bound_warns_about_one_element_outputs(cli, tmp_path):
    """The cosine of two one-element vectors is 1 whatever they hold, so metric=cosine bounds
    nothing there: the check says so (Silero VAD's speech probability is such an output)."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["y"], keepdims=0)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    import onnx  # noqa: PLC0415

    path = tmp_path / "mean.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    r = cli(path, "--pipeline", "amp{metric=cosine,budget=0.01,measure=false}", "--target", "a10",
            "--check", "-o", tmp_path / "out")
    assert r.rc == 0, r.err
    assert "metric=cosine does not bound 'y'" in r.err
    assert any("metric=cosine does not bound 'y'" in w
               for w in _check(tmp_path / "out")["warnings"])


def test_check_with_check_each_runs_the_original_once(cli, convs, tmp_path, monkeypatch):
    # --check reuses --check-each's run of the original on the same seeded inputs; its entry is the
    # one --check alone writes
    import passctl.support.check as check_module

    alone = tmp_path / "alone"
    assert cli(convs, "--pipeline", "quantize", "--check", "-o", alone, "-q").rc == 0
    runs = []
    real = check_module.run_onnxruntime

    def counting(model, inputs, optimize=False, **kw):
        # the reference runs (ORT_DISABLE_ALL); a run of the original at the shipped level, made
        # when the quantized artifact's values are off it (support/ort_levels.py), is another
        if not optimize:
            runs.append(model)
        return real(model, inputs, optimize, **kw)

    monkeypatch.setattr(check_module, "run_onnxruntime", counting)
    both = tmp_path / "both"
    r = cli(convs, "--pipeline", "quantize", "--check", "--check-each", "-o", both, "-q")
    assert r.rc == 0, r.err
    assert [str(m) for m in runs].count(str(convs)) == 1, runs
    assert _check(both) == _check(alone)
    check = _check(both)
    assert check["metric_error"] == pytest.approx(_errors(convs, both)[check["metric"]], rel=1e-6)
