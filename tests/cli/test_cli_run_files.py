"""``passctl run``: --save-outputs never replaces what is not a file (break-it 2); a damaged
artifact is one line naming the file and "re-run passctl compile" (break-it 8)."""

from __future__ import annotations

import json
import os
import shutil
import stat

import numpy as np
import onnxruntime as ort
import pytest

from passctl.tools.cli import main

RERUN = "re-run passctl compile"


def _one_line(r, *needles) -> str:
    lines = r.err.strip().splitlines()
    assert r.rc == 2, r.err
    assert len(lines) == 1 and lines[0].startswith("passctl: error:"), r.err
    assert "Traceback" not in r.err and "please report" not in r.err
    for n in needles:
        assert str(n) in lines[0], (n, lines[0])
    return lines[0]


@pytest.fixture
def ort_artifact(cli, conv_bn_model, tmp_path):
    out = tmp_path / "art"
    assert cli(conv_bn_model, "-o", out, "-q").rc == 0
    return out


@pytest.fixture(scope="module")
def tvm_artifact(tmp_path_factory):
    """A TVM artifact of the Conv+BN model (built once: a few seconds)."""
    import onnx
    from cli_helpers import conv_bn_proto  # tests/cli/cli_helpers.py

    tmp = tmp_path_factory.mktemp("tvm")
    onnx.save(conv_bn_proto(), str(tmp / "m.onnx"))
    assert main([str(tmp / "m.onnx"), "--emit", "tvm", "-o", str(tmp / "tvm"), "-q"]) == 0
    return tmp / "tvm"


def _leftovers(folder) -> list:
    return sorted(n for n in os.listdir(folder) if ".tmp" in n)


# --- --save-outputs ------------------------------------------------------------------------------

def test_save_outputs_writes_exactly_the_named_file(cli, conv_bn_model, ort_artifact, tmp_path):
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    target = tmp_path / "outs"  # no .npz suffix: written under exactly this name
    target.write_text("an older file: replaced")
    r = cli("run", ort_artifact, "--inputs", tmp_path / "in.npz", "--runs", 1,
            "--save-outputs", target)
    assert r.rc == 0, r.err
    want = ort.InferenceSession(conv_bn_model, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    with np.load(target) as data:
        assert sorted(data) == ["y"]
        np.testing.assert_allclose(data["y"], want, rtol=1e-5, atol=1e-6)
    assert _leftovers(tmp_path) == [] and not (tmp_path / "outs.npz").exists()


def test_save_outputs_into_a_folder_is_refused(cli, ort_artifact, tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    r = cli("run", ort_artifact, "--runs", 1, "--save-outputs", folder)
    _one_line(r, folder, "is a folder", os.path.join(str(folder), "outputs.npz"))
    assert sorted(os.listdir(folder)) == ["keep.txt"] and _leftovers(tmp_path) == []


def test_save_outputs_onto_a_device_node_is_refused(cli, ort_artifact, tmp_path):
    dev = tmp_path / "null_dev"
    os.mknod(dev, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # a /dev/null twin (we are root)
    before = os.lstat(dev)
    _one_line(cli("run", ort_artifact, "--runs", 1, "--save-outputs", dev), dev, "device")
    after = os.lstat(dev)
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino,
                                                                             before.st_rdev)
    assert _leftovers(tmp_path) == []


def test_save_outputs_onto_a_fifo_is_refused(cli, ort_artifact, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    _one_line(cli("run", ort_artifact, "--runs", 1, "--save-outputs", fifo), fifo, "FIFO")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and _leftovers(tmp_path) == []


def test_save_outputs_onto_a_symlink_is_refused(cli, ort_artifact, tmp_path):
    (tmp_path / "real.npz").write_bytes(b"mine")
    link = tmp_path / "link.npz"
    link.symlink_to(tmp_path / "real.npz")
    _one_line(cli("run", ort_artifact, "--runs", 1, "--save-outputs", link), link,
              "symbolic link", tmp_path / "real.npz")
    assert link.is_symlink() and (tmp_path / "real.npz").read_bytes() == b"mine"


def test_save_outputs_in_a_missing_folder_is_refused(cli, ort_artifact, tmp_path):
    target = tmp_path / "nope" / "x.npz"
    _one_line(cli("run", ort_artifact, "--runs", 1, "--save-outputs", target),
              tmp_path / "nope", "does not exist")
    assert not (tmp_path / "nope").exists()


# --- damaged artifacts ---------------------------------------------------------------------------

def _damage(src, tmp_path, name, data) -> str:
    folder = tmp_path / "damaged"
    shutil.copytree(src, folder)
    if data is None:
        os.remove(folder / name)
    else:
        (folder / name).write_bytes(data)
    return folder


@pytest.mark.parametrize("name,data,says", [
    ("model.onnx", b"not an onnx file \x00\xff", "model.onnx is not a valid ONNX file"),
    ("model.onnx", None, "model.onnx is missing"),
    ("session.json", b"{", "session.json is not valid JSON"),
    ("session.json", b'{"model": "model.onnx"}', "session.json lacks an entry"),
])
def test_damaged_onnxruntime_artifact(cli, ort_artifact, tmp_path, name, data, says):
    folder = _damage(ort_artifact, tmp_path, name, data)
    _one_line(cli("run", folder, "--runs", 1), f"artifact '{folder}'", says, RERUN)


@pytest.mark.parametrize("manifest,says", [
    (b"{}", "manifest.json has no 'schema' entry"),
    (b'{"schema": "passctl.tvm.artifact/9"}',
     "manifest.json has the unknown schema 'passctl.tvm.artifact/9'"),
    (b"[1, 2", "manifest.json is not valid JSON"),
])
def test_manifest_without_a_known_schema_says_so(cli, ort_artifact, tmp_path, manifest, says):
    folder = tmp_path / "m"
    folder.mkdir()
    shutil.copy(ort_artifact / "model.onnx", folder / "model.onnx")
    (folder / "manifest.json").write_bytes(manifest)
    line = _one_line(cli("run", folder, "--runs", 1), f"artifact '{folder}'", says, RERUN)
    assert "has neither" not in line


@pytest.mark.parametrize("name,data,says", [
    ("model.so", b"junk", "model.so cannot be loaded by tvm.runtime"),
    ("model.params", b"junk", "model.params cannot be loaded by tvm.runtime"),
    ("model.so", None, "model.so is missing"),
])
def test_damaged_tvm_artifact(cli, tvm_artifact, tmp_path, name, data, says):
    folder = _damage(tvm_artifact, tmp_path, name, data)
    _one_line(cli("run", folder, "--runs", 1), f"artifact '{folder}'", says, RERUN)


def test_tvm_manifest_without_inputs(cli, tvm_artifact, tmp_path):
    manifest = json.loads((tvm_artifact / "manifest.json").read_text())
    del manifest["inputs"]
    folder = _damage(tvm_artifact, tmp_path, "manifest.json", json.dumps(manifest).encode())
    _one_line(cli("run", folder, "--runs", 1), "manifest.json lacks an entry", "'inputs'", RERUN)
