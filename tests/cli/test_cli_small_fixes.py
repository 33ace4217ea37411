"""Small CLI fixes from the break-it trial (finding 16): subcommand typos, closed stdout, opset-1
verify noise, --target default in help."""

from __future__ import annotations

import logging
import subprocess
import sys

import onnx
import pytest
from onnx import TensorProto, helper


def test_misspelled_subcommand_suggests_the_closest(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = cli("list-pases")
    assert r.rc == 2
    assert "did you mean `passctl list-passes`?" in r.err and "not found" not in r.err
    assert "list-targets" not in r.err  # only the closest names
    assert len(r.err.strip().splitlines()) == 1
    r = cli("verfy", "m.onnx")
    assert r.rc == 2 and "`passctl verify`" in r.err
    # a word far from every subcommand is still read as a model path
    r = cli("resnet")
    assert r.rc == 2 and "model file 'resnet' not found" in r.err
    # an existing file with a subcommand-like name is the model, not a typo
    (tmp_path / "list-pases").write_bytes(b"not onnx")
    r = cli("list-pases", "-o", tmp_path / "out")
    assert r.rc == 2 and "did you mean" not in r.err


def test_target_help_shows_its_default(cli):
    r = cli("compile", "--help")
    assert r.rc == 0
    help_text = " ".join(r.out.split())
    assert "target profile (see list-targets; default: cpu)" in help_text


@pytest.mark.parametrize("argv", [["list-passes"], ["list-rules"], ["show", "MODEL"],
                                  ["MODEL", "-o", "OUT", "--timing", "--print-ir-after", "all"]])
def test_closed_stdout_exits_0_quietly(argv, conv_bn_model, tmp_path):
    """``passctl list-passes | head -1``: the reader is gone before passctl writes; a compile
    still writes its artifact."""
    out = tmp_path / "out"
    argv = [{"MODEL": conv_bn_model, "OUT": str(out)}.get(a, a) for a in argv]
    p = subprocess.Popen([sys.executable, "-m", "passctl.tools.cli", *argv],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # closed before the first write: every write fails with EPIPE
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 0, err
    assert err == ""
    if "-o" in argv:
        assert onnx.load(str(out / "model.onnx")).graph.node  # written despite the closed stdout


def test_verify_opset1_prints_no_foreign_log_line(cli, tmp_path, caplog):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = tmp_path / "opset1.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 1)]), str(path))
    with caplog.at_level(logging.WARNING):
        r = cli("verify", path)
    foreign = [rec for rec in caplog.records if not rec.name.startswith("passctl.")]
    assert foreign == [], [(rec.name, rec.getMessage()) for rec in foreign]
    assert "Only support" not in r.err + r.out
    assert r.rc == 0 and f"{path}: 0 error(s)" in r.out
