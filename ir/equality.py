"""Structural equality of models and graphs, modulo value names (for golden/round-trip tests)."""

from __future__ import annotations

from typing import Dict, List, Optional, Union

import numpy as np

from passctl.ir._core import Attr, AttrType, Graph, Model, Node, Value
from passctl.ir._tensor import Tensor
from passctl.ir._types import DataType


class _Diff(Exception):
    pass


def structural_diff(a: Union[Model, Graph], b: Union[Model, Graph],
                    node_names: bool = True) -> Optional[str]:
    """Compare two models (or two graphs) structurally; value names do not matter.

    Nodes are compared in order. Values are matched by position (graph inputs, node outputs) and
    then by def-use: a node input must be the value matched to the other side's input. Initializers
    that are not graph inputs are matched at their first use (unused ones in order). Compared:
    opsets, model fields and metadata, functions (by domain/name/overload), graph inputs/outputs,
    types, doc strings and metadata everywhere, node op/domain/overload, inputs, attributes
    (float attributes as float32 bits, tensor data byte for byte, subgraphs recursively),
    provenance, and initializer data. Not compared: value names and tensor names, and node and
    graph names when ``node_names`` is False.

    Args:
        a, b: two :class:`Model` or two :class:`Graph`.
        node_names: also compare node names and graph names (the text form keeps them).

    Returns:
        None when equal, else a one-line description of the first difference, e.g.
        ``"graph 'main': node 12 (Conv vs Relu)"``.
    """
    try:
        cmp = _Comparer(node_names)
        if isinstance(a, Model) and isinstance(b, Model):
            cmp.model(a, b)
        elif isinstance(a, Graph) and isinstance(b, Graph):
            cmp.graph(a, b, f"graph '{a.name}'")
        else:
            return f"cannot compare {type(a).__name__} with {type(b).__name__}"
    except _Diff as d:
        return str(d)
    return None


def assert_structurally_equal(a: Union[Model, Graph], b: Union[Model, Graph],
                              node_names: bool = True) -> None:
    """Raise ``AssertionError`` with :func:`structural_diff`'s description when ``a`` and ``b``
    differ."""
    diff = structural_diff(a, b, node_names=node_names)
    if diff is not None:
        raise AssertionError(f"models differ: {diff}")


def _check(cond: bool, where: str, what: str, x, y) -> None:
    if not cond:
        raise _Diff(f"{where}: {what} ({_short(x)} vs {_short(y)})")


def _short(x) -> str:
    s = repr(x)
    return s if len(s) <= 60 else s[:57] + "..."


class _Comparer:
    def __init__(self, node_names: bool):
        self.node_names = node_names
        self.a2b: Dict[Value, Value] = {}
        self.b2a: Dict[Value, Value] = {}
        # Initializers (not graph inputs) not yet matched, per graph.
        self.pending: Dict[Graph, List[Value]] = {}

    # -- model ----------------------------------------------------------------------------------
    def model(self, a: Model, b: Model) -> None:
        for field in ("ir_version", "opset_imports", "producer_name", "producer_version",
                      "domain", "model_version", "doc_string", "metadata_props", "extra"):
            _check(getattr(a, field) == getattr(b, field), "model", field, getattr(a, field),
                   getattr(b, field))
        _check(sorted(a.functions) == sorted(b.functions), "model", "functions",
               sorted(a.functions), sorted(b.functions))
        for key, fa in a.functions.items():
            fb = b.functions[key]
            where = f"function {key[0]}::{key[1]}"
            for field in ("attributes", "opset_imports", "doc_string", "metadata_props"):
                _check(getattr(fa, field) == getattr(fb, field), where, field,
                       getattr(fa, field), getattr(fb, field))
            self.attrs(fa.attribute_defaults, fb.attribute_defaults, where + " defaults")
            self.graph(fa.graph, fb.graph, where, name=False)  # a function body has no name
        self.graph(a.graph, b.graph, f"graph '{a.graph.name}'")

    # -- graph ----------------------------------------------------------------------------------
    def graph(self, a: Graph, b: Graph, where: str, name: bool = True) -> None:
        if self.node_names and name:
            _check(a.name == b.name, where, "graph name", a.name, b.name)
        for field in ("doc_string", "metadata_props"):
            _check(getattr(a, field) == getattr(b, field), where, field, getattr(a, field),
                   getattr(b, field))
        ea, eb = getattr(a, "extra", None) or {}, getattr(b, "extra", None) or {}
        _check(ea == eb, where, "extra fields", list(ea), list(eb))
        _check(len(a.inputs) == len(b.inputs), where, "input count", len(a.inputs), len(b.inputs))
        for i, (va, vb) in enumerate(zip(a.inputs, b.inputs)):
            self.pair(va, vb, f"{where}: input {i}")
            ia, ib = a.initializers.get(va.name) is va, b.initializers.get(vb.name) is vb
            _check(ia == ib, where, f"input {i} has a default (initializer)", ia, ib)
            if ia:
                self.tensor(va.const, vb.const, f"{where}: input {i} initializer")
        inputs_a, inputs_b = set(a.inputs), set(b.inputs)
        self.pending[a] = [v for v in a.initializers.values() if v not in inputs_a]
        self.pending[b] = [v for v in b.initializers.values() if v not in inputs_b]
        nodes_a, nodes_b = list(a), list(b)
        for i, (na, nb) in enumerate(zip(nodes_a, nodes_b)):
            self.node(na, nb, f"{where}: node {i}")
        _check(len(nodes_a) == len(nodes_b), where, "node count", len(nodes_a), len(nodes_b))
        _check(len(a.outputs) == len(b.outputs), where, "output count", len(a.outputs),
               len(b.outputs))
        for i, (va, vb) in enumerate(zip(a.outputs, b.outputs)):
            self.use(va, vb, f"{where}: output {i}")
        pa, pb = self.pending.pop(a), self.pending.pop(b)
        _check(len(pa) == len(pb), where, "unused initializer count", len(pa), len(pb))
        for va, vb in zip(pa, pb):
            self.pair(va, vb, f"{where}: unused initializer")
            self.tensor(va.const, vb.const, f"{where}: unused initializer")

    def pair(self, va: Value, vb: Value, where: str) -> None:
        """Match two defined values, comparing their type, doc string and metadata."""
        if self.a2b.get(va, vb) is not vb or self.b2a.get(vb, va) is not va:
            raise _Diff(f"{where}: a value is matched twice")
        self.a2b[va], self.b2a[vb] = vb, va
        if va.type != vb.type:
            raise _Diff(f"{where}: type ({_type(va)} vs {_type(vb)})")
        _check(va.doc_string == vb.doc_string, where, "doc string", va.doc_string, vb.doc_string)
        _check(va.metadata_props == vb.metadata_props, where, "metadata", va.metadata_props,
               vb.metadata_props)

    def use(self, va: Optional[Value], vb: Optional[Value], where: str) -> None:
        """Check that a used value on each side is the same (matched) value."""
        if va is None or vb is None:
            _check(va is None and vb is None, where, "omitted input", va is None, vb is None)
            return
        if va in self.a2b or vb in self.b2a:
            if self.a2b.get(va) is not vb:
                raise _Diff(f"{where}: uses a different value (%{va.name} vs %{vb.name})")
            return
        ga, gb = self._pending_graph(va), self._pending_graph(vb)
        if ga is not None and gb is not None:
            self.pending[ga].remove(va)
            self.pending[gb].remove(vb)
            self.pair(va, vb, where + " (initializer)")
            self.tensor(va.const, vb.const, where + " (initializer)")
            return
        dangling_a = va.producer is None and va.graph is None
        dangling_b = vb.producer is None and vb.graph is None
        if dangling_a and dangling_b:  # defined nowhere (invalid model): match by first use
            self.pair(va, vb, where)
            return
        raise _Diff(f"{where}: uses a different value (%{va.name} vs %{vb.name})")

    def _pending_graph(self, v: Value) -> Optional[Graph]:
        g = v.graph
        if g is not None and v in self.pending.get(g, ()):
            return g
        return None

    # -- node -----------------------------------------------------------------------------------
    def node(self, a: Node, b: Node, where: str) -> None:
        opa, opb = _op(a), _op(b)
        if opa != opb:
            raise _Diff(f"{where} ({opa} vs {opb})")
        where = f"{where} ({opa})"
        _check(len(a.inputs) == len(b.inputs), where, "input count", len(a.inputs),
               len(b.inputs))
        for i, (va, vb) in enumerate(zip(a.inputs, b.inputs)):
            self.use(va, vb, f"{where} input {i}")
        self.attrs(list(a.attributes.values()), list(b.attributes.values()), where)
        _check(len(a.outputs) == len(b.outputs), where, "output count", len(a.outputs),
               len(b.outputs))
        for i, (va, vb) in enumerate(zip(a.outputs, b.outputs)):
            self.pair(va, vb, f"{where} output {i}")
        if self.node_names:
            _check(a.name == b.name, where, "node name", a.name, b.name)
        _check(a.provenance == b.provenance, where, "provenance", a.provenance, b.provenance)
        _check(a.doc_string == b.doc_string, where, "doc string", a.doc_string, b.doc_string)
        _check(a.metadata_props == b.metadata_props, where, "metadata", a.metadata_props,
               b.metadata_props)

    def attrs(self, la: List[Attr], lb: List[Attr], where: str) -> None:
        da, db = {x.name: x for x in la}, {x.name: x for x in lb}
        _check(sorted(da) == sorted(db), where, "attribute names", sorted(da), sorted(db))
        for name, x in da.items():
            y = db[name]
            w = f"{where} attribute '{name}'"
            _check(x.type == y.type, w, "kind", x.type.name, y.type.name)
            _check(x.ref_attr_name == y.ref_attr_name, w, "reference", x.ref_attr_name,
                   y.ref_attr_name)
            _check(x.doc_string == y.doc_string, w, "doc string", x.doc_string, y.doc_string)
            if x.ref_attr_name:
                continue
            if x.type in _LISTS:
                _check(len(x.value) == len(y.value), w, "length", len(x.value), len(y.value))
                for i, (p, q) in enumerate(zip(x.value, y.value)):
                    self.attr_item(x.type, p, q, f"{w}[{i}]")
            else:
                self.attr_item(x.type, x.value, y.value, w)

    def attr_item(self, kind: AttrType, p, q, where: str) -> None:
        if kind in (AttrType.FLOAT, AttrType.FLOATS):
            _check(np.float32(p).tobytes() == np.float32(q).tobytes(), where, "value", p, q)
        elif kind in (AttrType.STRING, AttrType.STRINGS):
            _check(_bytes(p) == _bytes(q), where, "value", p, q)
        elif kind in (AttrType.TENSOR, AttrType.TENSORS):
            self.tensor(p, q, where)
        elif kind in (AttrType.GRAPH, AttrType.GRAPHS):
            self.graph(p, q, f"{where}: graph '{p.name}'")
        elif kind in (AttrType.SPARSE_TENSOR, AttrType.SPARSE_TENSORS):
            _check(list(p.dims) == list(q.dims), where, "sparse dims", list(p.dims), list(q.dims))
            self.tensor(Tensor.from_proto(p.values), Tensor.from_proto(q.values),
                        where + " values")
            self.tensor(Tensor.from_proto(p.indices), Tensor.from_proto(q.indices),
                        where + " indices")
        else:  # INT, INTS, TYPE_PROTO(S)
            _check(p == q, where, "value", p, q)

    def tensor(self, a: Tensor, b: Tensor, where: str) -> None:
        _check(a.dtype == b.dtype, where, "element type", a.dtype.short_name, b.dtype.short_name)
        _check(a.dims == b.dims, where, "dims", a.dims, b.dims)
        _check(a.doc_string == b.doc_string, where, "tensor doc string", a.doc_string,
               b.doc_string)
        _check(a.metadata_props == b.metadata_props, where, "tensor metadata",
               a.metadata_props, b.metadata_props)
        if not tensors_equal(a, b):
            raise _Diff(f"{where}: tensor data differs")


def tensors_equal(a: Tensor, b: Tensor) -> bool:
    """True when two tensors have the same type, dims and bytes (strings: the same elements;
    4-bit and 2-bit types: the same elements, ignoring the padding bits of the last byte)."""
    if a is b:
        return True
    if a.dtype != b.dtype or a.dims != b.dims:
        return False
    if a.dtype == DataType.STRING:
        return [_bytes(x) for x in a.numpy().reshape(-1)] == \
            [_bytes(x) for x in b.numpy().reshape(-1)]
    ea, eb = a.external, b.external
    if ea is not None and eb is not None and (ea.path, ea.offset) == (eb.path, eb.offset):
        return True
    if a.dtype.is_packed:  # compare elements: the padding bits of the last byte carry nothing
        return a.numpy().tobytes() == b.numpy().tobytes()
    return np.array_equal(np.frombuffer(a.raw_view(), np.uint8),
                          np.frombuffer(b.raw_view(), np.uint8))


def _bytes(s) -> bytes:
    return s if isinstance(s, bytes) else str(s).encode("utf-8")


def _op(n: Node) -> str:
    s = f"{n.domain}::{n.op_type}" if n.domain else n.op_type
    return s + (f"<{n.overload}>" if n.overload else "")


def _type(v: Value) -> str:
    from passctl.ir.printer import type_text
    return type_text(v.type)


_LISTS = {AttrType.FLOATS, AttrType.INTS, AttrType.STRINGS, AttrType.TENSORS, AttrType.GRAPHS,
          AttrType.SPARSE_TENSORS, AttrType.TYPE_PROTOS}
