"""passctl IR -> ONNX protos: models, graphs, nodes, attributes, tensors, value_info (ProtoBuilder)."""

from __future__ import annotations

import json
from typing import Dict, List, Optional

import onnx

from passctl.ir._core import Attr, AttrType, Function, Graph, Model, Node, Value
from passctl.ir._tensor import Tensor
from passctl.ir._types import DataType, Shape, TensorType, type_to_proto
from passctl.ir.onnx_import import INITIALIZER_VALUE_INFO, PROVENANCE_KEY, default_provenance
from passctl.ir.onnx_stream import Chunk, field_chunks, tensor_chunks

# Smaller raw data is encoded with the rest of the proto instead of being streamed.
_STREAM_MIN_BYTES = 256


class ProtoBuilder:
    """Builds ONNX protos from the IR; one builder per export, so nameless values get one name.

    Names, metadata, doc strings, value_info and unmodeled fields are written back as imported;
    node provenance goes to ``metadata_props["passctl.provenance"]`` (a JSON list) only when it
    differs from what import would give the node again.

    Args:
        stream_main: leave the main graph's nodes and initializers out of :meth:`model` (``save``
            streams them after it, see :meth:`graph_chunks`).
        external: ``id(tensor) -> (offset, length)`` of tensors written to the external-data file
            ``location`` (they get ``data_location = EXTERNAL`` entries instead of raw_data).
        location: that file, relative to the model's folder.
    """

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
