"""--dump-ir never overwrites a file an earlier dump did not write (break-it 14)."""

from __future__ import annotations

import os
import stat

import pytest

from passctl.ir.errors import UserError
from passctl.passes.instruments import DumpIR

PIPELINE = "cleanup,fuse-conv-bn"


def _refused(r, folder, name) -> None:
    lines = r.err.strip().splitlines()
    assert r.rc == 2 and len(lines) == 1 and lines[0].startswith("passctl: error:"), r.err
    assert str(folder) in lines[0] and f"holds '{name}'" in lines[0]
    assert "give a new or empty folder" in lines[0] and "Traceback" not in r.err


def test_folder_with_a_user_file_is_refused_and_kept(cli, conv_bn_model, tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    dump.mkdir()
    (dump / "000_input.pir").write_text("my notes, named like a dump file")
    (dump / "notes.txt").write_text("mine")
    r = cli(conv_bn_model, "-p", PIPELINE, "--dump-ir", dump, "-o", out, "-q")
    _refused(r, dump, "notes.txt")
    assert sorted(os.listdir(dump)) == ["000_input.pir", "notes.txt"]
    assert (dump / "000_input.pir").read_text() == "my notes, named like a dump file"
    assert not out.exists()


def test_subfolder_and_fifo_named_like_dump_files_are_refused(cli, conv_bn_model, tmp_path):
    dump = tmp_path / "dump"
    (dump / "001_cleanup.onnx").mkdir(parents=True)
    _refused(cli(conv_bn_model, "-p", PIPELINE, "--dump-ir", dump, "-o", tmp_path / "o", "-q"),
             dump, "001_cleanup.onnx")
    os.rmdir(dump / "001_cleanup.onnx")
    os.mkfifo(dump / "000_input.pir")  # writing it would block
    _refused(cli(conv_bn_model, "-p", PIPELINE, "--dump-ir", dump, "-o", tmp_path / "o", "-q"),
             dump, "000_input.pir")
    assert stat.S_ISFIFO(os.lstat(dump / "000_input.pir").st_mode)


def test_an_earlier_dump_is_overwritten(cli, conv_bn_model, tmp_path):
    dump = tmp_path / "dump"
    assert cli(conv_bn_model, "-p", PIPELINE, "--dump-ir", dump, "-o", tmp_path / "a", "-q").rc == 0
    first = sorted(os.listdir(dump))
    assert "000_input.pir" in first and "000_input.onnx" in first
    (dump / "000_input.pir").write_text("stale")
    r = cli(conv_bn_model, "-p", PIPELINE, "--dump-ir", dump, "-o", tmp_path / "b", "-q")
    assert r.rc == 0, r.err
    assert sorted(os.listdir(dump)) == first
    assert (dump / "000_input.pir").read_text() != "stale"


def test_dump_ir_instrument_refuses_a_foreign_file(tmp_path):
    (tmp_path / "README").write_text("x")
    with pytest.raises(UserError, match="holds 'README'"):
        DumpIR(tmp_path)
    DumpIR(tmp_path / "new")  # a missing folder is fine (created on the first dump)
