"""Mistyped flags get close suggestions; no silent abbreviations (fresh-user trial, H17)."""

from __future__ import annotations


def test_mistyped_flag_suggests_the_close_one(cli, conv_bn_model, tmp_path):
    r = cli(conv_bn_model, "--chek", "-o", tmp_path / "o")
    assert r.rc == 2
    assert "did you mean --check" in r.err and "passctl compile --help" in r.err
    assert not (tmp_path / "o").exists()
    r = cli("run", tmp_path, "--warmpu", "1")
    assert r.rc == 2 and "did you mean --warmup" in r.err and "`passctl run --help`" in r.err
    assert "--check" not in r.err  # only run's own options are suggested


def test_abbreviated_flags_are_not_accepted(cli, conv_bn_model, tmp_path):
    r = cli(conv_bn_model, "--pipe", "dce", "-o", tmp_path / "o")
    assert r.rc == 2 and "--pipeline" in r.err
    assert not (tmp_path / "o").exists()
