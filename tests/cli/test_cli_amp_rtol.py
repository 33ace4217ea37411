"""With amp in the pipeline, --check defaults to the amp budget as rtol (fresh-user trial, H17)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from passctl.support.check import run_onnxruntime
from passctl.support.inputs import make_inputs


def test_amp_check_uses_the_budget_unless_rtol_is_given(cli, conv_bn_model, tmp_path):
    r = cli(conv_bn_model, "--pipeline", "cleanup,amp{budget=0.05}", "--check",
            "-o", tmp_path / "a")
    assert r.rc == 0, r.err
    assert "mean-rel error 0.05, the amp pass's budget under its metric" in r.out
    check = json.loads((tmp_path / "a" / "report.json").read_text())["check"]
    assert check["rtol"] == 0.05 and check["ok"] is True and check["metric"] == "mean-rel"
    assert check["max_rel"] > 1e-4  # fp16 really differs: the old default would have failed
    # the bounded value is amp's mean-rel (sum |r - c| / sum |r|), recomputed here with ONNX Runtime
    feeds = make_inputs(conv_bn_model, seed=0)
    ref = run_onnxruntime(conv_bn_model, feeds)
    got = run_onnxruntime(str(tmp_path / "a" / "model.onnx"), feeds)
    (name, r_out), = ref.items()
    want = np.abs(got[name].astype(np.float64) - r_out).sum() / np.abs(r_out).sum()
    assert check["metric_error"] == pytest.approx(want, rel=1e-9)
    assert "mean-rel error" in r.out and "(bound 0.05)" in r.out
    r = cli(conv_bn_model, "--pipeline", "cleanup,amp{budget=0.05}", "--check", "--rtol", "1e-4",
            "-o", tmp_path / "b", "--reproducer-dir", tmp_path / "crash", "-q")
    assert r.rc == 3 and "numeric check failed" in r.err


def test_without_amp_the_default_rtol_stays(cli, conv_bn_model, tmp_path):
    r = cli(conv_bn_model, "--check", "-o", tmp_path / "a")
    assert r.rc == 0, r.err
    assert "amp pass's budget" not in r.out
    assert json.loads((tmp_path / "a" / "report.json").read_text())["check"]["rtol"] == 1e-4
