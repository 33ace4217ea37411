"""Split an ONNX file into a small skeleton proto and the large raw_data of its tensors."""

# ``onnx.load`` holds the whole file and the parsed proto at once (2x the weights). Here the protobuf
# wire format (https://protobuf.dev/programming-guides/encoding/) is walked: keys and lengths are
# read through a small ``os.pread`` window (not a memory map, whose fault-around would count weight
# pages in the RSS); each large ``raw_data`` of a main-graph initializer or tensor attribute is read
# into its own ``bytes``, and the rest is parsed by protobuf. A message's encoding is a sequence of
# fields and concatenated encodings merge, so the parts can be parsed separately.

from __future__ import annotations

import os
from typing import Dict, List, Optional, Tuple

import onnx

from passctl.ir.onnx_stream import varint

# Field numbers (onnx.proto): ModelProto.graph, GraphProto.node / .initializer,
# NodeProto.attribute, AttributeProto.t, TensorProto.raw_data.
_MODEL_GRAPH, _GRAPH_NODE, _GRAPH_INITIALIZER = 7, 1, 5
_NODE_ATTRIBUTE, _ATTRIBUTE_T, _TENSOR_RAW_DATA = 5, 5, 9
_LEN = 2
MIN_SPLIT_BYTES = 1024  # smaller raw_data stays in the skeleton


class Malformed(Exception):
    """The wire format does not parse (the caller falls back to protobuf for the exact error)."""


class Truncated(Malformed):
    """A field's length runs past the end of the file."""


def split_model(path: str) -> Tuple[onnx.ModelProto, "Split"]:
    """Parse ``path`` with the large ``raw_data`` of main-graph initializers and tensor attributes
    read apart.

    Returns:
        The ModelProto (those ``raw_data`` fields left out) and the :class:`Split` raw bytes.

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


class Split:
    """Raw data read apart from the proto: per main-graph initializer (None where the proto kept
    its data), and per (main-graph node index, attribute index) for tensor attributes."""

    def __init__(self):
        self.initializers: List[Optional[bytes]] = []
        self.node_attributes: Dict[Tuple[int, int], bytes] = {}


class _Splitter:
    def __init__(self, mm: _Window, fd: int, size: int):
        self.mm, self.fd, self.size = mm, fd, size
        self.model_parts: List[bytes] = []
        self.graph_parts: List[bytes] = []
        self.tensors: List[bytes] = []
        self.split = Split()
        self.node_count = 0
        self.saw_graph = False

    def run(self) -> Tuple[onnx.ModelProto, Split]:
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
        return model, self.split

    def _graph(self, pos: int, end: int) -> None:
        for field, wire, start, body, stop in self._fields(pos, end):
            if field == _GRAPH_INITIALIZER and wire == _LEN:
                payload, raw = self._tensor(body, stop)
                self.tensors.append(payload)
                self.split.initializers.append(raw)
            elif field == _GRAPH_NODE and wire == _LEN:
                self.graph_parts.append(self._node(start, body, stop))
                self.node_count += 1
            else:
                self.graph_parts.append(self.mm[start:stop])

    def _node(self, start: int, pos: int, end: int) -> bytes:
        """The node field, with large tensor-attribute raw_data taken out (e.g. Constant values)."""
        if end - pos < MIN_SPLIT_BYTES:
            return self.mm[start:end]
        parts: List[bytes] = []
        changed = False
        index = 0
        for field, wire, fstart, body, stop in self._fields(pos, end):
            if field == _NODE_ATTRIBUTE and wire == _LEN:
                if stop - body >= MIN_SPLIT_BYTES:
                    payload, raw = self._attribute(body, stop)
                    if raw is not None:
                        self.split.node_attributes[(self.node_count, index)] = raw
                        parts.append(_field(_NODE_ATTRIBUTE, payload))
                        changed = True
                        index += 1
                        continue
                index += 1
            parts.append(self.mm[fstart:stop])
        if not changed:
            return self.mm[start:end]
        return _field(_GRAPH_NODE, b"".join(parts))

    def _attribute(self, pos: int, end: int) -> Tuple[bytes, Optional[bytes]]:
        fields = list(self._fields(pos, end))
        tensors = [f for f in fields if f[0] == _ATTRIBUTE_T and f[1] == _LEN]
        if len(tensors) != 1:  # no tensor, or several that protobuf would merge: keep as is
            return b"", None
        parts: List[bytes] = []
        raw = None
        for field, wire, fstart, body, stop in fields:
            if field == _ATTRIBUTE_T and wire == _LEN:
                payload, raw = self._tensor(body, stop)
                parts.append(_field(_ATTRIBUTE_T, payload))
            else:
                parts.append(self.mm[fstart:stop])
        return b"".join(parts), raw

    def _tensor(self, pos: int, end: int) -> Tuple[bytes, Optional[bytes]]:
        """A TensorProto's encoding without its large raw_data, and that raw_data (or None)."""
        parts: List[bytes] = []
        raw: Optional[bytes] = None
        for field, wire, start, body, stop in self._fields(pos, end):
            if field == _TENSOR_RAW_DATA and wire == _LEN and stop - body >= MIN_SPLIT_BYTES:
                raw = self.mm[body:stop]  # last occurrence wins, as in protobuf
            else:
                if field == _TENSOR_RAW_DATA:
                    raw = None
                parts.append(self.mm[start:stop])
        return b"".join(parts), raw

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


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field's encoding."""
    return varint((number << 3) | _LEN) + varint(len(payload)) + payload
