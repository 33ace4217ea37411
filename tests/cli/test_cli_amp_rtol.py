"""With amp in the pipeline, --check defaults to the amp budget as rtol (fresh-user trial, H17)."""

from __future__ import annotations

import json


def test_amp_check_uses_the_budget_unless_rtol_is_given(cli, conv_bn_model, tmp_path):
    r = cli(conv_bn_model, "--pipeline", "cleanup,amp{budget=0.05}", "--check",
            "-o", tmp_path / "a")
    assert r.rc == 0, r.err
    assert "rtol 0.05, the amp pass's budget" in r.out
    check = json.loads((tmp_path / "a" / "report.json").read_text())["check"]
    assert check["rtol"] == 0.05 and check["ok"] is True
    assert check["max_rel"] > 1e-4  # fp16 really differs: the old default would have failed
    r = cli(conv_bn_model, "--pipeline", "cleanup,amp{budget=0.05}", "--check", "--rtol", "1e-4",
            "-o", tmp_path / "b", "--reproducer-dir", tmp_path / "crash", "-q")
    assert r.rc == 3 and "numeric check failed" in r.err


def test_without_amp_the_default_rtol_stays(cli, conv_bn_model, tmp_path):
    r = cli(conv_bn_model, "--check", "-o", tmp_path / "a")
    assert r.rc == 0, r.err
    assert "amp pass's budget" not in r.out
    assert json.loads((tmp_path / "a" / "report.json").read_text())["check"]["rtol"] == 1e-4
