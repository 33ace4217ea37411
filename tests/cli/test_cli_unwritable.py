"""Unwritable or misused output locations are user errors, exit 2 (fresh-user trial, H17)."""

from __future__ import annotations

import os
import stat
import tempfile


def test_output_under_a_read_only_filesystem_is_exit_2(cli, conv_bn_model):
    r = cli(conv_bn_model, "-o", "/sys/passctl-out", "-q")
    assert r.rc == 2, r.err
    assert "internal error" not in r.err and "-o" in r.err


def test_mkdtemp_failure_is_exit_2(cli, conv_bn_model, tmp_path, monkeypatch):
    real = tempfile.mkdtemp
    parent = tmp_path / "parent"
    parent.mkdir()

    def refuse(*args, **kwargs):  # as mkdtemp in a folder we may not write (root ignores modes)
        if kwargs.get("dir") == str(parent):
            raise PermissionError(13, "Permission denied")
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    r = cli(conv_bn_model, "-o", parent / "out", "-q")
    monkeypatch.undo()
    assert r.rc == 2, r.err
    assert "cannot write in the output's parent folder" in r.err and "Permission denied" in r.err


def test_dump_ir_at_a_file_or_unwritable_folder_is_exit_2(cli, conv_bn_model, tmp_path):
    (tmp_path / "afile").write_text("x")
    r = cli(conv_bn_model, "--dump-ir", tmp_path / "afile", "-o", tmp_path / "out", "-q")
    assert r.rc == 2 and "'" + str(tmp_path / "afile") + "' is a file" in r.err
    r = cli(conv_bn_model, "--dump-ir", "/sys/passctl-dump", "-o", tmp_path / "out", "-q")
    assert r.rc == 2 and "cannot write there" in r.err
    assert not (tmp_path / "out").exists()


def test_print_ir_after_unknown_pass_suggests_pipeline_passes(cli, conv_bn_model, tmp_path):
    r = cli(conv_bn_model, "--pipeline", "cleanup,fuse-conv-bn", "--print-ir-after",
            "fuse-conv-bm", "-o", tmp_path / "out", "-q")
    assert r.rc == 2
    assert "did you mean fuse-conv-bn?" in r.err and "eliminate-identity" in r.err
    r = cli(conv_bn_model, "--pipeline", "dce", "--print-ir-before", "fold-constants",
            "-o", tmp_path / "out", "-q")
    assert r.rc == 2 and "not a pass of the pipeline" in r.err


def test_output_folder_gets_the_umask_mode(cli, conv_bn_model, tmp_path):
    old = os.umask(0o022)
    try:
        r = cli(conv_bn_model, "-o", tmp_path / "out", "-q")
    finally:
        os.umask(old)
    assert r.rc == 0, r.err
    assert stat.S_IMODE(os.stat(tmp_path / "out").st_mode) == 0o755
