"""-o replaces an earlier artifact only when every entry is a plain file its emitter writes
(break-it 3)."""

from __future__ import annotations

import os

from cli_helpers import sha256  # tests/cli/cli_helpers.py


def _digests(folder) -> dict:
    return {n: sha256(folder / n) for n in sorted(os.listdir(folder)) if (folder / n).is_file()}


def _refused(r, out, name) -> None:
    lines = r.err.strip().splitlines()
    assert r.rc == 2 and len(lines) == 1 and lines[0].startswith("passctl: error:"), r.err
    assert str(out) in lines[0] and f"'{name}'" in lines[0] and "move it out" in lines[0]


def test_user_file_named_like_the_model_is_kept(cli, conv_bn_model, tmp_path):
    """The trial's case: model.onnx_notes.txt beside an artifact was deleted by -o."""
    out = tmp_path / "clsx"
    assert cli(conv_bn_model, "-o", out, "-q").rc == 0
    (out / "model.onnx_notes.txt").write_text("precious")
    before = _digests(out)
    r = cli(conv_bn_model, "-o", out, "-q")
    _refused(r, out, "model.onnx_notes.txt")
    assert _digests(out) == before
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith(".clsx")) == []


def test_a_file_of_another_emitter_is_refused(cli, conv_bn_model, tmp_path):
    """manifest.json is a TVM / TensorRT file: an ONNX Runtime artifact never writes it."""
    out = tmp_path / "out"
    assert cli(conv_bn_model, "-o", out, "-q").rc == 0
    (out / "manifest.json").write_text('{"mine": true}')
    _refused(cli(conv_bn_model, "-o", out, "-q"), out, "manifest.json")
    assert (out / "manifest.json").read_text() == '{"mine": true}'


def test_a_folder_with_an_artifact_file_name_is_refused(cli, conv_bn_model, tmp_path):
    out = tmp_path / "out"
    assert cli(conv_bn_model, "-o", out, "-q").rc == 0
    (out / "model.onnx.data").mkdir()
    (out / "model.onnx.data" / "keep.txt").write_text("mine")
    r = cli(conv_bn_model, "-o", out, "-q")
    _refused(r, out, "model.onnx.data")
    assert "not a plain file" in r.err
    assert (out / "model.onnx.data" / "keep.txt").read_text() == "mine"


def test_a_symlink_inside_the_artifact_is_refused(cli, conv_bn_model, tmp_path):
    out = tmp_path / "out"
    assert cli(conv_bn_model, "-o", out, "-q").rc == 0
    (tmp_path / "elsewhere").write_text("x")
    os.remove(out / "session.json")
    (out / "session.json").symlink_to(tmp_path / "elsewhere")
    _refused(cli(conv_bn_model, "-o", out, "-q"), out, "session.json")
    assert (out / "session.json").is_symlink()


def test_tensorrt_engine_built_later_is_replaced(cli, conv_bn_model, tmp_path):
    """model.engine is written by the artifact's build_engine.sh after compile (not listed in
    report.json)."""
    out = tmp_path / "trt"
    assert cli(conv_bn_model, "--target", "h100", "--emit", "tensorrt", "-o", out, "-q").rc == 0
    assert (out / "build_engine.sh").is_file()
    (out / "model.engine").write_bytes(b"engine built by trtexec")
    assert cli(conv_bn_model, "--target", "h100", "--emit", "tensorrt", "-o", out, "-q").rc == 0
    assert not (out / "model.engine").exists() and (out / "model.onnx").is_file()


def test_external_data_file_of_an_earlier_artifact_is_replaced(cli, conv_bn_model, tmp_path):
    out = tmp_path / "out"
    assert cli(conv_bn_model, "-o", out, "-q").rc == 0
    (out / "model.onnx.data").write_bytes(b"\0" * 16)  # an earlier run's large weights
    assert cli(conv_bn_model, "-o", out, "-q").rc == 0
    assert sorted(os.listdir(out)) == ["model.onnx", "report.json", "session.json"]
