"""Split an ONNX file into a small skeleton proto and its initializers' raw bytes, read once each.

``onnx.load`` holds the whole file and the parsed proto at once (2x the weights). Here the protobuf
wire format is walked (keys and lengths, read through a small window with ``os.pread``; not a memory
map, whose fault-around would count weight pages in the RSS); each large ``raw_data`` of a
main-graph initializer is read into its own ``bytes``, and everything else is parsed by protobuf. Wire format: https://protobuf.dev/programming-guides/encoding/ (a
message is a sequence of fields; concatenated encodings of a message merge, so the parts can be
parsed separately).
"""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

import onnx

_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9
_LEN = 2
MIN_SPLIT_BYTES = 1024  # smaller raw_data stays in the skeleton


class Malformed(Exception):
    """The wire format does not parse (the caller falls back to protobuf for the exact error)."""


class Truncated(Malformed):
    """A field's length runs past the end of the file."""


def split_model(path: str) -> Tuple[onnx.ModelProto, List[Optional[bytes]]]:
    """Parse ``path`` with the large initializer ``raw_data`` fields read apart.

    Returns:
        The ModelProto (initializers listed, their large ``raw_data`` left empty) and, per main-graph
        initializer in order, the raw bytes taken out of it (None where the proto kept its data).

    Raises:
        Truncated: a length field points past the end of the file.
        Malformed: the bytes are not a protobuf message (groups, over-long varints, ...).
        google.protobuf.message.DecodeError: protobuf rejects the skeleton.
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise Truncated("empty file")
        return _Splitter(_Window(f.fileno(), size), f.fileno(), size).run()


class _Window:
    """Reads of a file through one cached window of :data:`WINDOW` bytes (``os.pread``)."""

    WINDOW = 1 << 16

    def __init__(self, fd: int, size: int):
        self.fd, self.size = fd, size
        self.base = 0
        self.buf = b""

    def __getitem__(self, key):
        if isinstance(key, slice):
            a, b = key.start, key.stop
            if self.base <= a and b <= self.base + len(self.buf):
                return self.buf[a - self.base:b - self.base]
            data = os.pread(self.fd, b - a, a)
            if len(data) != b - a:
                raise Truncated(f"short read at byte {a}")
            return data
        i = key - self.base
        if not 0 <= i < len(self.buf):
            self.base, self.buf = key, os.pread(self.fd, self.WINDOW, key)
            if not self.buf:
                raise Truncated(f"file ends at byte {key}")
            i = 0
        return self.buf[i]


class _Splitter:
    def __init__(self, mm: _Window, fd: int, size: int):
        self.mm, self.fd, self.size = mm, fd, size
        self.model_parts: List[bytes] = []
        self.graph_parts: List[bytes] = []
        self.tensors: List[bytes] = []
        self.raws: List[Optional[bytes]] = []
        self.saw_graph = False

    def run(self) -> Tuple[onnx.ModelProto, List[Optional[bytes]]]:
        for field, wire, start, body, end in self._fields(0, self.size):
            if field == _MODEL_GRAPH and wire == _LEN:
                self.saw_graph = True
                self._graph(body, end)
            else:
                self.model_parts.append(self.mm[start:end])
        model = onnx.ModelProto.FromString(b"".join(self.model_parts))
        if self.saw_graph:
            model.graph.MergeFromString(b"".join(self.graph_parts))
            for t in self.tensors:
                model.graph.initializer.add().MergeFromString(t)
        return model, self.raws

    def _graph(self, pos: int, end: int) -> None:
        for field, wire, start, body, stop in self._fields(pos, end):
            if field == _GRAPH_INITIALIZER and wire == _LEN:
                self._tensor(body, stop)
            else:
                self.graph_parts.append(self.mm[start:stop])

    def _tensor(self, pos: int, end: int) -> None:
        parts: List[bytes] = []
        raw: Optional[bytes] = None
        for field, wire, start, body, stop in self._fields(pos, end):
            if field == _TENSOR_RAW_DATA and wire == _LEN and stop - body >= MIN_SPLIT_BYTES:
                raw = os.pread(self.fd, stop - body, body)  # last occurrence wins, as in protobuf
                if len(raw) != stop - body:
                    raise Truncated("short read")
            else:
                if field == _TENSOR_RAW_DATA:
                    raw = None
                parts.append(self.mm[start:stop])
        self.tensors.append(b"".join(parts))
        self.raws.append(raw)

    def _fields(self, pos: int, end: int):
        """Yield (field number, wire type, field start, payload start, field end) in [pos, end)."""
        mm = self.mm
        while pos < end:
            start = pos
            key, pos = self._varint(pos, end)
            field, wire = key >> 3, key & 7
            body = pos
            if wire == 0:
                _, pos = self._varint(pos, end)
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            elif wire == _LEN:
                length, body = self._varint(pos, end)
                pos = body + length
            else:
                raise Malformed(f"wire type {wire} at byte {start}")
            if pos > end or field == 0:
                raise Truncated(f"field {field} at byte {start} runs past its end") \
                    if pos > end else Malformed(f"field 0 at byte {start}")
            yield field, wire, start, body, pos
        del mm

    def _varint(self, pos: int, end: int) -> Tuple[int, int]:
        mm = self.mm
        result = shift = 0
        while True:
            if pos >= end:
                raise Truncated(f"varint cut at byte {pos}")
            b = mm[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result, pos
            shift += 7
            if shift > 63:
                raise Malformed(f"varint too long at byte {pos}")
