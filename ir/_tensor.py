"""Constant tensor data: numpy-backed, raw ONNX bytes, or memory-mapped ONNX external data."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np
import onnx
import onnx.numpy_helper

from passctl.ir._types import DataType


@dataclass(frozen=True)
class ExternalLocation:
    """Where an ONNX external-data tensor lives: ``path`` (absolute), byte ``offset`` and ``length``.

    ``location`` is the relative path as written in the model (kept for export).
    """

    path: str
    location: str
    offset: int = 0
    length: Optional[int] = None
    checksum: Optional[str] = None


class Tensor:
    """A constant tensor (initializer, Constant value, tensor attribute).

    The data is one of: a numpy array; raw little-endian ONNX bytes (packed two to a byte for 4-bit
    types); an :class:`ExternalLocation` read with ``np.memmap`` on first use (never copied just to be
    read); or the original ``onnx.TensorProto`` for tensors that use the typed fields
    (``float_data``, ``string_data``, ...), which export copies back unchanged.

    Args:
        data: ``np.ndarray``, ``bytes``/``memoryview``, ``ExternalLocation`` or ``onnx.TensorProto``.
        dtype: element type; inferred from a numpy array when omitted.
        dims: the shape; taken from a numpy array when omitted.
        name: the tensor's name (for initializers, the value's name).
    """

    __slots__ = ("name", "dtype", "dims", "doc_string", "metadata_props", "_data", "_array")

    def __init__(self, data, dtype: Optional[DataType] = None, dims: Optional[Tuple[int, ...]] = None,
                 name: str = "", doc_string: str = "", metadata_props: Optional[Dict[str, str]] = None):
        if isinstance(data, np.ndarray):
            dtype = DataType.from_numpy(data.dtype) if dtype is None else DataType(dtype)
            if data.dtype != dtype.numpy() and dtype != DataType.STRING:
                data = data.astype(dtype.numpy())
            dims = tuple(data.shape) if dims is None else tuple(dims)
        elif dtype is None or dims is None:
            raise TypeError("Tensor from bytes, external data or a TensorProto needs dtype and dims")
        self.name = name
        self.dtype = DataType(dtype)
        self.dims = tuple(int(d) for d in dims)
        self.doc_string = doc_string
        self.metadata_props = dict(metadata_props or {})
        self._data = data
        self._array: Optional[np.ndarray] = data if isinstance(data, np.ndarray) else None

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def from_proto(cls, proto: onnx.TensorProto, base_dir: Optional[str] = None) -> "Tensor":
        """Wrap an ``onnx.TensorProto`` without reading external data.

        Raises:
            ValueError: if the external-data location escapes ``base_dir`` (see
                :func:`passctl.ir._tensor.resolve_external_path`) or the file is missing.
        """
        meta = {p.key: p.value for p in proto.metadata_props}
        common = dict(dtype=DataType(proto.data_type), dims=tuple(proto.dims), name=proto.name,
                      doc_string=proto.doc_string, metadata_props=meta)
        if proto.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in proto.external_data}
            location = info.get("location", "")
            path = resolve_external_path(base_dir or ".", location, proto.name)
            ext = ExternalLocation(path, location, int(info.get("offset", 0) or 0),
                                   int(info["length"]) if info.get("length") else None,
                                   info.get("checksum"))
            return cls(ext, **common)
        if proto.HasField("raw_data") and not proto.HasField("segment"):
            return cls(proto.raw_data, **common)
        return cls(proto, **common)

    # -- properties ------------------------------------------------------------------------------
    @property
    def shape(self) -> Tuple[int, ...]:
        return self.dims

    @property
    def size(self) -> int:
        return int(np.prod(self.dims, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Bytes of the data as stored in ONNX (packed for sub-byte types; 0 for strings)."""
        if self.dtype == DataType.STRING:
            return 0
        return (self.size * self.dtype.bitwidth + 7) // 8

    @property
    def external(self) -> Optional[ExternalLocation]:
        return self._data if isinstance(self._data, ExternalLocation) else None

    @property
    def source_proto(self) -> Optional[onnx.TensorProto]:
        """The original proto, for tensors stored in typed fields (export copies it back as is)."""
        return self._data if isinstance(self._data, onnx.TensorProto) else None

    # -- data ------------------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """The data as a numpy array of ``dtype.numpy()`` and shape ``dims``.

        External data is a read-only ``np.memmap`` view (packed 4-bit/2-bit types are unpacked, which
        copies). Treat the result as read-only: a pass that changes weights makes a new Tensor.

        The view of external data is not kept by the tensor: each call maps the file again, and the
        mapping (with the pages it made resident, which count in the process's RSS) goes away when
        the caller drops the array. A pass that reads a 7B model's weights one at a time thus holds
        one weight's pages at a time, not the whole file.
        """
        if self._array is not None:
            return self._array
        data = self._data
        if isinstance(data, ExternalLocation):
            return self._decode(self._memmap(data))
        if isinstance(data, onnx.TensorProto):
            arr = onnx.numpy_helper.to_array(data)
            if self.dtype != DataType.STRING and arr.dtype != self.dtype.numpy():
                arr = arr.view(self.dtype.numpy()) if arr.itemsize == self.dtype.numpy().itemsize \
                    else arr.astype(self.dtype.numpy())
        else:
            arr = self._decode(np.frombuffer(data, dtype=np.uint8))
        self._array = arr
        return arr

    def _memmap(self, ext: ExternalLocation) -> np.ndarray:
        length = ext.length if ext.length is not None else self.nbytes
        if length == 0:
            return np.zeros(0, np.uint8)
        return np.memmap(ext.path, dtype=np.uint8, mode="r", offset=ext.offset, shape=(length,))

    def _decode(self, buf: np.ndarray) -> np.ndarray:
        """Raw little-endian ONNX bytes (uint8 array) -> typed array of shape ``dims``."""
        np_dtype = self.dtype.numpy()
        if self.dtype.is_packed:
            return unpack_subbyte(buf, self.dtype, self.size).reshape(self.dims)
        arr = buf.view(np_dtype.newbyteorder("<") if np_dtype.kind in "iufc" else np_dtype)
        return arr.reshape(self.dims)

    def tobytes(self) -> bytes:
        """The raw ONNX bytes (little endian, packed for sub-byte types).

        Raises:
            TypeError: for string tensors, which have no raw form.
        """
        if self.dtype == DataType.STRING:
            raise TypeError(f"string tensor '{self.name}' has no raw bytes")
        if isinstance(self._data, (bytes, bytearray)):
            return bytes(self._data)
        if isinstance(self._data, ExternalLocation):
            return self._memmap(self._data).tobytes()
        arr = self.numpy()
        if self.dtype.is_packed:
            return pack_subbyte(arr, self.dtype).tobytes()
        if arr.dtype.kind in "iufc" and arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        return np.ascontiguousarray(arr).tobytes()

    def raw_view(self) -> memoryview:
        """Like :meth:`tobytes` but without a copy where the data is already raw or memory-mapped."""
        if isinstance(self._data, (bytes, bytearray, memoryview)):
            return memoryview(self._data)
        if isinstance(self._data, ExternalLocation):
            return memoryview(self._memmap(self._data))
        return memoryview(self.tobytes())

    def __repr__(self):
        where = "external" if self.external else "inline"
        return f"Tensor({self.name!r}, {self.dtype.short_name}, {list(self.dims)}, {where})"


def unpack_subbyte(buf: np.ndarray, dtype: DataType, count: int) -> np.ndarray:
    """Unpack ONNX's packed 2-, 4- or 6-bit elements (``count`` of them) into one element each.

    ONNX packs these types as a little-endian bit stream: element ``k`` occupies bits
    ``[k*b, (k+1)*b)`` counting from the least significant bit of byte 0 (for 4 bits: low nibble
    first). Source: ONNX IR spec, "4 bit integer types" / "2 bit integer types" / FLOAT6E2M3, and
    ``onnx.numpy_helper`` which the tests use as the reference.

    Returns:
        A flat array of ``dtype.numpy()`` with ``count`` elements.
    """
    bits = dtype.bitwidth
    u = np.ascontiguousarray(np.asarray(buf, dtype=np.uint8))
    stream = np.unpackbits(u, bitorder="little")[:count * bits].reshape(count, bits)
    codes = (stream.astype(np.uint8) << np.arange(bits, dtype=np.uint8)).sum(axis=1).astype(np.uint8)
    if dtype in (DataType.INT4, DataType.INT2):
        signed = codes.astype(np.int8)
        signed = np.where(signed >= (1 << (bits - 1)), signed - (1 << bits), signed).astype(np.int8)
        return signed.astype(dtype.numpy())
    if dtype in (DataType.UINT4, DataType.UINT2):
        return codes.astype(dtype.numpy())
    # Sub-byte floats: ml_dtypes stores one element per byte, its code in the low bits.
    return codes.view(dtype.numpy())


def pack_subbyte(arr: np.ndarray, dtype: DataType) -> np.ndarray:
    """Inverse of :func:`unpack_subbyte`: elements -> packed uint8 array (little-endian bit stream,
    the last byte zero-padded)."""
    bits = dtype.bitwidth
    flat = np.asarray(arr).reshape(-1)
    if dtype in (DataType.INT4, DataType.INT2, DataType.UINT4, DataType.UINT2):
        codes = flat.astype(np.int16).astype(np.uint8)
    else:
        codes = np.ascontiguousarray(flat.astype(dtype.numpy())).view(np.uint8)
    codes = codes & np.uint8((1 << bits) - 1)
    stream = ((codes[:, None] >> np.arange(bits, dtype=np.uint8)) & 1).astype(np.uint8)
    return np.packbits(stream.reshape(-1), bitorder="little")


def resolve_external_path(base_dir: str, location: str, tensor_name: str = "") -> str:
    """Resolve an external-data ``location`` against the model's folder, refusing escapes.

    Raises:
        ValueError: the location is absolute, contains ``..``, is (or passes through) a symlink that
            leads outside ``base_dir``, or the file does not exist. The message names the tensor.
    """
    who = f"tensor '{tensor_name}'" if tensor_name else "a tensor"
    if not location:
        raise ValueError(f"{who} says its data is external but gives no location")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or (
            len(location) > 1 and location[1] == ":"):
        raise ValueError(f"{who}: external-data location '{location}' is an absolute path; "
                         "it must be relative to the model's folder")
    parts = location.replace("\\", "/").split("/")
    if ".." in parts:
        raise ValueError(f"{who}: external-data location '{location}' escapes the model's folder "
                         "('..'); move the data file next to the model")
    base_real = os.path.realpath(base_dir)
    path = os.path.join(base_dir, location)
    real = os.path.realpath(path)
    if os.path.commonpath([base_real, real]) != base_real:
        raise ValueError(f"{who}: external-data location '{location}' leads outside the model's "
                         "folder through a symlink; copy the data file next to the model")
    if os.path.exists(real) and not os.path.isfile(real):
        raise ValueError(f"{who}: external-data file '{location}' is {_file_kind(real)}, not a "
                         "regular file; give the weights as a regular file next to the model")
    if not os.path.isfile(real):
        raise ValueError(f"{who}: external-data file '{location}' is missing (looked in "
                         f"{os.path.abspath(base_dir)})")
    if not os.access(real, os.R_OK):
        raise ValueError(f"{who}: external-data file '{location}' cannot be read (permission "
                         "denied); check its permissions")
    return real


def _file_kind(path: str) -> str:
    """What the non-regular file ``path`` is (``a FIFO (named pipe)``, ``a folder``, ...)."""
    import stat

    mode = os.stat(path).st_mode
    return ("a folder" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
            else "a character device" if stat.S_ISCHR(mode) else "a block device"
            if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "a special file")
