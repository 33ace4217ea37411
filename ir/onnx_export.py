"""passctl IR -> ONNX: ``to_onnx`` (data embedded) and ``save`` (temp file + rename, external data)."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Callable, Dict, Iterator, List, Optional, Tuple, Union

import onnx

from passctl.ir._core import Attr, AttrType, Function, Graph, Model, Node, Value
from passctl.ir._tensor import ExternalLocation, Tensor
from passctl.ir._types import DataType, Shape, TensorType, type_to_proto
from passctl.ir.errors import UserError
from passctl.ir.onnx_import import INITIALIZER_VALUE_INFO, PROVENANCE_KEY, default_provenance
from passctl.ir.onnx_stream import (Chunk, field_chunks, raw_nbytes, tensor_chunks,
                                    write_graph_tail, write_raw)

logger = logging.getLogger(__name__)

# Above this many weight bytes, save() writes external data by default (protobuf's limit is 2 GiB).
EXTERNAL_DEFAULT_BYTES = int(1.8e9)
# Smaller raw data is encoded with the rest of the proto instead of being streamed.
_STREAM_MIN_BYTES = 256


def to_onnx(model: Model) -> onnx.ModelProto:
    """Convert ``model`` into an ``onnx.ModelProto`` with every weight embedded as ``raw_data``.

    External (memory-mapped) weights are read into the proto. Tensors that came from typed
    TensorProto fields are copied back unchanged.

    Raises:
        OSError: an external-data file of the model cannot be read.
    """
    return _Exporter().model(model)


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
    exporter = _Exporter(stream_main=True)
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
    proto = _Exporter(external=plan, location=location).model(model)
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
def _graphs(model: Model) -> Iterator[Graph]:
    stack = [model.graph] + [f.graph for f in model.functions.values()]
    while stack:
        g = stack.pop()
        yield g
        for n in g:
            stack.extend(n.subgraphs())


def _initializers(graph: Graph) -> Iterator[Value]:
    yield from graph.initializers.values()
    for n in graph.all_nodes():
        for sub in n.subgraphs():
            yield from sub.initializers.values()


def _all_tensors(model: Model) -> Iterator[Tensor]:
    for g in _graphs(model):
        for v in g.initializers.values():
            yield v.const
        for n in g:
            for a in n.attributes.values():
                if a.type == AttrType.TENSOR and a.value is not None:
                    yield a.value
                elif a.type == AttrType.TENSORS and a.value:
                    yield from a.value


# -- proto building -----------------------------------------------------------------------------
class _Exporter:
    """Builds the protos. ``stream_main``: leave the main graph's nodes and initializers out
    (save() streams them, see :meth:`graph_chunks`); ``external``: id(tensor) -> (offset,
    length) in the data file ``location``."""

    def __init__(self, stream_main: bool = False, external: Optional[Dict] = None,
                 location: str = ""):
        self.stream_main = stream_main
        self._stream_memo: Dict[int, bool] = {}
        self.external = external or {}
        self.location = location
        self.names: Dict[Value, str] = {}

    def model(self, m: Model) -> onnx.ModelProto:
        p = onnx.ModelProto()
        p.ir_version = m.ir_version
        for domain, version in m.opset_imports.items():
            p.opset_import.add(domain=domain, version=version)
        for field in ("producer_name", "producer_version", "domain", "model_version", "doc_string"):
            value = getattr(m, field)
            if value:  # proto2 presence: leave defaults unset, as onnx.helper does
                setattr(p, field, value)
        _meta(p.metadata_props, m.metadata_props)
        self.graph(m.graph, p.graph, omit_body=self.stream_main)
        for f in m.functions.values():
            self.function(f, p.functions.add())
        _extra(p, m.extra)
        return p

    def function(self, f: Function, p: onnx.FunctionProto) -> None:
        p.name = f.name
        for field in ("domain", "overload", "doc_string"):
            if getattr(f, field):
                setattr(p, field, getattr(f, field))
        g = f.graph
        p.input.extend(self.name(v) for v in g.inputs)
        p.output.extend(self.name(v) for v in g.outputs)
        p.attribute.extend(f.attributes)
        for a in f.attribute_defaults:
            self.attr(a, p.attribute_proto.add())
        for i, n in enumerate(g):
            self.node(n, i, p.node.add())
        for domain, version in f.opset_imports.items():
            p.opset_import.add(domain=domain, version=version)
        typed = list(g.inputs) + [o for n in g for o in n.outputs]
        for v in typed:
            if v.name and (v.type is not None or v.doc_string or v.metadata_props):
                self.value_info(v, p.value_info.add())
        _meta(p.metadata_props, f.metadata_props)

    def graph(self, g: Graph, p: onnx.GraphProto, omit_body: bool = False) -> None:
        """Fill ``p`` from ``g``; ``omit_body`` leaves out nodes and initializers (streamed)."""
        if g.name:
            p.name = g.name
        if g.doc_string:
            p.doc_string = g.doc_string
        for v in g.inputs:
            self.value_info(v, p.input.add())
        if not omit_body:
            for v in g.initializers.values():
                self.tensor(v.const, p.initializer.add(), v.name)
            for i, n in enumerate(g):
                self.node(n, i, p.node.add())
        outputs = set()
        for v in g.outputs:
            self.value_info(v, p.output.add())
            outputs.add(v)
        skip = outputs | set(g.inputs)
        for n in g:
            for v in n.outputs:
                if v not in skip and v.name and (v.type is not None or v.doc_string
                                                 or v.metadata_props):
                    self.value_info(v, p.value_info.add())
        noted = {b.decode() for b in g.extra.get(INITIALIZER_VALUE_INFO, ())}
        for v in g.initializers.values():
            if v not in skip and (v.name in noted or v.doc_string or v.metadata_props
                                  or v.type != TensorType(v.const.dtype, Shape(v.const.dims))):
                self.value_info(v, p.value_info.add())
        _meta(p.metadata_props, g.metadata_props)
        _extra(p, g.extra)

    def graph_chunks(self, g: Graph, skeleton: bool = False) -> List[Chunk]:
        """The graph's nodes and initializers as GraphProto fields, in chunks: encoded bytes, and
        Tensors for large raw data (initializers, tensor attributes such as Constant values, also
        inside subgraphs), written from where they are without a second copy in memory.

        Args:
            g: the graph.
            skeleton: also encode its other fields first (for a subgraph; the main graph's are in
                the ModelProto skeleton).
        """
        body: List[Chunk] = []
        batch = onnx.GraphProto()  # runs of plain nodes / initializers, encoded in one go
        if skeleton:
            self.graph(g, batch, omit_body=True)

        def flush():
            if batch.ByteSize():
                body.append(batch.SerializeToString())
                batch.Clear()

        for i, n in enumerate(g):
            if self._streams(n):
                flush()
                body.extend(field_chunks(1, self._node_chunks(n, i)))
            else:
                self.node(n, i, batch.node.add())
        flush()
        for v in g.initializers.values():
            if _streamable(v.const):
                flush()
                body.extend(field_chunks(5, self._tensor_chunks(v.const, v.name)))
            else:
                self.tensor(v.const, batch.initializer.add(), v.name)
        flush()
        return body

    def _streams(self, n: Node) -> bool:
        """Whether the node holds raw data to stream (in a tensor attribute or a subgraph)."""
        for a in n.attributes.values():
            if a.ref_attr_name:
                continue
            if a.type == AttrType.TENSOR and _streamable(a.value):
                return True
            if any(self._graph_streams(sub) for sub in a.graphs()):
                return True
        return False

    def _graph_streams(self, g: Graph) -> bool:
        got = self._stream_memo.get(id(g))
        if got is None:
            got = self._stream_memo[id(g)] = any(
                _streamable(v.const) for v in g.initializers.values()) or any(
                self._streams(n) for n in g)
        return got

    def _node_chunks(self, n: Node, index: int) -> List[Chunk]:
        p = onnx.NodeProto()
        self.node(n, index, p, attributes=False)
        chunks: List[Chunk] = [p.SerializeToString()]
        for a in n.attributes.values():
            ap = onnx.AttributeProto()
            streamed_graphs = not a.ref_attr_name and any(
                self._graph_streams(sub) for sub in a.graphs())
            if a.type == AttrType.TENSOR and not a.ref_attr_name and _streamable(a.value) \
                    or streamed_graphs:
                ap.name, ap.type = a.name, int(a.type)
                if a.doc_string:
                    ap.doc_string = a.doc_string
                body = [ap.SerializeToString()]
                if a.type == AttrType.TENSOR:
                    body += field_chunks(5, self._tensor_chunks(a.value))
                else:  # GRAPH (field g = 6) or GRAPHS (field graphs = 11)
                    number = 6 if a.type == AttrType.GRAPH else 11
                    for sub in a.graphs():
                        body += field_chunks(number, self.graph_chunks(sub, skeleton=True))
            else:
                self.attr(a, ap)
                body = [ap.SerializeToString()]
            chunks += field_chunks(5, body)
        return chunks

    def _tensor_chunks(self, t: Tensor, name: Optional[str] = None) -> List[Chunk]:
        p = onnx.TensorProto()
        if not _streamable(t):
            self.tensor(t, p, name)
            return [p.SerializeToString()]
        _tensor_fields(t, p, t.name if name is None else name)
        return tensor_chunks(p.SerializeToString(), t)

    def node(self, n: Node, index: int, p: onnx.NodeProto, attributes: bool = True) -> None:
        p.input.extend("" if v is None else self.name(v) for v in n.inputs)
        p.output.extend(self.name(v) for v in n.outputs)
        if n.name:
            p.name = n.name
        p.op_type = n.op_type
        if n.domain:
            p.domain = n.domain
        if n.overload:
            p.overload = n.overload
        if attributes:
            for a in n.attributes.values():
                self.attr(a, p.attribute.add())
        if n.doc_string:
            p.doc_string = n.doc_string
        meta = dict(n.metadata_props)
        if n.provenance and n.provenance not in ((n.name,), default_provenance(
                n.name, n.op_type, index)):
            meta[PROVENANCE_KEY] = json.dumps(list(n.provenance))
        _meta(p.metadata_props, meta)

    def attr(self, a: Attr, p: onnx.AttributeProto) -> None:
        p.name = a.name
        p.type = int(a.type)
        if a.doc_string:
            p.doc_string = a.doc_string
        if a.ref_attr_name:
            p.ref_attr_name = a.ref_attr_name
            return
        t, v = a.type, a.value
        if t == AttrType.FLOAT:
            p.f = v
        elif t == AttrType.INT:
            p.i = v
        elif t == AttrType.STRING:
            p.s = _bytes(v)
        elif t == AttrType.TENSOR:
            self.tensor(v, p.t)
        elif t == AttrType.GRAPH:
            self.graph(v, p.g)
        elif t == AttrType.SPARSE_TENSOR:
            p.sparse_tensor.CopyFrom(v)
        elif t == AttrType.TYPE_PROTO:
            p.tp.SetInParent()
            type_to_proto(v, p.tp)
        elif t == AttrType.FLOATS:
            p.floats.extend(v)
        elif t == AttrType.INTS:
            p.ints.extend(v)
        elif t == AttrType.STRINGS:
            p.strings.extend(_bytes(s) for s in v)
        elif t == AttrType.TENSORS:
            for x in v:
                self.tensor(x, p.tensors.add())
        elif t == AttrType.GRAPHS:
            for x in v:
                self.graph(x, p.graphs.add())
        elif t == AttrType.SPARSE_TENSORS:
            for x in v:
                p.sparse_tensors.add().CopyFrom(x)
        elif t == AttrType.TYPE_PROTOS:
            for x in v:
                type_to_proto(x, p.type_protos.add())

    def tensor(self, t: Tensor, p: onnx.TensorProto, name: Optional[str] = None) -> None:
        src = t.source_proto
        if src is not None:
            p.CopyFrom(src)
            if name is not None and p.name != name:
                p.name = name
            return
        _tensor_fields(t, p, t.name if name is None else name)
        if t.dtype == DataType.STRING:  # no raw form: string_data
            p.string_data.extend(_bytes(x) for x in t.numpy().reshape(-1))
            return
        where = self.external.get(id(t))
        if where is not None:
            p.data_location = onnx.TensorProto.EXTERNAL
            entries = [("location", self.location), ("offset", str(where[0])),
                       ("length", str(where[1]))]
            if t.external is not None and t.external.checksum:
                entries.append(("checksum", t.external.checksum))
            for k, val in entries:
                p.external_data.add(key=k, value=val)
        else:
            p.raw_data = _raw_bytes(t)

    def value_info(self, v: Value, p: onnx.ValueInfoProto) -> None:
        p.name = self.name(v)
        if v.type is not None:
            type_to_proto(v.type, p.type)
        if v.doc_string:
            p.doc_string = v.doc_string
        _meta(p.metadata_props, v.metadata_props)

    def name(self, v: Value) -> str:
        if v.name:
            return v.name
        got = self.names.get(v)
        if got is None:
            if v.producer is not None and not v._uses and not v.is_graph_output():
                return ""  # an omitted optional output
            got = self.names[v] = f"_passctl_unnamed_{len(self.names)}"
        return got


def _streamable(t: Optional[Tensor]) -> bool:
    """A tensor whose raw bytes save() writes straight from where they are held."""
    return (t is not None and t.source_proto is None and t.dtype != DataType.STRING
            and t.nbytes >= _STREAM_MIN_BYTES)


def _tensor_fields(t: Tensor, p: onnx.TensorProto, name: str) -> None:
    p.dims.extend(t.dims)
    p.data_type = int(t.dtype)
    if name:
        p.name = name
    if t.doc_string:
        p.doc_string = t.doc_string
    _meta(p.metadata_props, t.metadata_props)


def _raw_bytes(t: Tensor) -> bytes:
    view = t.raw_view()
    if isinstance(view.obj, bytes) and len(view.obj) == view.nbytes:
        return view.obj
    return bytes(view)


def _bytes(s) -> bytes:
    return s.encode("utf-8") if isinstance(s, str) else bytes(s)


def _extra(p, extra: Dict[str, List[bytes]]) -> None:
    """Write back the serialized repeated fields the IR keeps in ``extra`` (other keys, such as
    INITIALIZER_VALUE_INFO, are not proto fields)."""
    for field, items in extra.items():
        if field not in p.DESCRIPTOR.fields_by_name:
            continue
        target = getattr(p, field)
        for b in items:
            target.add().ParseFromString(b)


def _meta(field, props: Dict[str, str]) -> None:
    for k, v in props.items():
        field.add(key=k, value=v)
