"""Where the IR text form keeps large constants: a weights file it writes, or the source model."""

from __future__ import annotations

import os
import tempfile
from typing import Dict, Optional, Tuple

import onnx

from passctl.ir._tensor import Tensor
from passctl.ir._types import DataType

# Offsets of constants in a weights file are multiples of this (memory-map friendly).
ALIGNMENT = 64


class WeightsFile:
    """The weights file the printer writes: raw little-endian ONNX bytes, one constant after the
    other at ``ALIGNMENT``-byte offsets. Written to a temporary file and renamed by
    :meth:`commit`, so an existing file (even one the model itself memory-maps) is never
    overwritten in place."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self.target = os.path.realpath(self.path)
        fd, self.tmp = tempfile.mkstemp(prefix=".weights-", dir=os.path.dirname(self.path))
        self.file = os.fdopen(fd, "wb")
        self.offset = 0
        self.placed: Dict[int, Tuple[Tensor, int, int]] = {}

    def is_target(self, path: str) -> bool:
        """True when ``path`` is the file this writer replaces (its data must be copied)."""
        return os.path.realpath(path) == self.target

    def add(self, t: Tensor) -> Tuple[int, int]:
        """Append the tensor's bytes; returns ``(offset, length)``. A Tensor is written once."""
        hit = self.placed.get(id(t))
        if hit is not None:
            return hit[1], hit[2]
        pad = (-self.offset) % ALIGNMENT
        if pad:
            self.file.write(b"\0" * pad)
            self.offset += pad
        data = t.raw_view()
        self.file.write(data)
        placed = (t, self.offset, len(data))
        self.placed[id(t)] = placed
        self.offset += len(data)
        return placed[1], placed[2]

    def commit(self) -> None:
        self.file.close()
        os.chmod(self.tmp, 0o644)
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.file.close()
        if os.path.exists(self.tmp):
            os.unlink(self.tmp)


class SourceIndex:
    """The tensors of the ONNX file a model was imported from, loaded once on first use
    (``onnx.load(load_external_data=False)``), keyed ``("init", name)`` for initializers, and
    ``("tensor", tensor name)`` and ``("node", node name, attribute name)`` for tensor attributes
    (e.g. Constant values). Keys that name two different tensors are dropped."""

    _cache: Dict[Tuple[str, float], "SourceIndex"] = {}

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self._tensors: Optional[Dict[tuple, onnx.TensorProto]] = None

    @classmethod
    def for_model(cls, model) -> Optional["SourceIndex"]:
        """The index of ``model.source_path`` (set by the importer), or None."""
        path = getattr(model, "source_path", None)
        if not path or not os.path.isfile(path):
            return None
        return cls.get(path)

    @classmethod
    def get(cls, path: str) -> "SourceIndex":
        """One index per file and modification time (a rewritten file is read again)."""
        key = (os.path.realpath(path), os.path.getmtime(path))
        idx = cls._cache.get(key)
        if idx is None:
            if len(cls._cache) >= 4:
                cls._cache.clear()
            idx = cls._cache[key] = cls(path)
        return idx

    def tensors(self) -> Dict[tuple, onnx.TensorProto]:
        if self._tensors is None:
            proto = onnx.load(self.path, load_external_data=False)
            found: Dict[tuple, list] = {}
            self._index(proto.graph, found)
            # A key naming two tensors (e.g. one tensor name in two If branches) is unusable.
            self._tensors = {k: v[0] for k, v in found.items() if len(v) == 1}
        return self._tensors

    def _index(self, g: onnx.GraphProto, found: Dict[tuple, list]) -> None:
        for tp in g.initializer:
            if tp.data_location != onnx.TensorProto.EXTERNAL:
                found.setdefault(("init", tp.name), []).append(tp)
        for n in g.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR and \
                        a.t.data_location != onnx.TensorProto.EXTERNAL:
                    if a.t.name:
                        found.setdefault(("tensor", a.t.name), []).append(a.t)
                    if n.name:
                        found.setdefault(("node", n.name, a.name), []).append(a.t)
                for sub in list(a.graphs) + ([a.g] if a.HasField("g") else []):
                    self._index(sub, found)

    def find(self, t: Tensor, keys) -> Optional[tuple]:
        """The first of ``keys`` under which the source holds exactly ``t`` (same type, shape and
        bytes), or None.

        Keys are ``("init", initializer name)``, ``("tensor", tensor name)`` (a tensor attribute,
        e.g. a Constant's value) and ``("node", node name, attribute name)``.
        """
        if t.dtype == DataType.STRING:
            return None
        for key in keys:
            tp = self.tensors().get(key)
            if tp is None or tp.data_type != int(t.dtype) or tuple(tp.dims) != tuple(t.dims):
                continue
            if bytes(Tensor.from_proto(tp).raw_view()) == bytes(t.raw_view()):
                return key
        return None

    def tensor(self, key: tuple) -> Optional[Tensor]:
        """The source tensor under ``key`` as a :class:`Tensor`, or None."""
        tp = self.tensors().get(key)
        return None if tp is None else Tensor.from_proto(tp, os.path.dirname(self.path))
