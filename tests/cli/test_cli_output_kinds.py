"""-o never replaces what is not a real folder: devices, FIFOs, sockets, symlinks (break-it 1, 13)."""

from __future__ import annotations

import os
import socket
import stat

import pytest

from passctl.ir.errors import UserError
from passctl.targets import atomic_output_dir


def _one_error_line(r, path) -> str:
    lines = r.err.strip().splitlines()
    assert r.rc == 2, r.err
    assert len(lines) == 1 and lines[0].startswith("passctl: error:"), r.err
    assert str(path) in lines[0] and "Traceback" not in r.err
    return lines[0]


def _siblings(folder, name):
    """Names in ``folder`` starting with ``.name`` (staging or moved-aside leftovers)."""
    return sorted(n for n in os.listdir(folder) if n.startswith(f".{name}"))


def test_character_device_is_refused_and_untouched(cli, conv_bn_model, tmp_path):
    dev = tmp_path / "null_dev"
    os.mknod(dev, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # a /dev/null twin (we are root)
    before = os.lstat(dev)
    line = _one_error_line(cli(conv_bn_model, "-o", dev, "-q"), dev)
    assert "character device" in line and "-o" in line
    after = os.lstat(dev)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
    assert after.st_ino == before.st_ino
    assert _siblings(tmp_path, "null_dev") == []


def test_fifo_is_refused_without_blocking(cli, conv_bn_model, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    # a writer end held open, so that code opening the FIFO (rmtree did) returns instead of hanging
    keep = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        line = _one_error_line(cli(conv_bn_model, "-o", fifo, "-q"), fifo)
    finally:
        os.close(keep)
    assert "FIFO" in line
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert _siblings(tmp_path, "pipe") == []


def test_socket_is_refused(cli, conv_bn_model, tmp_path):
    path = tmp_path / "sock"
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(path))
        line = _one_error_line(cli(conv_bn_model, "-o", path, "-q"), path)
    finally:
        s.close()
    assert "socket" in line
    assert stat.S_ISSOCK(os.lstat(path).st_mode)


def test_symlink_to_a_folder_is_refused_naming_its_target(cli, conv_bn_model, tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    line = _one_error_line(cli(conv_bn_model, "-o", link, "-q"), link)
    assert "symbolic link" in line and f"give the folder it points to (-o {real})" in line
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert os.listdir(real) == [] and _siblings(tmp_path, "link") == []
    # the folder it points to, given directly, works
    assert cli(conv_bn_model, "-o", real, "-q").rc == 0
    assert (real / "model.onnx").is_file() and link.is_symlink()


def test_dangling_symlink_is_refused(cli, conv_bn_model, tmp_path):
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "nowhere")
    _one_error_line(cli(conv_bn_model, "-o", link, "-q"), link)
    assert link.is_symlink() and not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("kind", ["fifo", "chr", "symlink"])
def test_atomic_output_dir_refuses_non_folders(tmp_path, kind):
    """The publish step every emitter goes through refuses them too, without running the body."""
    out = tmp_path / "out"
    if kind == "fifo":
        os.mkfifo(out)
    elif kind == "chr":
        os.mknod(out, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    else:
        (tmp_path / "target").mkdir()
        out.symlink_to(tmp_path / "target")
    mode = os.lstat(out).st_mode
    ran = []
    with pytest.raises(UserError) as e:
        with atomic_output_dir(str(out)):
            ran.append(1)
    assert ran == [] and str(out) in str(e.value) and "\n" not in str(e.value)
    assert os.lstat(out).st_mode == mode
    assert sorted(os.listdir(tmp_path)) == (["out", "target"] if kind == "symlink" else ["out"])


def test_atomic_output_dir_refuses_a_fifo_created_while_the_body_ran(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(UserError, match="FIFO"):
        with atomic_output_dir(str(out)) as staging:
            os.mkfifo(out)
            open(os.path.join(staging, "a.txt"), "w").close()
    assert stat.S_ISFIFO(os.lstat(out).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["out"]
