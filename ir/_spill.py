"""Spilled constants: tensors a pass computes, kept in a temporary file instead of in memory.

A pass that turns file-backed weights into new ones (quantize-weights on a 7B decoder: 3.4 GB of
int4 codes) would otherwise hold every result in memory until the emitter writes the artifact.
:func:`spill` writes the array to a per-process temporary file at once and returns a
:class:`~passctl.ir.Tensor` backed by that file (an :class:`~passctl.ir.ExternalLocation`), read
back with ``np.memmap`` on use and copied in chunks (``os.copy_file_range``) by ``save``, like the
source model's external data. The written pages sit in the kernel's page cache, not in the
process's RSS.

The file lives in a folder made with ``tempfile.mkdtemp`` under ``$PASSCTL_SPILL_DIR`` (else the
system temporary folder) and is removed when the process exits.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from typing import Optional

import numpy as np

from passctl.ir._tensor import ExternalLocation, Tensor, pack_subbyte
from passctl.ir._types import DataType

ALIGN = 4096  # page-aligned offsets: each tensor maps from a page boundary
_LOCK = threading.Lock()
_FILE: Optional[str] = None


def _spill_path() -> str:
    global _FILE
    if _FILE is None:
        folder = tempfile.mkdtemp(prefix="passctl-spill-", dir=os.environ.get("PASSCTL_SPILL_DIR"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _FILE = os.path.join(folder, "spilled.bin")
        open(_FILE, "wb").close()
    return _FILE


def spill(array: np.ndarray, name: str = "", dtype: Optional[DataType] = None) -> Tensor:
    """Write ``array`` (any numeric dtype, little endian, C order) to the spill file; return a
    Tensor of the same dtype and shape backed by it. Sub-byte types (int4, uint4, ...: ml_dtypes
    holds one element per byte) are written packed, as ONNX external data stores them
    (:func:`passctl.ir._tensor.pack_subbyte`), so ``save`` can copy the bytes as they are.

    Args:
        array: the data; copied to the file, not kept.
        name: the tensor's name.
        dtype: the element type (default: from ``array.dtype``).

    Raises:
        OSError: the spill folder cannot be written (full disk: set ``PASSCTL_SPILL_DIR``).
    """
    arr = np.ascontiguousarray(array)
    if arr.dtype.kind in "iufc" and arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    dtype = DataType.from_numpy(arr.dtype) if dtype is None else DataType(dtype)
    shape = tuple(arr.shape)
    if dtype.is_packed:
        arr = pack_subbyte(arr, dtype)
    with _LOCK:
        path = _spill_path()
        with open(path, "ab") as f:
            start = f.tell()
            pad = (-start) % ALIGN
            if pad:
                f.write(b"\0" * pad)
            offset = start + pad
            f.write(arr.reshape(-1).view(np.uint8).data)
    ext = ExternalLocation(path, os.path.basename(path), offset, arr.nbytes)
    return Tensor(ext, dtype=dtype, dims=shape, name=name)


def spill_bytes() -> int:
    """Bytes in this process's spill file so far (0 when nothing was spilled)."""
    return os.path.getsize(_FILE) if _FILE is not None and os.path.exists(_FILE) else 0


__all__ = ["spill", "spill_bytes"]
