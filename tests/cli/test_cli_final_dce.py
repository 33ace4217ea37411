"""compile ends with a dce when a late pass left dead values (fresh-user trial, H17)."""

from __future__ import annotations

import json

from cli_helpers import unused_initializers


def test_fuse_after_cleanup_leaves_no_unused_initializers(cli, conv_bn_model, tmp_path):
    out = tmp_path / "out"
    r = cli(conv_bn_model, "--pipeline", "cleanup,fuse-conv-bn", "-o", out, "-q", "--check")
    assert r.rc == 0, r.err
    assert unused_initializers(out / "model.onnx") == []
    report = json.loads((out / "report.json").read_text())
    names = [p["name"] for p in report["passes"]]
    assert names[-2:] == ["fuse-conv-bn", "dce"]
    assert report["passes"][-1]["modified"] is True
    assert report["check"]["ok"] is True


def test_no_extra_dce_when_dce_is_last_or_nothing_changed(cli, conv_bn_model, tmp_path):
    r = cli(conv_bn_model, "--pipeline", "fuse-conv-bn,dce", "-o", tmp_path / "a", "-q")
    assert r.rc == 0, r.err
    names = [p["name"] for p in json.loads((tmp_path / "a" / "report.json").read_text())["passes"]]
    assert names == ["fuse-conv-bn", "dce"]
    r = cli(conv_bn_model, "--pipeline", "dce,fuse-conv-bn,fuse-conv-bn", "-o", tmp_path / "b",
            "-q")
    names = [p["name"] for p in json.loads((tmp_path / "b" / "report.json").read_text())["passes"]]
    assert names == ["dce", "fuse-conv-bn", "fuse-conv-bn", "dce"]
    r = cli(tmp_path / "a" / "model.onnx", "--pipeline", "fuse-conv-bn", "-o", tmp_path / "c",
            "-q")  # already fused: nothing modified, so no dce
    assert r.rc == 0, r.err
    passes = json.loads((tmp_path / "c" / "report.json").read_text())["passes"]
    assert [(p["name"], p["modified"]) for p in passes] == [("fuse-conv-bn", False)]
