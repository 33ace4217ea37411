"""Tests of element types and constant tensors against onnx's own helpers (the reference)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from passctl.ir import DataType, Tensor

ALL = [dt for dt in DataType if dt != DataType.UNDEFINED]
PACKED = [dt for dt in ALL if dt.is_packed]


def test_every_onnx_element_type_is_a_datatype():
    assert {int(v) for v in onnx.TensorProto.DataType.values()} == {int(dt) for dt in DataType}
    for name, value in onnx.TensorProto.DataType.items():
        assert DataType(value).name == name


@pytest.mark.parametrize("dt", ALL, ids=lambda dt: dt.name)
def test_numpy_dtype_matches_onnx(dt):
    expected = helper.tensor_dtype_to_np_dtype(int(dt))
    assert dt.numpy() == expected
    assert DataType.from_numpy(expected) == dt
    assert DataType.from_short_name(dt.short_name) == dt


def test_short_names_are_unique_and_undefined_has_no_numpy():
    assert len({dt.short_name for dt in DataType}) == len(DataType)
    with pytest.raises(TypeError):
        DataType.UNDEFINED.numpy()


def _sample(dt: DataType, n: int, rng) -> np.ndarray:
    """n valid values of ``dt`` (every bit pattern for the integer types, finite ones for floats)."""
    if dt in (DataType.INT4, DataType.INT2):
        lo = -(1 << (dt.bitwidth - 1))
        return rng.integers(lo, -lo, size=n).astype(dt.numpy())
    if dt in (DataType.UINT4, DataType.UINT2):
        return rng.integers(0, 1 << dt.bitwidth, size=n).astype(dt.numpy())
    codes = rng.integers(0, 1 << dt.bitwidth, size=n).astype(np.uint8)
    values = codes.view(dt.numpy())
    return values[np.isfinite(values.astype(np.float32))]


@pytest.mark.parametrize("dt", PACKED, ids=lambda dt: dt.name)
@pytest.mark.parametrize("shape", [(1,), (3,), (4,), (5,), (7,), (2, 5), (3, 3, 3)])
def test_subbyte_pack_unpack_against_onnx(dt, shape):
    rng = np.random.default_rng(sum(shape) + int(dt))
    n = int(np.prod(shape))
    flat = _sample(dt, 4 * n, rng)[:n]
    assert len(flat) == n
    arr = flat.reshape(shape)
    ref = numpy_helper.from_array(arr)
    assert ref.data_type == int(dt)
    # Packing: our raw bytes equal onnx's.
    assert Tensor(arr).tobytes() == ref.raw_data
    assert Tensor(arr).nbytes == len(ref.raw_data)
    # Unpacking raw bytes and the typed int32_data form that onnx.helper.make_tensor writes.
    back = Tensor(ref.raw_data, dt, shape).numpy()
    expected = numpy_helper.to_array(ref)
    assert back.dtype == expected.dtype and back.shape == expected.shape
    assert back.tobytes() == expected.tobytes()
    typed = helper.make_tensor("t", int(dt), shape, arr.astype(np.float32).reshape(-1).tolist())
    assert not typed.HasField("raw_data")
    from_typed = Tensor.from_proto(typed).numpy()
    assert from_typed.tobytes() == numpy_helper.to_array(typed).tobytes() == expected.tobytes()


@pytest.mark.parametrize("dt", [d for d in ALL if not d.is_packed and d != DataType.STRING],
                         ids=lambda dt: dt.name)
def test_raw_roundtrip_of_byte_types(dt):
    rng = np.random.default_rng(int(dt))
    if dt == DataType.BOOL:
        arr = rng.integers(0, 2, size=(2, 3)).astype(bool)
    elif dt.is_floating and dt.bitwidth == 8:
        arr = _sample_fp8(dt, rng)
    else:
        arr = (rng.standard_normal((2, 3)) * 10).astype(dt.numpy())
    ref = numpy_helper.from_array(arr)
    assert Tensor(arr).tobytes() == ref.raw_data
    back = Tensor(ref.raw_data, dt, arr.shape).numpy()
    assert back.tobytes() == numpy_helper.to_array(ref).tobytes()
    assert Tensor.from_proto(ref).numpy().tobytes() == arr.tobytes()


def _sample_fp8(dt, rng):
    codes = rng.integers(0, 256, size=64).astype(np.uint8)
    values = codes.view(dt.numpy())
    return values[np.isfinite(values.astype(np.float32))][:6].reshape(2, 3)
