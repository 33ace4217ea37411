"""A bad --inputs file is a one-line user error naming the file, in compile and run (break-it 7)."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest


def _bad_files(tmp_path):
    """(file, words its error must contain) for each kind of unusable --inputs file."""
    obj = tmp_path / "obj.npz"
    np.savez(obj, x=np.array([{"a": 1}, None], dtype=object))
    text = tmp_path / "text.npz"
    text.write_text("x = [1, 2, 3]\n")
    empty = tmp_path / "empty.npz"
    np.savez(empty)
    broken = tmp_path / "broken.npz"
    with zipfile.ZipFile(broken, "w") as z:
        z.writestr("x.npy", b"not a numpy array")
    return [(obj, ["'x'", "object"]), (text, ["not an .npz archive", "numpy.savez"]),
            (empty, ["holds no arrays", "numpy.savez"]), (broken, ["'x'", "numpy.savez"])]


def _assert_one_line(r, path, words):
    assert r.rc == 2, r.err
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("passctl: error: --inputs"), r.err
    assert str(path) in lines[0] and "Traceback" not in r.err
    assert "pickled" not in lines[0]  # numpy's hint about allow_pickle misleads here
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.mark.parametrize("case", range(4))
def test_compile_bad_inputs_file(cli, conv_bn_model, tmp_path, case):
    path, words = _bad_files(tmp_path)[case]
    r = cli(conv_bn_model, "--check", "--inputs", path, "-o", tmp_path / "o", "-q")
    _assert_one_line(r, path, words)
    assert not (tmp_path / "o").exists()


def test_run_bad_inputs_file(cli, conv_bn_model, tmp_path):
    assert cli(conv_bn_model, "-o", tmp_path / "art", "-q").rc == 0
    for path, words in _bad_files(tmp_path):
        r = cli("run", tmp_path / "art", "--inputs", path, "--runs", "1")
        _assert_one_line(r, path, words)
