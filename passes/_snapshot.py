"""Cheap structural copies of a model (tensors shared), for crash reproducers and before/after dumps."""

from __future__ import annotations

from typing import Dict, Optional

from passctl.ir import Attr, AttrType, Function, Graph, Model, Node, Value


def clone_model(model: Model) -> Model:
    """A copy of ``model`` whose graphs, nodes and values are new but whose tensors are shared.

    Passes replace tensors rather than writing into them, so sharing the constant data keeps the
    snapshot correct at the cost of O(nodes) time and no copy of the weights.
    """
    vmap: Dict[Value, Value] = {}
    graph = _clone_graph(model.graph, vmap)
    functions = []
    for f in model.functions.values():
        copy = Function(f.domain, f.name, _clone_graph(f.graph, {}), f.opset_imports, f.attributes,
                        f.attribute_defaults, f.overload, f.doc_string)
        _copy_fields(f, copy, skip=("graph",))
        functions.append(copy)
    out = Model(graph, model.opset_imports, model.ir_version, model.producer_name,
                model.producer_version, model.domain, model.model_version, model.doc_string, functions)
    # Every other model field (metadata_props, extra, base_dir, source_path, ...) as is.
    _copy_fields(model, out, skip=("graph", "functions"))
    return out


def _copy_fields(src, dst, skip) -> None:
    for key, value in vars(src).items():
        if key in skip:
            continue
        if isinstance(value, dict):
            value = {k: list(v) if isinstance(v, list) else v for k, v in value.items()}
        elif isinstance(value, list):
            value = list(value)
        setattr(dst, key, value)


def _clone_value(v: Value) -> Value:
    c = Value(v.name, v.type, v.const, v.doc_string)
    c.metadata_props = dict(v.metadata_props)
    return c


def _clone_graph(g: Graph, vmap: Dict[Value, Value]) -> Graph:
    # vmap holds the outer scopes' values so subgraphs keep reading the copied outer values.
    vmap = dict(vmap)
    inputs = []
    for v in g.inputs:
        vmap[v] = _clone_value(v)
        inputs.append(vmap[v])
    inits = []
    for v in g.initializers.values():
        if v not in vmap:
            vmap[v] = _clone_value(v)
        inits.append(vmap[v])
    out = Graph(inputs, [], [], inits, g.name, g.doc_string)
    out.metadata_props = dict(g.metadata_props)
    out.extra = {k: list(v) for k, v in getattr(g, "extra", {}).items()}
    for n in g:
        outs = []
        for o in n.outputs:
            vmap[o] = _clone_value(o)
            outs.append(vmap[o])
        attrs = [_clone_attr(a, vmap) for a in n.attributes.values()]
        node = Node(n.domain, n.op_type, [_lookup(vmap, v) for v in n.inputs], attrs, outs, n.name,
                    n.overload, n.doc_string, n.provenance, n.metadata_props)
        out.append(node)
    out.outputs = [_lookup(vmap, v) for v in g.outputs]
    return out


def _lookup(vmap: Dict[Value, Value], v: Optional[Value]) -> Optional[Value]:
    if v is None:
        return None
    if v not in vmap:
        # A value with no definition in scope (a broken graph): keep a detached copy so the snapshot
        # shows the same breakage instead of failing.
        vmap[v] = _clone_value(v)
    return vmap[v]


def _clone_attr(a: Attr, vmap: Dict[Value, Value]) -> Attr:
    if a.type == AttrType.GRAPH:
        value = _clone_graph(a.value, vmap)
    elif a.type == AttrType.GRAPHS:
        value = tuple(_clone_graph(g, vmap) for g in a.value)
    else:
        value = a.value
    return Attr(a.name, a.type, value, a.doc_string, a.ref_attr_name)
