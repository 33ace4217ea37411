"""Bad model files: each is one ModelLoadError line naming the file, and the file is left unchanged."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from passctl.ir import load
from passctl.ir.errors import ModelLoadError, UserError


def _model_bytes(location: str = "", n: int = 4) -> bytes:
    """A small valid model (x[1,n] @ W[n,n]); with ``location``, W points at external data."""
    w = onnx.numpy_helper.from_array(np.ones((n, n), np.float32), "W")
    if location:
        w.ClearField("raw_data")
        w.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", "0"), ("length", "64")):
            w.external_data.add(key=key, value=value)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
                              initializer=[w])
    return helper.make_model(graph).SerializeToString()


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest() if os.path.isfile(path) else ""


def _expect_error(path, *words) -> str:
    before = _digest(path)
    with pytest.raises(ModelLoadError) as info:
        load(str(path))
    message = str(info.value)
    assert isinstance(info.value, UserError)
    assert "\n" not in message and str(path) in message, message
    for word in words:
        assert word in message, message
    assert _digest(path) == before  # never modified
    return message


def test_missing_file(tmp_path):
    _expect_error(tmp_path / "nope.onnx", "no such file")


def test_folder_instead_of_file(tmp_path):
    _expect_error(tmp_path, "folder")


def test_empty_file(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    _expect_error(path, "empty")


def test_text_file(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_text("graph main(x) { y = Relu(x) }\n")
    _expect_error(path, "text file", "not an ONNX model")


def test_png_file(tmp_path):
    path = tmp_path / "image.onnx"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    _expect_error(path, "PNG", "not an ONNX model")


def test_random_binary_file(tmp_path):
    path = tmp_path / "noise.onnx"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    _expect_error(path, "not an ONNX model")


def test_protobuf_that_is_not_a_model(tmp_path):
    path = tmp_path / "tensor.onnx"
    path.write_bytes(onnx.numpy_helper.from_array(np.ones(8, np.float32), "t").SerializeToString())
    _expect_error(path, "not an ONNX model")


def test_truncated_protobuf(tmp_path):
    data = _model_bytes()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) * 2 // 3])
    _expect_error(path, "truncated")


@pytest.mark.parametrize("n", [4, 32])  # W of 64 bytes (parsed whole) or 4 KiB (read apart)
def test_every_truncation_point_is_reported(tmp_path, n):
    """Cutting a model anywhere (inside a weight, between fields, before opset_import) gives a
    ModelLoadError, never a model silently missing parts."""
    data = _model_bytes(n=n)
    path = tmp_path / "cut.onnx"
    for cut in list(range(0, len(data), 7 if n == 4 else 53)) + [len(data) - 1, len(data) - 4]:
        path.write_bytes(data[:cut])
        with pytest.raises(ModelLoadError, match="cut.onnx"):
            load(str(path))
    path.write_bytes(data)
    assert load(str(path)).graph.initializers["W"].const.numpy().shape == (n, n)


def test_missing_external_data_file(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(_model_bytes("weights.bin"))
    _expect_error(path, "weights.bin", "missing")


def test_truncated_external_data_file(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(_model_bytes("weights.bin"))
    (tmp_path / "weights.bin").write_bytes(b"\0" * 10)
    _expect_error(path, "weights.bin", "truncated")


def test_external_location_with_dotdot(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 64)
    folder = tmp_path / "m"
    folder.mkdir()
    path = folder / "model.onnx"
    path.write_bytes(_model_bytes("../secret.bin"))
    _expect_error(path, "..", "escapes")


def test_external_location_absolute(tmp_path):
    data = tmp_path / "abs.bin"
    data.write_bytes(b"\0" * 64)
    path = tmp_path / "model.onnx"
    path.write_bytes(_model_bytes(str(data)))
    _expect_error(path, "absolute")


def test_external_location_symlink_escape(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "data.bin").write_bytes(b"\0" * 64)
    folder = tmp_path / "m"
    folder.mkdir()
    os.symlink(outside / "data.bin", folder / "link.bin")
    path = folder / "model.onnx"
    path.write_bytes(_model_bytes("link.bin"))
    _expect_error(path, "symlink")


def test_valid_external_model_loads(tmp_path):
    """The control case of the tests above: the same model with its data file in place loads."""
    path = tmp_path / "model.onnx"
    path.write_bytes(_model_bytes("weights.bin"))
    (tmp_path / "weights.bin").write_bytes(np.full(16, 2.0, np.float32).tobytes())
    model = load(str(path))
    assert np.array_equal(model.graph.initializers["W"].const.numpy(), np.full((4, 4), 2.0))
