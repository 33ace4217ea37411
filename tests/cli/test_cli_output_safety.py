"""-o never destroys a folder that is not a passctl artifact (fresh-user trial, H17)."""

from __future__ import annotations

import os


def _precious(folder) -> None:
    os.makedirs(folder / "sub", exist_ok=True)
    (folder / "notes.txt").write_text("keep me")
    (folder / "sub" / "x.txt").write_text("keep me too")


def _intact(folder) -> bool:
    return ((folder / "notes.txt").read_text() == "keep me"
            and (folder / "sub" / "x.txt").read_text() == "keep me too")


def test_output_into_current_folder_is_refused(cli, conv_bn_model, tmp_path, monkeypatch):
    work = tmp_path / "w3"
    work.mkdir()
    _precious(work)
    monkeypatch.chdir(work)
    r = cli(conv_bn_model, "-o", ".", "-q")
    assert r.rc == 2 and "current folder" in r.err
    assert _intact(work)


def test_output_into_current_folder_above_the_model_names_the_current_folder(
        cli, conv_bn_model, monkeypatch):
    """-o . from a folder above the model (the README's packaged model under .venv): the reason
    given is the current folder, not "contains the input model" (fresh-user trial)."""
    monkeypatch.chdir(os.path.dirname(os.path.dirname(str(conv_bn_model))))
    r = cli(conv_bn_model, "-o", ".", "-q")
    assert r.rc == 2 and "is the current folder or one above it" in r.err
    assert "contains the input model" not in r.err


def test_output_into_ancestor_of_current_folder_is_refused(cli, conv_bn_model, tmp_path,
                                                          monkeypatch):
    (tmp_path / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a" / "b")
    r = cli(conv_bn_model, "-o", "..", "-q")
    assert r.rc == 2 and "current folder" in r.err
    assert (tmp_path / "a" / "b").is_dir()


def test_output_into_non_artifact_folder_is_refused(cli, conv_bn_model, tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    _precious(precious)
    r = cli(conv_bn_model, "-o", precious, "-q")
    assert r.rc == 2
    assert "is not a passctl artifact (holds notes.txt, sub)" in r.err
    assert len(r.err.strip().splitlines()) == 1
    assert _intact(precious)


def test_artifact_with_an_extra_file_is_refused(cli, conv_bn_model, tmp_path):
    out = tmp_path / "out"
    assert cli(conv_bn_model, "-o", out, "-q").rc == 0
    (out / "notes.txt").write_text("mine")
    r = cli(conv_bn_model, "-o", out, "-q")
    assert r.rc == 2 and "notes.txt" in r.err
    assert (out / "notes.txt").read_text() == "mine"


def test_existing_artifact_and_empty_folder_are_replaced(cli, conv_bn_model, tmp_path):
    out, empty = tmp_path / "out", tmp_path / "empty"
    empty.mkdir()
    assert cli(conv_bn_model, "-o", out, "-q").rc == 0
    first = (out / "report.json").stat().st_mtime_ns
    assert cli(conv_bn_model, "-o", out, "-q").rc == 0
    assert (out / "report.json").stat().st_mtime_ns >= first
    assert cli(conv_bn_model, "-o", empty, "-q").rc == 0
    assert (empty / "model.onnx").is_file()


def test_output_below_a_file_names_the_file(cli, conv_bn_model, tmp_path):
    (tmp_path / "afile").write_text("x")
    r = cli(conv_bn_model, "-o", tmp_path / "afile" / "sub", "-q")
    assert r.rc == 2 and "'" + str(tmp_path / "afile") + "' is a file" in r.err
