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
# NodeProto.attribute, AttributeProto.t / .g / .graphs, TensorProto.raw_data.
_MODEL_GRAPH, _GRAPH_NODE, _GRAPH_INITIALIZER = 7, 1, 5
_NODE_ATTRIBUTE, _ATTRIBUTE_T, _ATTRIBUTE_G, _ATTRIBUTE_GRAPHS, _TENSOR_RAW_DATA = 5, 5, 6, 11, 9
_LEN = 2
MIN_SPLIT_BYTES = 1024  # smaller raw_data stays in the skeleton


class Malformed(Exception):
    """The wire format does not parse (the caller falls back to protobuf for the exact error)."""


class Truncated(Malformed):
    """A field's length runs past the end of the file."""


def split_model(path: str) -> Tuple[onnx.ModelProto, "Split"]:
    """Parse ``path`` with the large ``raw_data`` of the tensors of the main graph and its
    subgraphs (initializers, tensor attributes) read apart.

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


Key = Tuple  # where a tensor sits: see Split


class Split:
    """Raw data read apart from the proto, by where its tensor sits.

    Keys are paths from the main graph: ``("init", i)`` for its i-th initializer, ``("node", n,
    a)`` for attribute ``a`` of its n-th node (a tensor attribute, or the graph of a ``g``
    attribute); a subgraph's entries continue that path, e.g. ``("node", 3, 0, "init", 1)``, and
    the k-th graph of a ``graphs`` attribute adds ``k``: ``("node", 3, 0, k, ...)``.
    """

    def __init__(self):
        self.tensors: Dict[Key, bytes] = {}


class _Splitter:
    def __init__(self, mm: _Window, fd: int, size: int):
        self.mm, self.fd, self.size = mm, fd, size
        self.split = Split()
        # Per graph path: [nodes seen, initializers seen] (a repeated graph field continues).
        self.counts: Dict[Key, List[int]] = {}

    def run(self) -> Tuple[onnx.ModelProto, Split]:
        model_parts: List[bytes] = []
        graph_parts: List[bytes] = []
        for field, wire, start, body, end in self._fields(0, self.size):
            if field == _MODEL_GRAPH and wire == _LEN:
                graph_parts.append(self._graph(body, end, ()))
            else:
                model_parts.append(self.mm[start:end])
        model = onnx.ModelProto.FromString(b"".join(model_parts))
        if graph_parts:
            model.graph.MergeFromString(b"".join(graph_parts))
        return model, self.split

    def _graph(self, pos: int, end: int, path: Key) -> bytes:
        """A GraphProto's encoding with the large raw_data of its tensors (and its subgraphs')
        taken out."""
        counts = self.counts.setdefault(path, [0, 0])
        parts: List[bytes] = []
        for field, wire, start, body, stop in self._fields(pos, end):
            if field == _GRAPH_INITIALIZER and wire == _LEN:
                payload, raw = self._tensor(body, stop)
                if raw is not None:
                    self.split.tensors[path + ("init", counts[1])] = raw
                parts.append(_field(_GRAPH_INITIALIZER, payload))
                counts[1] += 1
            elif field == _GRAPH_NODE and wire == _LEN:
                parts.append(self._node(start, body, stop, path + ("node", counts[0])))
                counts[0] += 1
            else:
                parts.append(self.mm[start:stop])
        return b"".join(parts)

    def _node(self, start: int, pos: int, end: int, path: Key) -> bytes:
        """The node field, with large raw_data of tensor attributes (e.g. Constant values) and of
        subgraph tensors taken out."""
        if end - pos < MIN_SPLIT_BYTES:
            return self.mm[start:end]
        parts: List = []  # bytes, or (start, stop) ranges read only if the node changes
        changed = False
        index = 0
        for field, wire, fstart, body, stop in self._fields(pos, end):
            if field == _NODE_ATTRIBUTE and wire == _LEN:
                new = self._attribute(body, stop, path + (index,)) \
                    if stop - body >= MIN_SPLIT_BYTES else None
                index += 1
                if new is not None:
                    parts.append(_field(_NODE_ATTRIBUTE, new))
                    changed = True
                    continue
            parts.append((fstart, stop))
        if not changed:
            return self.mm[start:end]
        return _field(_GRAPH_NODE, b"".join(
            p if isinstance(p, bytes) else self.mm[p[0]:p[1]] for p in parts))

    def _attribute(self, pos: int, end: int, path: Key) -> Optional[bytes]:
        """The attribute's encoding with raw data taken out, or None when nothing was."""
        fields = list(self._fields(pos, end))
        singular = [f[0] for f in fields if f[0] in (_ATTRIBUTE_T, _ATTRIBUTE_G) and f[1] == _LEN]
        if len(singular) != len(set(singular)):  # a repeated t / g that protobuf would merge
            return None
        parts: List[bytes] = []
        changed = False
        k = 0
        for field, wire, fstart, body, stop in fields:
            if wire == _LEN and field == _ATTRIBUTE_T:
                payload, raw = self._tensor(body, stop)
                if raw is not None:
                    self.split.tensors[path] = raw
                    changed = True
            elif wire == _LEN and field in (_ATTRIBUTE_G, _ATTRIBUTE_GRAPHS):
                sub = path if field == _ATTRIBUTE_G else path + (k,)
                k += field == _ATTRIBUTE_GRAPHS
                payload = self._graph(body, stop, sub)
                changed = changed or len(payload) != stop - body
            else:
                parts.append(self.mm[fstart:stop])
                continue
            parts.append(_field(field, payload))
        return b"".join(parts) if changed else None

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
