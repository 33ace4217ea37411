"""The IR text form: a deterministic, MLIR-like printout of a Model that the parser reads back."""

from __future__ import annotations

import base64
import logging
import os
from typing import Dict, List, Optional

import onnx

from passctl.ir._core import Attr, AttrType, Function, Graph, Model, Node, Value
from passctl.ir._tensor import Tensor
from passctl.ir._text_common import (ATTR_KIND_NAMES, format_float, format_scalars, ident, quote,
                                     value_ref)
from passctl.ir._text_weights import SourceIndex, WeightsFile
from passctl.ir._types import (DataType, MapType, OptionalType, SequenceType, Shape,
                               SparseTensorType, TensorType, Type)

logger = logging.getLogger(__name__)

_INDENT = "  "
# A graph signature longer than this prints one input per line.
_SIGNATURE_WIDTH = 100


def print_model(model: Model, weights_path: Optional[str] = None, inline_limit: int = 16,
                line_map: Optional[Dict[Node, int]] = None, text_dir: Optional[str] = None) -> str:
    """Print ``model`` in the IR text form (grammar: ``docs/ir-text-form.md``).

    Constants with at most ``inline_limit`` elements are written inline with exact values. Larger
    ones are written as a reference to where their bytes are: the external-data file they already
    live in (``@raw(file, offset, length)``), the source ONNX file when the importer recorded it
    and the bytes are unchanged (``@onnx(file, "name")``), else the weights file ``weights_path``
    (written here), else inline as hex.

    Args:
        model: the model to print (left unchanged).
        weights_path: file to write large constants to (temp file + rename; replaced if present).
        inline_limit: most elements of a constant written inline as values.
        line_map: when given, filled with node -> 1-based line number of the node in the text.
        text_dir: folder the text will be saved in; file references are written relative to it.
            Default: the folder of ``weights_path``, else references are absolute paths.

    Returns:
        The text, ending with a newline. Printing the same model twice gives the same text.

    Raises:
        OSError: the weights file cannot be written (it is written, possibly empty, whenever
            ``weights_path`` is given).
        TypeError: a value type or attribute kind that has no text form (not an ONNX one).
    """
    if text_dir is None and weights_path is not None:
        text_dir = os.path.dirname(os.path.abspath(weights_path))
    weights = WeightsFile(weights_path) if weights_path else None
    try:
        p = _Printer(inline_limit, line_map, text_dir, weights,
                     SourceIndex.for_model(model))
        p.model(model)
        text = p.finish()
    except BaseException:
        if weights is not None:
            weights.abort()
        raise
    if weights is not None:
        weights.commit()
        logger.debug("wrote %d bytes of constants to %s", weights.offset, weights.path)
    return text


def print_graph(graph: Graph, inline_limit: int = 16,
                line_map: Optional[Dict[Node, int]] = None) -> str:
    """Print one graph (``graph @name(...) -> (...) { ... }``); large constants as hex."""
    p = _Printer(inline_limit, line_map, None, None, None)
    p.graph(graph, "graph", 0)
    return p.finish()


def format_node(node: Node) -> str:
    """The node's line as :func:`print_model` writes it, without indentation, using the values'
    own names. Subgraph attributes are shortened to ``graph @name {...}``."""
    p = _Printer(16, None, None, None, None, single_line=True)
    p.node(node, 0)
    return p.finish().rstrip("\n")


def type_text(t: Optional[Type]) -> str:
    """A value type as text: ``f32[batch,3]``, ``f32[*]`` (unknown rank), ``seq<f32[?]>``, ``?``."""
    if t is None:
        return "?"
    if isinstance(t, (TensorType, SparseTensorType)):
        s = f"{t.dtype.short_name}[{shape_text(t.shape)}]"
        if isinstance(t, SparseTensorType):
            s = f"sparse<{s}>"
    elif isinstance(t, SequenceType):
        s = f"seq<{type_text(t.elem)}>"
    elif isinstance(t, OptionalType):
        s = f"opt<{type_text(t.elem)}>"
    elif isinstance(t, MapType):
        s = f"map<{t.key.short_name}, {type_text(t.value)}>"
    else:
        raise TypeError(f"cannot print value type {t!r}")
    if t.denotation:
        s += f" denote {quote(t.denotation)}"
    return s


def shape_text(shape: Optional[Shape]) -> str:
    """``batch,3,?`` (``*`` for an unknown rank); dims with a denotation add ``denote "..."``."""
    if shape is None:
        return "*"
    parts = []
    for i, d in enumerate(shape.dims):
        s = "?" if d is None else str(d) if isinstance(d, int) else ident(d)
        if shape.denotations and i < len(shape.denotations) and shape.denotations[i]:
            s += f" denote {quote(shape.denotations[i])}"
        parts.append(s)
    return ",".join(parts)


def dict_text(d: Dict[str, str]) -> str:
    """``{"key": "value", ...}`` in the dict's order."""
    return "{" + ", ".join(f"{quote(k)}: {quote(v)}" for k, v in d.items()) + "}"


class _Printer:
    def __init__(self, inline_limit: int, line_map, text_dir, weights, source,
                 single_line: bool = False):
        self.inline_limit = inline_limit
        self.line_map = line_map
        self.text_dir = text_dir
        self.weights = weights
        self.source = source
        self.single_line = single_line
        self.lines: List[str] = []
        self.cur = ""
        self.names: Dict[Value, str] = {}
        self.used: set = set()
        self.fresh = 0

    # -- output ---------------------------------------------------------------------------------
    def write(self, s: str) -> None:
        self.cur += s

    def newline(self, indent: int) -> None:
        self.lines.append(self.cur.rstrip())
        self.cur = _INDENT * indent

    def finish(self) -> str:
        if self.cur.strip():
            self.lines.append(self.cur.rstrip())
        self.cur = ""
        return "\n".join(self.lines) + "\n"

    def line_no(self) -> int:
        return len(self.lines) + 1

    # -- names ----------------------------------------------------------------------------------
    def define(self, v: Value) -> str:
        """Give a value its printed name: its own, made unique in the model (per function body)."""
        if self.single_line:
            return value_ref(v.name)
        if v in self.names:
            return self.names[v]
        base = v.name
        name = base
        while not name or name in self.used:
            self.fresh += 1
            name = f"{base or 'v'}_{self.fresh}"
        self.used.add(name)
        self.names[v] = value_ref(name)
        return self.names[v]

    def ref(self, v: Optional[Value]) -> str:
        if v is None:
            return "none"
        if self.single_line:
            return value_ref(v.name)
        return self.names.get(v) or self.define(v)  # define: a dangling value (invalid model)

    def decl(self, v: Value) -> str:
        s = self.define(v)
        if v.type is not None:
            s += ": " + type_text(v.type)
        if v.doc_string:
            s += " doc " + quote(v.doc_string)
        if v.metadata_props:
            s += " meta " + dict_text(v.metadata_props)
        return s

    # -- model ----------------------------------------------------------------------------------
    def model(self, m: Model) -> None:
        head = f"model ir_version {m.ir_version} opset {self.opsets(m.opset_imports)} producer " \
               f"{quote(m.producer_name)} {quote(m.producer_version)}"
        if m.domain:
            head += f" domain {quote(m.domain)}"
        if m.model_version:
            head += f" model_version {m.model_version}"
        self.write(head + " {")
        self.props(m, 1)
        if m.extra:
            self.newline(1)
            self.write("extra " + _extra_text(m.extra))
        self.newline(1)
        self.graph(m.graph, "graph", 1)
        for fn in m.functions.values():
            self.names, self.used, self.fresh = {}, set(), 0
            self.newline(1)
            self.function(fn, 1)
        self.newline(0)
        self.write("}")

    @staticmethod
    def opsets(opsets: Dict[str, int]) -> str:
        return "{" + ", ".join(f"{quote(k)}: {v}" for k, v in opsets.items()) + "}"

    def props(self, obj, indent: int) -> None:
        """``doc`` and ``meta`` lines of a model, graph or function."""
        if obj.doc_string:
            self.newline(indent)
            self.write("doc " + quote(obj.doc_string))
        if obj.metadata_props:
            self.newline(indent)
            self.write("meta " + dict_text(obj.metadata_props))

    def function(self, fn: Function, indent: int) -> None:
        name = ident(fn.name)
        if fn.domain:
            name = f"{ident(fn.domain)}::{name}"
        if fn.overload:
            name += f"<{ident(fn.overload)}>"
        suffix = ""
        if fn.attributes:
            suffix += " attrs [" + ", ".join(ident(a) for a in fn.attributes) + "]"
        if fn.attribute_defaults:
            defaults = ", ".join(self.attr_inline(a) for a in fn.attribute_defaults)
            suffix += " defaults {" + defaults + "}"
        suffix += f" opset {self.opsets(fn.opset_imports)}"
        self.graph(fn.graph, "func", indent, name=name, suffix=suffix, obj=fn)

    # -- graph ----------------------------------------------------------------------------------
    def graph(self, g: Graph, keyword: str, indent: int, name: Optional[str] = None,
              suffix: str = "", obj=None) -> None:
        name = ident(g.name) if name is None else name
        head = f"{keyword} @{name}" if name else keyword
        params = []
        for v in g.inputs:
            s = self.decl(v)
            if v.const is not None and g.initializers.get(v.name) is v:
                s += " = init " + self.tensor(v.const, ("init", v.name))
            params.append(s)
        outs = ", ".join(type_text(v.type) for v in g.outputs)
        one_line = f"{head}({', '.join(params)}) -> ({outs}){suffix} {{"
        if len(one_line) + len(self.cur) <= _SIGNATURE_WIDTH or not params:
            self.write(one_line)
        else:
            self.write(head + "(")
            for i, s in enumerate(params):
                self.newline(indent + 2)
                self.write(s + ("," if i + 1 < len(params) else ""))
            self.newline(indent)
            self.write(f") -> ({outs}){suffix} {{")
        self.props(obj if obj is not None else g, indent + 1)
        extra = getattr(g, "extra", None)
        if extra:
            self.newline(indent + 1)
            self.write("extra " + _extra_text(extra))
        inputs = set(g.inputs)
        for v in g.initializers.values():
            if v in inputs:
                continue
            self.newline(indent + 1)
            t = v.const
            s = self.define(v)
            own = TensorType(t.dtype, Shape(t.dims))
            if v.type is not None and v.type != own:
                s += ": " + type_text(v.type)
            if v.doc_string:
                s += " doc " + quote(v.doc_string)
            if v.metadata_props:
                s += " meta " + dict_text(v.metadata_props)
            self.write(f"{s} = init {self.tensor(t, ('init', v.name))}")
        for node in g:
            self.newline(indent + 1)
            self.node(node, indent + 1)
        self.newline(indent + 1)
        self.write("return" + ("" if not g.outputs else " " + ", ".join(
            self.ref(v) for v in g.outputs)))
        self.newline(indent)
        self.write("}")

    # -- node -----------------------------------------------------------------------------------
    def node(self, node: Node, indent: int) -> None:
        if self.line_map is not None:
            self.line_map[node] = self.line_no()
        ins = ", ".join(self.ref(v) for v in node.inputs)
        outs = []
        for v in node.outputs:
            if (not v.name and v.type is None and not v.uses() and not v.doc_string
                    and not v.metadata_props and not v.is_graph_output()):
                outs.append("none")  # an omitted optional output
            else:
                outs.append(self.decl(v))
        if outs:
            self.write(", ".join(outs) + " = ")
        op = ident(node.op_type)
        if node.domain:
            op = f"{ident(node.domain)}::{op}"
        if node.overload:
            op += f"<{ident(node.overload)}>"
        self.write(f"{op}({ins})")
        if node.attributes:
            self.write(" {")
            for i, a in enumerate(node.attributes.values()):
                if i:
                    self.write(", ")
                self.attr(a, indent, node)
            self.write("}")
        if node.name:
            self.write(" name " + quote(node.name))
        if node.provenance != ((node.name,) if node.name else ()):
            self.write(" loc(" + ", ".join(quote(p) for p in node.provenance) + ")")
        if node.doc_string:
            self.write(" doc " + quote(node.doc_string))
        if node.metadata_props:
            self.write(" meta " + dict_text(node.metadata_props))

    def attr_inline(self, a: Attr) -> str:
        """An attribute without subgraphs as one string (function defaults)."""
        saved, self.cur = self.cur, ""
        self.attr(a, 0, None)
        text, self.cur = self.cur, saved
        return text

    def attr(self, a: Attr, indent: int, node: Optional[Node]) -> None:
        self.write(f"{ident(a.name)} = ")
        kind = ATTR_KIND_NAMES[_KIND_INDEX[a.type]] if a.type in _KIND_INDEX else None
        if kind is None:
            raise TypeError(f"attribute '{a.name}' has kind {a.type.name}, which has no text form")
        if a.ref_attr_name:
            self.write(f"@{ident(a.ref_attr_name)} : {kind}")
        elif a.type in _LIST_KINDS:
            items = list(a.value)
            self.write("[")
            for i, item in enumerate(items):
                if i:
                    self.write(", ")
                self.attr_item(a.type, item, indent, node, a.name, i)
            self.write("]")
            if not items:
                self.write(f" : {kind}")
        else:
            self.attr_item(a.type, a.value, indent, node, a.name, None)
        if a.doc_string:
            self.write(" doc " + quote(a.doc_string))

    def attr_item(self, kind: AttrType, v, indent: int, node: Optional[Node], attr_name: str,
                  index: Optional[int]) -> None:
        key = ("node", node.name, attr_name, index) if node is not None else None
        if kind in (AttrType.FLOAT, AttrType.FLOATS):
            self.write(format_float(v))
        elif kind in (AttrType.INT, AttrType.INTS):
            self.write(str(int(v)))
        elif kind in (AttrType.STRING, AttrType.STRINGS):
            self.write(quote(v))
        elif kind in (AttrType.TENSOR, AttrType.TENSORS):
            self.write(self.tensor(v, key))
        elif kind in (AttrType.GRAPH, AttrType.GRAPHS):
            if self.single_line:
                self.write(f"graph @{ident(v.name)} {{...}}" if v.name else "graph {...}")
            else:
                self.graph(v, "graph", indent)
        elif kind in (AttrType.SPARSE_TENSOR, AttrType.SPARSE_TENSORS):
            self.write(self.sparse(v))
        elif kind in (AttrType.TYPE_PROTO, AttrType.TYPE_PROTOS):
            self.write(f"type<{type_text(v)}>")

    # -- constants ------------------------------------------------------------------------------
    def tensor(self, t: Tensor, key) -> str:
        """``dtype[dims] data [{name = ..., doc = ..., meta = {...}}]``; an initializer's tensor
        takes the value's name, so it is not printed."""
        s = f"{t.dtype.short_name}[{','.join(str(d) for d in t.dims)}] {self.tensor_data(t, key)}"
        props = []
        if t.name and (key is None or key[0] != "init"):
            props.append("name = " + quote(t.name))
        if t.doc_string:
            props.append("doc = " + quote(t.doc_string))
        if t.metadata_props:
            props.append("meta = " + dict_text(t.metadata_props))
        return s + (" {" + ", ".join(props) + "}" if props else "")

    def tensor_data(self, t: Tensor, key) -> str:
        if t.dtype == DataType.STRING or t.size <= self.inline_limit:
            texts = format_scalars(t.numpy(), t.dtype)
            if texts is not None:
                return "dense<" + ", ".join(texts) + ">"
            return f'hex<"{t.tobytes().hex()}">'
        ext = t.external
        if ext is not None and not (self.weights and self.weights.is_target(ext.path)):
            length = ext.length if ext.length is not None else t.nbytes
            return f"@raw({quote(self.path(ext.path))}, {ext.offset}, {length})"
        if self.source is not None and key is not None:
            ref = self.source.find(t, _source_keys(t, key))
            if ref is not None:
                where = {"init": lambda: quote(ref[1]), "tensor": lambda: f"tensor {quote(ref[1])}",
                         "node": lambda: f"node {quote(ref[1])}, {quote(ref[2])}"}[ref[0]]()
                return f"@onnx({quote(self.path(self.source.path))}, {where})"
        if self.weights is not None:
            offset, length = self.weights.add(t)
            return f"@raw({quote(self.path(self.weights.path))}, {offset}, {length})"
        return f'hex<"{t.tobytes().hex()}">'

    def sparse(self, sp: onnx.SparseTensorProto) -> str:
        values = Tensor.from_proto(sp.values)
        indices = Tensor.from_proto(sp.indices)
        dims = ", ".join(str(d) for d in sp.dims)
        return f"sparse<[{dims}], {self.tensor(values, None)}, {self.tensor(indices, None)}>"

    def path(self, path: str) -> str:
        path = os.path.abspath(path)
        if self.text_dir is not None:
            path = os.path.relpath(path, self.text_dir)
        return path.replace(os.sep, "/")


def _source_keys(t: Tensor, key: tuple) -> list:
    """Keys a tensor may have in the source file: ``key`` is ``("init", value name)`` or
    ``("node", node name, attribute name, list index or None)``."""
    if key[0] == "init":
        return [key]
    if key[3] is not None:
        return []  # tensors inside list attributes are not referenced
    keys = [("tensor", t.name)] if t.name else []
    return keys + ([key[:3]] if key[1] else [])


def _extra_text(extra: Dict[str, List[bytes]]) -> str:
    """``{"field": ["<base64>", ...]}`` for serialized proto fields passctl does not model."""
    items = []
    for k, blobs in extra.items():
        enc = ", ".join(quote(base64.b64encode(b).decode("ascii")) for b in blobs)
        items.append(f"{quote(k)}: [{enc}]")
    return "{" + ", ".join(items) + "}"


_KIND_INDEX = {AttrType.FLOAT: 0, AttrType.INT: 1, AttrType.STRING: 2, AttrType.TENSOR: 3,
               AttrType.GRAPH: 4, AttrType.SPARSE_TENSOR: 5, AttrType.TYPE_PROTO: 6,
               AttrType.FLOATS: 7, AttrType.INTS: 8, AttrType.STRINGS: 9, AttrType.TENSORS: 10,
               AttrType.GRAPHS: 11, AttrType.SPARSE_TENSORS: 12, AttrType.TYPE_PROTOS: 13}
_LIST_KINDS = {AttrType.FLOATS, AttrType.INTS, AttrType.STRINGS, AttrType.TENSORS,
               AttrType.GRAPHS, AttrType.SPARSE_TENSORS, AttrType.TYPE_PROTOS}
