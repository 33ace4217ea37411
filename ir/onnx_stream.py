"""Streaming protobuf writing of ONNX weights: raw bytes appended as fields, chunked file copies."""

from __future__ import annotations

import errno
import os
from typing import BinaryIO, List, Sequence, Union

from passctl.ir._tensor import Tensor

CHUNK = 16 << 20  # bytes per read when copying from a data file


def varint(n: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


Chunk = Union[bytes, Tensor]  # encoded bytes, or a tensor whose raw bytes are written as they are


def key(field: int) -> bytes:
    """Wire-format key of a length-delimited field (all fields written here are)."""
    return varint((field << 3) | 2)


def raw_nbytes(t: Tensor) -> int:
    """Bytes :func:`write_raw` writes for ``t``: its raw data as held (an external ``length`` or
    the bytes read from the file, even where they disagree with the shape), else ``t.nbytes``."""
    ext = t.external
    if ext is not None:
        return ext.length if ext.length is not None else t.nbytes
    data = t._data  # noqa: SLF001  (same package: the held bytes, not a copy)
    if isinstance(data, (bytes, bytearray, memoryview)):
        return memoryview(data).nbytes
    return t.nbytes


def chunks_size(chunks: Sequence[Chunk]) -> int:
    return sum(raw_nbytes(c) if isinstance(c, Tensor) else len(c) for c in chunks)


def field_chunks(field: int, body: List[Chunk]) -> List[Chunk]:
    """``body`` (a message's encoding, in chunks) wrapped as length-delimited field ``field``."""
    return [key(field) + varint(chunks_size(body))] + body


def tensor_chunks(header: bytes, t: Tensor) -> List[Chunk]:
    """A TensorProto: ``header`` (its encoding without raw_data) and the raw_data field (9)."""
    return [header] + field_chunks(9, [t])


def write_graph_tail(f: BinaryIO, body: List[Chunk]) -> None:
    """Append one more ``ModelProto.graph`` field (7) holding ``body`` to a serialized ModelProto.

    Protobuf merges a repeated occurrence of an embedded message field and concatenates repeated
    fields (protobuf encoding spec, "Last One Wins" and merging of embedded messages), so nodes and
    initializers written here parse as if they were inside the skeleton's graph.

    Args:
        f: file positioned after the serialized skeleton ModelProto.
        body: GraphProto fields (node / initializer entries) as chunks.
    """
    if not body:
        return
    for c in field_chunks(7, body):
        if isinstance(c, Tensor):
            write_raw(f, c)
        else:
            f.write(c)


def write_raw(f: BinaryIO, t: Tensor) -> None:
    """Write the tensor's raw ONNX bytes at ``f``'s position, copying external data in chunks
    (holes of a sparse source file are skipped with a seek, so they stay holes)."""
    ext = t.external
    if ext is not None:
        copy_range(ext.path, ext.offset, raw_nbytes(t), f)
    else:
        f.write(t.raw_view())


def copy_range(src_path: str, offset: int, length: int, dst: BinaryIO) -> None:
    """Copy ``length`` bytes of ``src_path`` from ``offset`` to ``dst``'s position.

    Uses ``os.copy_file_range`` (in-kernel, no user-space buffer) where the platform allows, else
    reads and writes chunks of :data:`CHUNK` bytes. Holes of a sparse source stay holes.

    Raises:
        OSError: the source ends early or cannot be read.
    """
    end = offset + length
    pos = offset
    with open(src_path, "rb", buffering=0) as src:
        fd = src.fileno()
        while pos < end:
            data = _next_data(fd, pos, end)
            if data > pos:  # a hole: leave one in the output too
                dst.seek(data - pos, os.SEEK_CUR)
                pos = data
                continue
            stop = _next_hole(fd, pos, end)
            pos = _copy_segment(src, pos, stop, dst, src_path, end)


def _copy_segment(src, pos: int, stop: int, dst: BinaryIO, src_path: str, end: int) -> int:
    """Copy source bytes [pos, stop) to ``dst``; returns ``stop``."""
    pos = _copy_in_kernel(src, pos, stop, dst)
    src.seek(pos)
    while pos < stop:
        chunk = src.read(min(CHUNK, stop - pos))
        if not chunk:
            raise OSError(f"{src_path}: ends at byte {pos}, expected {end} bytes")
        dst.write(chunk)
        pos += len(chunk)
    return pos


def _copy_in_kernel(src, pos: int, stop: int, dst: BinaryIO) -> int:
    """As much of [pos, stop) as ``os.copy_file_range`` copies; returns the next source offset
    (``pos`` itself where it is unavailable; the caller copies the rest)."""
    copy = getattr(os, "copy_file_range", None)
    try:
        dst_fd = dst.fileno()
    except (AttributeError, OSError, ValueError):
        return pos
    if copy is None:
        return pos
    dst.flush()
    dst_pos = dst.tell()
    try:
        while pos < stop:
            n = copy(src.fileno(), dst_fd, stop - pos, pos, dst_pos)
            if n == 0:  # source shorter than expected: the read loop reports it
                break
            pos += n
            dst_pos += n
    except OSError:  # EXDEV, ENOSYS, EINVAL on some file systems: fall back to read/write
        pass
    dst.seek(dst_pos)
    return pos


def _next_data(fd: int, pos: int, end: int) -> int:
    try:
        return min(os.lseek(fd, pos, os.SEEK_DATA), end)
    except OSError as e:
        if e.errno == errno.ENXIO:  # only a hole remains up to the end of the file
            return end if pos < os.fstat(fd).st_size else pos
        return pos
    except AttributeError:  # no SEEK_DATA on this platform
        return pos


def _next_hole(fd: int, pos: int, end: int) -> int:
    try:
        return min(os.lseek(fd, pos, os.SEEK_HOLE), end)
    except (OSError, AttributeError):
        return end
