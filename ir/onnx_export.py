"""passctl IR -> ONNX: ``to_onnx`` (data embedded) and ``save`` (temp file + rename, external data)."""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Callable, Dict, Iterator, List, Optional, Tuple, Union

import onnx

from passctl.ir._core import AttrType, Graph, Model, Value
from passctl.ir._tensor import ExternalLocation, Tensor
from passctl.ir._types import DataType
from passctl.ir.errors import UserError
from passctl.ir.onnx_protos import ProtoBuilder
from passctl.ir.onnx_stream import raw_nbytes, write_graph_tail, write_raw

logger = logging.getLogger(__name__)

# Above this many weight bytes, save() writes external data by default (protobuf's limit is 2 GiB).
EXTERNAL_DEFAULT_BYTES = int(1.8e9)


def to_onnx(model: Model, keep_external: bool = False) -> onnx.ModelProto:
    """Convert ``model`` into an ``onnx.ModelProto`` with every weight embedded as ``raw_data``.

    External (memory-mapped) weights are read into the proto. Tensors that came from typed
    TensorProto fields are copied back unchanged.

    Args:
        keep_external: instead, write each tensor memory-mapped from a file in the model's folder
            (``model.base_dir``: the source model's external data) as the external reference it
            was read from (location, offset, length, checksum), reading none of its bytes: a
            proto for tools that need the graph but not the weights (onnx's version converter),
            which ``from_onnx(proto, model.base_dir)`` maps again. Other tensors (in memory,
            spilled) are embedded.

    Raises:
        OSError: an external-data file of the model cannot be read.
    """
    if not keep_external or not model.base_dir:
        return ProtoBuilder().model(model)
    base = os.path.realpath(model.base_dir)
    plan: Dict[int, Tuple[int, int]] = {}
    where: Dict[int, str] = {}
    for t in _all_tensors(model):
        ext = t.external
        if ext is None or t.source_proto is not None or id(t) in plan:
            continue
        if os.path.realpath(os.path.join(base, ext.location)) != os.path.realpath(ext.path):
            continue  # not a file of the model's folder (a spilled tensor): embedded
        plan[id(t)] = (ext.offset, ext.length if ext.length is not None else t.nbytes)
        where[id(t)] = ext.location
    marker = "\0passctl-location\0"
    proto = ProtoBuilder(external=plan, location=marker).model(model)
    locations = {t.name: where[id(t)] for t in _all_tensors(model) if id(t) in where}
    for tp in _tensor_protos(proto.graph):
        for entry in tp.external_data:
            if entry.key == "location" and entry.value == marker:
                entry.value = locations[tp.name]
    return proto


def _tensor_protos(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _tensor_protos(g)


def save(model: Model, path: Union[str, os.PathLike], external_data: Optional[bool] = None, size_threshold: int = 1024,
         location: Optional[str] = None) -> None:
    """Write ``model`` to ``path`` atomically (a temp file in the same folder, then a rename).

    Embedded weights are streamed after a skeleton proto (no second copy of the weights in
    memory); external data is copied from the source files in chunks.

    Args:
        model: the model; it is not changed, except that tensors memory-mapping a data file that
            this call replaces are pointed at the new file (same bytes) or read into memory.
        path: the ``.onnx`` file to write.
        external_data: True: initializers of at least ``size_threshold`` bytes go to a data file;
            False: everything is embedded; None: external when the weights exceed ~1.8 GB or the
            model has external data already.
        size_threshold: smallest tensor (bytes) stored externally.
        location: data file name relative to the model's folder (default ``<file name>.data``).

    Raises:
        UserError: embedded weights of 2 GiB or more (protobuf's limit), or a ``location`` that
            leaves the model's folder.
        OSError: the folder is not writable or a source data file cannot be read.
    """
    path = os.path.abspath(os.fspath(path))
    tensors = list(_all_tensors(model))
    total = sum(raw_nbytes(t) for t in tensors if t.dtype != DataType.STRING)
    if external_data is None:
        external_data = total > EXTERNAL_DEFAULT_BYTES or any(
            t.external is not None for t in tensors)
    if external_data:
        location = location or os.path.basename(path) + ".data"
        if os.path.isabs(location) or ".." in location.replace("\\", "/").split("/"):
            raise UserError(f"{path}: external-data location '{location}' must be a file name "
                            "relative to the model's folder (no '..', not absolute)")
        _save_external(model, path, list(_initializers(model.graph)), size_threshold, location)
        return
    if total >= 2 ** 31:
        raise UserError(f"{path}: {total} bytes of weights cannot be embedded in one protobuf "
                        "(2 GiB limit); save with external_data=True")
    exporter = ProtoBuilder(stream_main=True)
    skeleton = exporter.model(model)
    tail = exporter.graph_chunks(model.graph)

    def write(f):
        f.write(skeleton.SerializeToString())
        write_graph_tail(f, tail)
    _write_atomic(path, write)


def _save_external(model: Model, path: str, inits: List[Value], threshold: int, location: str):
    folder = os.path.dirname(path)
    data_path = os.path.join(folder, location)
    os.makedirs(os.path.dirname(data_path), exist_ok=True)
    plan: Dict[int, Tuple[int, int]] = {}
    order: List[Tensor] = []
    end = 0
    for v in inits:
        t = v.const
        if id(t) in plan or t.source_proto is not None or t.dtype == DataType.STRING \
                or t.nbytes < threshold:
            continue
        start = (end + 63) // 64 * 64  # aligned starts, so a runtime can map them directly
        length = raw_nbytes(t)
        plan[id(t)] = (start, length)
        order.append(t)
        end = start + length
    proto = ProtoBuilder(external=plan, location=location).model(model)
    real_data = os.path.realpath(data_path)
    # Tensors that memory-map the data file about to be replaced (e.g. saving over the source).
    mapped = [t for t in _all_tensors(model)
              if t.external is not None and os.path.realpath(t.external.path) == real_data]
    if order:
        def write_data(f):
            for t in order:
                f.seek(plan[id(t)][0])
                write_raw(f, t)
        _write_atomic(data_path, write_data, before_rename=lambda: _detach(mapped, plan))
        for t in order:
            if t in mapped:
                start, length = plan[id(t)]
                t._data = ExternalLocation(real_data, location, start, length, t.external.checksum)
                t._array = None
    _write_atomic(path, lambda f: f.write(proto.SerializeToString()))


def _detach(mapped: List[Tensor], plan: Dict[int, Tuple[int, int]]) -> None:
    """Read into memory the tensors that map a file about to be replaced and are not rewritten."""
    for t in mapped:
        if id(t) not in plan:
            t._data, t._array = t.tobytes(), None


def _write_atomic(path: str, write: Callable, before_rename: Optional[Callable] = None) -> None:
    """Call ``write(f)`` on a temp file next to ``path``, then rename it onto ``path``; on error the
    temp file is removed and ``path`` is untouched."""
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.truncate()  # a trailing hole (skipped with seek) still counts as file length
        if before_rename is not None:
            before_rename()
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# -- model walks --------------------------------------------------------------------------------
def _initializers(graph: Graph) -> Iterator[Value]:
    yield from graph.initializers.values()
    for n in graph.all_nodes():
        for sub in n.subgraphs():
            yield from sub.initializers.values()


def _all_tensors(model: Model) -> Iterator[Tensor]:
    for g in model.graphs():
        for v in g.initializers.values():
            yield v.const
        for n in g:
            for a in n.attributes.values():
                if a.type == AttrType.TENSOR and a.value is not None:
                    yield a.value
                elif a.type == AttrType.TENSORS and a.value:
                    yield from a.value
