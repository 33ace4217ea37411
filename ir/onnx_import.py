"""ONNX ModelProto -> passctl IR, lossless (names, metadata, subgraphs, functions, external data)."""

from __future__ import annotations

import json
import logging
import os
from typing import Dict, Optional, Tuple, Union

import onnx

from passctl.ir._core import Attr, AttrType, Function, Graph, Model, Node, Value, implicit_inputs
from passctl.ir._tensor import Tensor
from passctl.ir._types import type_from_proto
from passctl.ir.errors import ModelLoadError
from passctl.ir.onnx_reader import read_model_file
from passctl.ir.onnx_split import Split

logger = logging.getLogger(__name__)

PROVENANCE_KEY = "passctl.provenance"
# Graph.extra key: names (utf-8) of initializers that had a value_info entry in the source.
INITIALIZER_VALUE_INFO = "passctl.initializer_value_info"
# Raw initializer data at least this large is handed to the Tensor and cleared in the proto.
_CLEAR_THRESHOLD = 1024


def default_provenance(name: str, op_type: str, index: int) -> Tuple[str, ...]:
    """The provenance import gives a node: ``(name,)``, or ``(f"{op_type}@{index}",)`` if nameless."""
    return (name,) if name else (f"{op_type}@{index}",)


def load(path: Union[str, os.PathLike], check_data: bool = False) -> Model:
    """Read an ONNX file into a :class:`Model` without reading external weights.

    Embedded weights are kept as raw bytes; external data is memory-mapped on first use, never
    read at import. ``Model.base_dir`` is set to the file's folder.

    Args:
        path: the ``.onnx`` file.
        check_data: refuse a tensor whose data does not match its declared dims and type
            (:func:`check_tensor_data`; the CLI's loads, since ONNX Runtime refuses such a model);
            off by default, so the IR keeps even a broken tensor byte for byte.

    Returns:
        The model.

    Raises:
        ModelLoadError: the path is missing or not a file, the file is not ONNX or is truncated,
            an external-data file is missing, not a regular file, too short or outside the
            model's folder, or (``check_data``) a tensor lacks its declared data.
    """
    path = os.fspath(path)
    proto, raw = read_model_file(path)
    base_dir = os.path.dirname(os.path.abspath(path))
    try:
        model = _Importer(base_dir, consume=True, raw=raw, check_data=check_data).model(proto)
    except ValueError as e:  # external-data checks of Tensor.from_proto
        raise ModelLoadError(f"{path}: {e}") from None
    model.base_dir = base_dir
    model.source_path = os.path.abspath(path)  # lets the IR text form refer to unchanged weights
    return model


def from_onnx(proto: onnx.ModelProto, base_dir: Optional[str] = None) -> Model:
    """Convert an in-memory ``onnx.ModelProto`` (left unchanged) into a :class:`Model`.

    Args:
        proto: the model.
        base_dir: folder that external-data locations are relative to (default: the current one).

    Raises:
        ModelLoadError: an external-data location is unsafe or its file is missing.
    """
    try:
        model = _Importer(base_dir or ".", consume=False).model(proto)
    except ValueError as e:
        raise ModelLoadError(f"<ModelProto>: {e}") from None
    model.base_dir = os.path.abspath(base_dir) if base_dir else None
    return model


class _Scope:
    """Name -> Value for one graph, chained to the enclosing graph's scope."""

    def __init__(self, parent: Optional["_Scope"]):
        self.parent = parent
        self.names: Dict[str, Value] = {}
        self.undefined: Dict[str, Value] = parent.undefined if parent else {}

    def lookup(self, name: str) -> Value:
        s = self
        while s is not None:
            v = s.names.get(name)
            if v is not None:
                return v
            s = s.parent
        # A name nothing defines (invalid model): keep it as a dangling value so export writes it.
        v = self.undefined.get(name)
        if v is None:
            v = self.undefined[name] = Value(name)
        return v


class _Importer:
    def __init__(self, base_dir: str, consume: bool, raw: Optional[Split] = None,
                 check_data: bool = False):
        self.check_data = check_data
        self.base_dir = base_dir
        self.consume = consume
        # raw_data read apart from the proto by onnx_split, by tensor path (see Split).
        self.raw = raw.tensors if raw is not None else {}

    # -- model ----------------------------------------------------------------------------------
    def model(self, p: onnx.ModelProto) -> Model:
        opsets = {o.domain: o.version for o in p.opset_import}
        graph = self.graph(p.graph, None, ())
        functions = [self.function(f) for f in p.functions]
        m = Model(graph, opsets, ir_version=p.ir_version, producer_name=p.producer_name,
                  producer_version=p.producer_version, domain=p.domain,
                  model_version=p.model_version, doc_string=p.doc_string, functions=functions)
        m.metadata_props = {e.key: e.value for e in p.metadata_props}
        for field in ("training_info", "configuration"):
            items = getattr(p, field, ())
            if len(items):
                m.extra[field] = [x.SerializeToString() for x in items]
        return m

    def function(self, f: onnx.FunctionProto) -> Function:
        scope = _Scope(None)
        inputs = [self._new(scope, n) for n in f.input]
        g = Graph(name=f.name)
        for v in inputs:
            g.add_input(v)
        infos = {vi.name: vi for vi in f.value_info}
        self._nodes(g, f.node, scope)
        _sort_if_unordered(g, f"function '{f.domain}::{f.name}'")
        g.outputs.extend(scope.lookup(n) for n in f.output)
        self._apply_value_info(scope, infos)
        defaults = [self.attr(a, scope) for a in f.attribute_proto]
        fn = Function(f.domain, f.name, g, {o.domain: o.version for o in f.opset_import},
                      attributes=list(f.attribute), attribute_defaults=defaults,
                      overload=f.overload, doc_string=f.doc_string)
        fn.metadata_props = {e.key: e.value for e in f.metadata_props}
        return fn

    # -- graph ----------------------------------------------------------------------------------
    def graph(self, gp: onnx.GraphProto, parent: Optional[_Scope], path: Optional[tuple] = None
              ) -> Graph:
        """``path``: where the graph sits (see onnx_split.Split); None inside functions."""
        if not self.raw:
            path = None
        scope = _Scope(parent)
        g = Graph(name=gp.name, doc_string=gp.doc_string)
        g.metadata_props = {e.key: e.value for e in gp.metadata_props}
        for vi in gp.input:
            v = self._new(scope, vi.name)
            self._set_info(v, vi)
            g.add_input(v)
        infos = {vi.name: vi for vi in gp.value_info}
        for i, tp in enumerate(gp.initializer):
            tensor = self.tensor(tp, None if path is None else self.raw.get(path + ("init", i)),
                                 what="initializer")
            v = scope.names.get(tp.name)
            if v is None or v.graph is not g or v.const is not None:
                v = self._new(scope, tp.name)
                vi = infos.get(tp.name)
                if vi is not None:
                    self._set_info(v, vi)
            v.const = tensor
            g.add_initializer(v)
        self._nodes(g, gp.node, scope, path)
        _sort_if_unordered(g, f"graph '{gp.name}'")
        self._apply_value_info(scope, infos)
        for vi in gp.output:  # an output's declared type wins over a value_info entry
            v = scope.lookup(vi.name)
            if scope.names.get(vi.name) is v:  # not an outer value, whose own type is kept
                self._set_info(v, vi)
            g.outputs.append(v)
        # Which initializers had a value_info entry (export repeats it only for those, or for
        # initializers whose type says more than the tensor does).
        noted = [name.encode() for name in infos if name in g.initializers]
        if noted:
            g.extra[INITIALIZER_VALUE_INFO] = noted
        for field in ("sparse_initializer", "quantization_annotation"):
            items = getattr(gp, field)
            if len(items):
                g.extra[field] = [x.SerializeToString() for x in items]
        return g

    def _nodes(self, g: Graph, nodes, scope: _Scope, path: Optional[tuple] = None) -> None:
        # Create every output first, so a graph whose nodes are not in topological order (or a
        # subgraph reading a value defined later in the outer graph) still resolves.
        for np_ in nodes:
            for name in np_.output:
                if name and name not in scope.names:
                    scope.names[name] = Value(name)
        for index, np_ in enumerate(nodes):
            g.append(self.node(np_, index, scope, None if path is None else path + ("node", index)))

    def node(self, np_: onnx.NodeProto, index: int, scope: _Scope,
             path: Optional[tuple] = None) -> Node:
        inputs = [scope.lookup(n) if n else None for n in np_.input]
        outputs = []
        for name in np_.output:
            v = scope.names.get(name) if name else None
            if v is None or v.producer is not None or v.graph is not None:
                v = Value(name)  # omitted output, or a name defined twice (invalid model)
            outputs.append(v)
        attrs = [self.attr(a, scope, None if path is None else path + (i,))
                 for i, a in enumerate(np_.attribute)]
        meta = {e.key: e.value for e in np_.metadata_props}
        prov = default_provenance(np_.name, np_.op_type, index)
        if PROVENANCE_KEY in meta:
            try:
                loaded = json.loads(meta[PROVENANCE_KEY])
                if isinstance(loaded, list) and all(isinstance(x, str) for x in loaded):
                    prov = tuple(loaded)
                    del meta[PROVENANCE_KEY]
            except json.JSONDecodeError:
                logger.warning("node '%s': unreadable %s metadata kept as is", np_.name,
                               PROVENANCE_KEY)
        return Node(np_.domain, np_.op_type, inputs, attrs, outputs, name=np_.name,
                    overload=np_.overload, doc_string=np_.doc_string, provenance=prov,
                    metadata_props=meta)

    def attr(self, a: onnx.AttributeProto, scope: _Scope, path: Optional[tuple] = None) -> Attr:
        t = AttrType(a.type)
        if a.ref_attr_name:
            return Attr(a.name, t, None, a.doc_string, a.ref_attr_name)
        if t == AttrType.FLOAT:
            value = a.f
        elif t == AttrType.INT:
            value = a.i
        elif t == AttrType.STRING:
            value = _str(a.s)
        elif t == AttrType.TENSOR:
            value = self.tensor(a.t, None if path is None else self.raw.get(path))
        elif t == AttrType.GRAPH:
            value = self.graph(a.g, scope, path)
        elif t == AttrType.SPARSE_TENSOR:
            value = _copy(a.sparse_tensor)
        elif t == AttrType.TYPE_PROTO:
            value = type_from_proto(a.tp)
        elif t == AttrType.FLOATS:
            value = tuple(a.floats)
        elif t == AttrType.INTS:
            value = tuple(a.ints)
        elif t == AttrType.STRINGS:
            value = tuple(_str(s) for s in a.strings)
        elif t == AttrType.TENSORS:
            value = tuple(self.tensor(x) for x in a.tensors)
        elif t == AttrType.GRAPHS:
            value = tuple(self.graph(x, scope, None if path is None else path + (k,))
                          for k, x in enumerate(a.graphs))
        elif t == AttrType.SPARSE_TENSORS:
            value = tuple(_copy(x) for x in a.sparse_tensors)
        elif t == AttrType.TYPE_PROTOS:
            value = tuple(type_from_proto(x) for x in a.type_protos)
        else:
            value = None
        return Attr(a.name, t, value, a.doc_string)

    def tensor(self, tp: onnx.TensorProto, raw=None, what: str = "tensor") -> Tensor:
        if self.check_data:
            check_tensor_data(tp, raw, what)
        if raw is not None:  # raw_data read apart from the proto (see onnx_split)
            if tp.data_location != onnx.TensorProto.EXTERNAL and not tp.HasField("segment"):
                meta = {e.key: e.value for e in tp.metadata_props}
                return Tensor(raw, dtype=tp.data_type, dims=tuple(tp.dims), name=tp.name,
                              doc_string=tp.doc_string, metadata_props=meta)
            tp.raw_data = raw  # an unusual tensor: let Tensor.from_proto decide
        t = Tensor.from_proto(tp, self.base_dir)
        if tp.data_location == onnx.TensorProto.EXTERNAL:
            _check_external_size(t)
        elif self.consume and tp.HasField("raw_data") and len(tp.raw_data) >= _CLEAR_THRESHOLD:
            tp.ClearField("raw_data")  # the Tensor holds the bytes now; do not keep them twice
        elif not self.consume and t.source_proto is tp:
            t = Tensor(_copy(tp), dtype=t.dtype, dims=t.dims, name=t.name,
                       doc_string=t.doc_string, metadata_props=t.metadata_props)
        return t

    # -- value info -----------------------------------------------------------------------------
    def _new(self, scope: _Scope, name: str) -> Value:
        v = Value(name)
        if name:
            scope.names[name] = v
        return v

    @staticmethod
    def _set_info(v: Value, vi: onnx.ValueInfoProto) -> None:
        if vi.HasField("type"):
            t = type_from_proto(vi.type)
            if t is not None or v.type is None:  # an empty ``type {}`` says nothing
                v.type = t
        if vi.doc_string:
            v.doc_string = vi.doc_string
        if len(vi.metadata_props):
            v.metadata_props = {e.key: e.value for e in vi.metadata_props}

    def _apply_value_info(self, scope: _Scope, infos: Dict[str, onnx.ValueInfoProto]) -> None:
        for name, vi in infos.items():
            v = scope.names.get(name)
            if v is None:  # stale entry; keeping it could clash with a value made later
                logger.debug("value_info '%s' names no value of its graph; dropped", name)
                continue
            if v.const is not None and v.graph is not None and name in v.graph.initializers:
                continue  # set before add_initializer
            self._set_info(v, vi)


def _sort_if_unordered(g: Graph, where: str) -> None:
    """Sort ``g``'s nodes topologically if a node reads a value of ``g`` produced after it.

    ONNX requires topological order, but ONNX Runtime sorts the nodes itself and runs such
    models, so import sorts them too (the exported model is then in order). Subgraphs were
    sorted when they were imported; their reads of ``g``'s values count as reads of the node
    holding them.

    Raises:
        ValueError: the nodes form a cycle (no order exists); the message names the nodes on it.
    """
    nodes = list(g)
    local = {o: n for n in nodes for o in n.outputs}
    done = set()
    in_order = True
    for n in nodes:
        for v in list(n.inputs) + implicit_inputs(n):
            if v is not None and v in local and v not in done:
                in_order = False
                break
        if not in_order:
            break
        done.update(n.outputs)
    if in_order:
        return
    import networkx as nx

    dg = nx.DiGraph()
    dg.add_nodes_from(nodes)
    for n in nodes:
        for v in list(n.inputs) + implicit_inputs(n):
            if v is not None and v in local:
                dg.add_edge(local[v], n)
    try:
        cycle = nx.find_cycle(dg)
    except nx.NetworkXNoCycle:
        g.sort(recursive=False)
        logger.info("%s: the nodes were not in topological order (ONNX Runtime accepts that); "
                    "sorted them", where)
        return
    names = [_node_label(a, nodes) for a, _ in cycle] + [_node_label(cycle[0][0], nodes)]
    raise ValueError(f"{where} has a cycle through nodes {' -> '.join(names)} (each reads an "
                     "output of the one before), so no node order can run it; fix the exporter "
                     "or edit the model to break the cycle")


def _node_label(n: Node, nodes) -> str:
    """A node's name, or ``OpType@index`` for a nameless node (as in provenance)."""
    return n.name or f"{n.op_type}@{nodes.index(n)}"


def _str(s: bytes):
    try:
        return s.decode("utf-8")
    except UnicodeDecodeError:
        return s


def _copy(msg):
    out = type(msg)()
    out.CopyFrom(msg)
    return out


#: Elements stored per entry of each typed data field (``float_data`` holds a complex64 as 2).
_TYPED_FIELDS = {"float_data": {onnx.TensorProto.FLOAT: 1, onnx.TensorProto.COMPLEX64: 2},
                 "double_data": {onnx.TensorProto.DOUBLE: 1, onnx.TensorProto.COMPLEX128: 2},
                 "int64_data": {onnx.TensorProto.INT64: 1},
                 "uint64_data": {onnx.TensorProto.UINT32: 1, onnx.TensorProto.UINT64: 1}}
_PACKED_4BIT = {getattr(onnx.TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1")
                if hasattr(onnx.TensorProto, n)}


def check_tensor_data(tp: onnx.TensorProto, raw=None, what: str = "tensor") -> None:
    """Refuse a tensor whose data does not match its declared dims and type (ONNX Runtime and
    ``onnx.checker`` refuse such a model too).

    ``raw_data`` (or ``raw``, the bytes read apart from the proto) must hold exactly
    ``prod(dims)`` elements of the type (4-bit types packed two per byte); a typed field
    (``float_data``, ``int32_data``, ``int64_data``, ``double_data``, ``uint64_data``,
    ``string_data``) exactly that many entries (two per complex element; ``int32_data`` of a 4-bit
    type one per byte pair); a tensor of elements must have data. External and segmented tensors
    are checked elsewhere (:func:`_check_external_size`).

    Raises:
        ValueError: one line naming the tensor (``what``: ``initializer``, ``tensor``), its
            declared dims and type and the data it has.
    """
    if tp.data_location == onnx.TensorProto.EXTERNAL or tp.HasField("segment"):
        return
    if any(d < 0 for d in tp.dims):
        raise ValueError(f"{what} '{tp.name}' declares negative dims {list(tp.dims)}; export the "
                         "model again")
    n = 1
    for d in tp.dims:
        n *= int(d)
    try:
        type_name = onnx.TensorProto.DataType.Name(tp.data_type)
    except ValueError:
        return  # an unknown data type: Tensor.from_proto says so
    declared = f"dims {list(tp.dims)} of {type_name.lower()}"
    packed = tp.data_type in _PACKED_4BIT
    raw_len = len(raw) if raw is not None else (len(tp.raw_data) if tp.HasField("raw_data")
                                               else None)
    if tp.data_type == onnx.TensorProto.STRING:
        have = len(tp.string_data)
        if have != n:
            raise ValueError(f"{what} '{tp.name}' declares {declared} ({n} strings) but has {have} "
                             "in string_data; the file is corrupt: export the model again")
        return
    if raw_len is not None:
        try:
            size = onnx.helper.tensor_dtype_to_np_dtype(tp.data_type).itemsize
        except (KeyError, TypeError, ValueError):
            return
        need = (n + 1) // 2 if packed else n * size
        if raw_len != need:
            raise ValueError(f"{what} '{tp.name}' declares {declared} ({need} bytes) but has "
                             f"{raw_len} bytes of raw_data; the file is corrupt or was written "
                             "wrongly: export the model again")
        return
    field = next((f for f, types in _TYPED_FIELDS.items() if tp.data_type in types), "int32_data")
    per = _TYPED_FIELDS.get(field, {}).get(tp.data_type, 1)
    need = ((n + 1) // 2 if packed else n) if field == "int32_data" else n * per
    have = len(getattr(tp, field))
    if have != need:
        where = f"{have} entries in {field}" if have or n == 0 else "no data"
        raise ValueError(f"{what} '{tp.name}' declares {declared} ({need} entries of {field}) but "
                         f"has {where}; the file is corrupt or was written wrongly: export the "
                         "model again")


def _check_external_size(t: Tensor) -> None:
    ext = t.external
    need = ext.offset + (ext.length if ext.length is not None else t.nbytes)
    have = os.path.getsize(ext.path)
    if have < need:
        raise ValueError(f"tensor '{t.name}': external-data file '{ext.location}' has {have} bytes "
                         f"but the tensor needs bytes up to {need} (truncated file?)")
