"""Parser of the IR text form (``docs/ir-text-form.md``): hand-written recursive descent."""

from __future__ import annotations

import base64
import dataclasses
import math
import os
from typing import Dict, List, Optional, Tuple

import numpy as np
import onnx

from passctl.ir._core import Attr, AttrType, Function, Graph, Model, Node, Value
from passctl.ir._tensor import ExternalLocation, Tensor
from passctl.ir._text_common import ATTR_KIND_NAMES, as_text, scalars_to_array
from passctl.ir._text_lexer import EOF, FLOAT, INT, NAME, PUNCT, STRING, VALUE, Token, tokenize
from passctl.ir._text_weights import SourceIndex
from passctl.ir._types import (DataType, MapType, OptionalType, SequenceType, Shape,
                               SparseTensorType, TensorType, Type)
from passctl.ir.errors import ParseError

_KINDS = {name: kind for name, kind in zip(ATTR_KIND_NAMES, (
    AttrType.FLOAT, AttrType.INT, AttrType.STRING, AttrType.TENSOR, AttrType.GRAPH,
    AttrType.SPARSE_TENSOR, AttrType.TYPE_PROTO, AttrType.FLOATS, AttrType.INTS, AttrType.STRINGS,
    AttrType.TENSORS, AttrType.GRAPHS, AttrType.SPARSE_TENSORS, AttrType.TYPE_PROTOS))}
_LIST_OF = {AttrType.FLOAT: AttrType.FLOATS, AttrType.INT: AttrType.INTS,
            AttrType.STRING: AttrType.STRINGS, AttrType.TENSOR: AttrType.TENSORS,
            AttrType.GRAPH: AttrType.GRAPHS, AttrType.SPARSE_TENSOR: AttrType.SPARSE_TENSORS,
            AttrType.TYPE_PROTO: AttrType.TYPE_PROTOS}
_ELEM_OF = {v: k for k, v in _LIST_OF.items()}
_DTYPES = {dt.short_name for dt in DataType}


def parse_model(text: str, filename: str = "<string>") -> Model:
    """Parse IR text into a :class:`Model`.

    File references (``@raw``, ``@onnx``) are relative to the folder of ``filename`` (the current
    folder for ``"<string>"``). ``@raw`` data is memory-mapped on first use; an ``@onnx`` file is
    read once (without its external data) for all its tensors, and becomes the model's
    ``source_path`` (the first one, if several), so printing the model again refers to it again.

    Args:
        text: the IR text.
        filename: shown in errors, and the base of relative file references.

    Returns:
        The model.

    Raises:
        ParseError: the text does not follow the grammar, uses a value before defining it, names
            a missing weights file or tensor, or a constant's data does not match its type.
    """
    return _Parser(text, filename).model()


def parse_file(path: str) -> Model:
    """Parse the IR text file at ``path`` (UTF-8).

    Raises:
        ParseError: as :func:`parse_model`.
        OSError: the file cannot be read.
    """
    with open(path, encoding="utf-8") as f:
        return parse_model(f.read(), path)


def parse_graph(text: str, filename: str = "<string>") -> Graph:
    """Parse one ``graph @name(...) -> (...) { ... }`` (as :func:`~passctl.ir.printer.print_graph`
    writes it). Raises ParseError as :func:`parse_model`."""
    p = _Parser(text, filename)
    p.expect_word("graph")
    g = p.graph_rest(None)
    p.expect_eof()
    return g


class _Scope:
    """Value names of one graph, chained to the enclosing graph's (subgraphs read outer values)."""

    def __init__(self, parent: Optional["_Scope"]):
        self.parent = parent
        self.names: Dict[str, Value] = {}

    def lookup(self, name: str) -> Optional[Value]:
        s = self
        while s is not None:
            if name in s.names:
                return s.names[name]
            s = s.parent
        return None


class _Parser:
    def __init__(self, text: str, filename: str):
        self.filename = filename
        self.toks = tokenize(text, filename)
        self.pos = 0
        real = filename not in ("<string>", "") and not filename.startswith("<")
        self.base_dir = os.path.dirname(os.path.abspath(filename)) if real else os.getcwd()
        # ONNX files that @onnx references read, in order of first use.
        self.sources: List[str] = []

    # -- token helpers --------------------------------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.toks[self.pos]

    def next(self) -> Token:
        t = self.toks[self.pos]
        if t.kind != EOF:
            self.pos += 1
        return t

    def error(self, message: str, tok: Optional[Token] = None) -> ParseError:
        tok = tok or self.tok
        return ParseError(message, self.filename, tok.line, tok.column)

    def expected(self, what: str) -> ParseError:
        return self.error(f"expected {what}, found {self.tok.describe()}")

    def at(self, kind: str, value=None) -> bool:
        t = self.tok
        return t.kind == kind and (value is None or t.value == value)

    def at_word(self, word: str) -> bool:
        return self.at(NAME, word)

    def accept(self, punct: str) -> bool:
        if self.at(PUNCT, punct):
            self.pos += 1
            return True
        return False

    def accept_word(self, word: str) -> bool:
        if self.at_word(word):
            self.pos += 1
            return True
        return False

    def expect(self, punct: str, context: str = "") -> Token:
        if not self.at(PUNCT, punct):
            raise self.expected(f"'{punct}'" + (f" {context}" if context else ""))
        return self.next()

    def expect_word(self, word: str) -> Token:
        if not self.at_word(word):
            raise self.expected(f"'{word}'")
        return self.next()

    def expect_eof(self) -> None:
        if not self.at(EOF):
            raise self.expected("end of input")

    def string(self, what: str = "a string") -> bytes:
        if not self.at(STRING):
            raise self.expected(what)
        return self.next().value

    def text(self, what: str = "a string") -> str:
        return self.string(what).decode("utf-8", "surrogateescape")

    def int_(self, what: str = "an integer") -> int:
        if not self.at(INT):
            raise self.expected(what)
        return self.next().value

    def ident(self, what: str = "a name") -> str:
        """A bare name or a quoted one."""
        if self.at(NAME):
            return self.next().value
        if self.at(STRING):
            return self.text()
        raise self.expected(what)

    def comma_list(self, close: str, item) -> list:
        out = []
        if self.accept(close):
            return out
        while True:
            out.append(item())
            if self.accept(close):
                return out
            if not self.accept(","):
                raise self.expected(f"',' or '{close}'")

    def str_dict(self) -> Dict[str, str]:
        self.expect("{", "to open a dictionary")

        def item():
            k = self.text("a string key")
            self.expect(":")
            return k, self.text("a string value")
        return dict(self.comma_list("}", item))

    # -- model ----------------------------------------------------------------------------------
    def model(self) -> Model:
        self.expect_word("model")
        m = Model(Graph())
        while not self.at(PUNCT, "{"):
            if self.accept_word("ir_version"):
                m.ir_version = self.int_()
            elif self.accept_word("opset"):
                m.opset_imports = self.opsets()
            elif self.accept_word("producer"):
                m.producer_name = self.text("the producer name")
                m.producer_version = self.text("the producer version")
            elif self.accept_word("domain"):
                m.domain = self.text()
            elif self.accept_word("model_version"):
                m.model_version = self.int_()
            else:
                raise self.expected("'{' or a model property (ir_version, opset, producer, "
                                    "domain, model_version)")
        self.next()
        graph_tok = None
        while not self.accept("}"):
            if self.accept_word("doc"):
                m.doc_string = self.text()
            elif self.accept_word("meta"):
                m.metadata_props = self.str_dict()
            elif self.accept_word("extra"):
                m.extra = self.extra()
            elif self.at_word("graph"):
                if graph_tok is not None:
                    raise self.error(f"a model has one main graph; another one began at line "
                                     f"{graph_tok.line}")
                graph_tok = self.next()
                m.graph = self.graph_rest(None)
            elif self.accept_word("func"):
                fn = self.function()
                if fn.key in m.functions:
                    raise self.error(f"function {fn.domain}::{fn.name} is defined twice",
                                     self.toks[self.pos - 1])
                m.functions[fn.key] = fn
            else:
                raise self.expected("'graph', 'func', 'doc', 'meta', 'extra' or '}'")
        if self.sources:  # re-printing refers to the same source file again
            m.source_path = self.sources[0]
        if graph_tok is None:
            raise self.error("the model has no main graph ('graph @name(...) -> (...) {...}')",
                             self.toks[self.pos - 1])
        self.expect_eof()
        return m

    def opsets(self) -> Dict[str, int]:
        self.expect("{", "to open the opset dictionary")

        def item():
            k = self.text("a domain string (\"\" is the default domain)")
            self.expect(":")
            return k, self.int_("an opset version")
        return dict(self.comma_list("}", item))

    def extra(self) -> Dict[str, List[bytes]]:
        self.expect("{", "to open the extra dictionary")

        def item():
            k = self.text("a field name")
            self.expect(":")
            self.expect("[")
            blobs = self.comma_list("]", lambda: self.string("a base64 string"))
            try:
                return k, [base64.b64decode(b, validate=True) for b in blobs]
            except ValueError:
                raise self.error(f"extra field '{k}' is not base64") from None
        return dict(self.comma_list("}", item))

    def function(self) -> Function:
        self.expect("@", "before the function name")
        name = self.ident("the function name")
        domain = ""
        if self.accept("::"):
            domain, name = name, self.ident("the function name after '::'")
        overload = self.ident("the overload") if self.accept("<") else ""
        if overload:
            self.expect(">")
        scope = _Scope(None)
        g, out_types = self.signature(scope, name)
        attrs: List[str] = []
        defaults: List[Attr] = []
        opsets: Dict[str, int] = {}
        while not self.at(PUNCT, "{"):
            if self.accept_word("attrs"):
                self.expect("[")
                attrs = self.comma_list("]", self.ident)
            elif self.accept_word("defaults"):
                self.expect("{")
                defaults = self.comma_list("}", lambda: self.attr(None))
            elif self.accept_word("opset"):
                opsets = self.opsets()
            else:
                raise self.expected("'{' or a function property (attrs, defaults, opset)")
        fn = Function(domain, name, g, opsets, attrs, defaults, overload)
        self.body(g, scope, out_types, fn)
        return fn

    # -- graph ----------------------------------------------------------------------------------
    def graph_rest(self, parent: Optional[_Scope]) -> Graph:
        """After the 'graph' keyword: ``[@name] (params) -> (types) { body }``."""
        name = ""
        if self.accept("@"):
            name = self.ident("the graph name")
        scope = _Scope(parent)
        g, out_types = self.signature(scope, name)
        self.body(g, scope, out_types, g)
        return g

    def signature(self, scope: _Scope, name: str) -> Tuple[Graph, list]:
        g = Graph(name=name)
        self.expect("(", "to open the input list")

        def param():
            tok = self.tok
            v = self.value_decl(scope)
            if self.accept("="):
                self.expect_word("init")
                v.const = self.tensor(v.name)
                g.add_input(v)
                g.add_initializer(v)
            else:
                g.add_input(v)
            self.define(scope, v, tok)
        self.comma_list(")", param)
        self.expect("->", "after the input list")
        self.expect("(", "to open the output type list")
        out_types = self.comma_list(")", lambda: (self.tok, self.type_or_unknown()))
        return g, out_types

    def body(self, g: Graph, scope: _Scope, out_types: list, props) -> None:
        """``{ items return values }``; ``props`` (the graph or function) takes doc and meta."""
        self.expect("{", "to open the graph body")
        while True:
            if self.accept_word("return"):
                break
            if self.accept_word("doc"):
                props.doc_string = self.text()
            elif self.accept_word("meta"):
                props.metadata_props = self.str_dict()
            elif self.accept_word("extra"):
                g.extra = self.extra()
            elif self.at(VALUE) or self.at_word("none") or self.at(NAME) or self.at(STRING):
                self.statement(g, scope)
            else:
                raise self.expected("a node, an initializer, 'doc', 'meta' or 'return'")
        outs = []
        if not self.at(PUNCT, "}"):
            while True:
                outs.append((self.tok, self.use(scope)))
                if not self.accept(","):
                    break
        self.expect("}", "to close the graph body")
        if len(outs) != len(out_types):
            raise self.error(f"graph '{g.name}' returns {len(outs)} values but its signature "
                             f"lists {len(out_types)} output types", outs[0][0] if outs else None)
        for (tok, v), (_, t) in zip(outs, out_types):
            if v is None:
                raise self.error("a graph output cannot be 'none'", tok)
            if t is not None:
                if v.type is None:
                    v.type = t
                elif v.type != t:
                    raise self.error(f"output '%{v.name}' has type {_show(v.type)} but the "
                                     f"signature says {_show(t)}", tok)
            g.outputs.append(v)

    def statement(self, g: Graph, scope: _Scope) -> None:
        first = self.tok
        outs: List[Tuple[Token, Optional[Value]]] = []
        if self.at(VALUE) or self.at_word("none"):
            while True:
                tok = self.tok
                outs.append((tok, None if self.accept_word("none") else self.value_decl(scope)))
                if not self.accept(","):
                    break
            self.expect("=", "after the defined values")
            if self.accept_word("init"):
                if len(outs) != 1 or outs[0][1] is None:
                    raise self.error("an initializer defines exactly one value", first)
                v = outs[0][1]
                v.const = self.tensor(v.name)
                g.add_initializer(v)
                self.define(scope, v, first)
                return
        node = self.node(scope, [Value("") if v is None else v for _, v in outs])
        g.append(node)
        for tok, v in outs:
            if v is not None:
                self.define(scope, v, tok)

    def value_decl(self, scope: _Scope) -> Value:
        if not self.at(VALUE):
            raise self.expected("a value ('%name')")
        v = Value(self.next().value)
        if self.accept(":"):
            v.type = self.type_or_unknown()
        while True:
            if self.accept_word("doc"):
                v.doc_string = self.text()
            elif self.accept_word("meta"):
                v.metadata_props = self.str_dict()
            else:
                return v

    def define(self, scope: _Scope, v: Value, tok: Token) -> None:
        if v.name in scope.names:
            raise self.error(f"value '%{v.name}' is defined twice in this graph (SSA: one "
                             "definition per name)", tok)
        scope.names[v.name] = v

    def use(self, scope: _Scope) -> Optional[Value]:
        if self.accept_word("none"):
            return None
        if not self.at(VALUE):
            raise self.expected("a value ('%name') or 'none'")
        tok = self.next()
        v = scope.lookup(tok.value)
        if v is None:
            raise self.error(f"value '%{tok.value}' is not defined before this use (define a "
                             "value before using it; subgraphs may use outer values)", tok)
        return v

    # -- node -----------------------------------------------------------------------------------
    def node(self, scope: _Scope, outputs: List[Value]) -> Node:
        op = self.ident("an operator name")
        domain = ""
        if self.accept("::"):
            domain, op = op, self.ident("the operator name after '::'")
        overload = ""
        if self.accept("<"):
            overload = self.ident("the overload name")
            self.expect(">")
        self.expect("(", f"to open the inputs of {op}")
        inputs = self.comma_list(")", lambda: self.use(scope))
        attrs: List[Attr] = []
        if self.accept("{"):
            attrs = self.comma_list("}", lambda: self.attr(scope))
            seen = set()
            for a in attrs:
                if a.name in seen:
                    raise self.error(f"attribute '{a.name}' of {op} is given twice")
                seen.add(a.name)
        name, prov, doc, meta = "", None, "", {}
        while True:
            if self.accept_word("name"):
                name = self.text("the node name")
            elif self.accept_word("loc"):
                self.expect("(")
                prov = tuple(self.comma_list(")", self.text))
            elif self.accept_word("doc"):
                doc = self.text()
            elif self.accept_word("meta"):
                meta = self.str_dict()
            else:
                break
        if prov is None:
            prov = (name,) if name else ()
        return Node(domain, op, inputs, attrs, outputs, name=name, overload=overload,
                    doc_string=doc, provenance=prov, metadata_props=meta)

    # -- attributes -----------------------------------------------------------------------------
    def attr(self, scope: Optional[_Scope]) -> Attr:
        name_tok = self.tok
        name = self.ident("an attribute name")
        self.expect("=", f"after attribute name '{name}'")
        value_tok = self.tok
        if self.accept("@"):
            ref = self.ident("the referenced attribute name")
            kind = self.kind_annotation(required=True)
            a = Attr(name, kind, None, ref_attr_name=ref)
        else:
            kind, value = self.attr_value(scope)
            declared = self.kind_annotation(required=False)
            if declared is not None:
                kind, value = self.convert(kind, value, declared, value_tok, name)
            if kind is None:
                raise self.error(f"attribute '{name}': the kind of an empty list is unknown; "
                                 "write e.g. '[] : ints'", value_tok)
            a = Attr(name, kind, value)
        if self.accept_word("doc"):
            a.doc_string = self.text()
        del name_tok
        return a

    def kind_annotation(self, required: bool) -> Optional[AttrType]:
        if not self.accept(":"):
            if required:
                raise self.expected("':' and the attribute kind (e.g. ': float')")
            return None
        tok = self.tok
        word = self.ident("an attribute kind")
        if word not in _KINDS:
            raise self.error(f"unknown attribute kind '{word}' (one of {', '.join(_KINDS)})", tok)
        return _KINDS[word]

    def convert(self, kind, value, declared, tok, name):
        if kind == declared:
            return kind, value
        if kind is None and declared in _ELEM_OF:  # empty list
            return declared, ()
        if declared == AttrType.FLOAT and kind == AttrType.INT:
            return declared, float(np.float32(value))
        if declared == AttrType.FLOATS and kind == AttrType.INTS:
            return declared, tuple(float(np.float32(v)) for v in value)
        raise self.error(f"attribute '{name}' is written as {_kind_name(kind)} but annotated "
                         f"{_kind_name(declared)}", tok)

    def attr_value(self, scope: Optional[_Scope]):
        """(kind, value) of one attribute value; kind None for an empty list."""
        if self.accept("["):
            start = self.tok
            items = self.comma_list("]", lambda: self.attr_value(scope))
            if not items:
                return None, ()
            kinds = {k for k, _ in items}
            if kinds == {AttrType.INT, AttrType.FLOAT}:
                return AttrType.FLOATS, tuple(float(np.float32(v)) for _, v in items)
            if len(kinds) != 1 or next(iter(kinds)) not in _LIST_OF:
                raise self.error("a list attribute needs items of one kind", start)
            return _LIST_OF[kinds.pop()], tuple(v for _, v in items)
        t = self.tok
        if t.kind == INT:
            return AttrType.INT, self.next().value
        if t.kind == FLOAT or (t.kind == NAME and t.value in ("nan", "inf")):
            return AttrType.FLOAT, float(np.float32(self.scalar()))
        if t.kind == STRING:
            return AttrType.STRING, as_text(self.next().value)
        if t.kind == NAME:
            if t.value == "graph":
                self.next()
                return AttrType.GRAPH, self.graph_rest(scope)
            if t.value == "sparse":
                return AttrType.SPARSE_TENSOR, self.sparse()
            if t.value == "type":
                self.next()
                self.expect("<")
                ty = self.type_or_unknown()
                self.expect(">")
                return AttrType.TYPE_PROTO, ty
            if t.value in _DTYPES:
                return AttrType.TENSOR, self.tensor(None)
        raise self.expected("an attribute value (number, string, tensor, graph, sparse<...>, "
                            "type<...>, [list] or @ref)")

    def scalar(self):
        t = self.next()
        if t.kind in (INT, FLOAT):
            return t.value
        if t.kind == STRING:
            return t.value
        if t.kind == NAME and t.value in ("nan", "inf"):
            return math.nan if t.value == "nan" else math.inf
        if t.kind == NAME and t.value in ("true", "false"):
            return t.value == "true"
        self.pos -= 1
        raise self.expected("a number, nan, inf, true, false or a string")

    # -- tensors --------------------------------------------------------------------------------
    def tensor(self, name: Optional[str]) -> Tensor:
        """``dtype[dims] data [{name = ..., doc = ..., meta = {...}}]``."""
        tok = self.tok
        dtype = self.dtype()
        self.expect("[", "to open the tensor's dims")
        dims = tuple(self.comma_list("]", lambda: self.int_("a dimension size")))
        size = int(np.prod(dims, dtype=np.int64))
        nbytes = (size * dtype.bitwidth + 7) // 8
        what = f"{dtype.short_name}[{','.join(map(str, dims))}]"
        data_tok = self.tok
        if self.accept_word("dense"):
            self.expect("<")
            values = self.comma_list(">", self.scalar)
            if len(values) != size:
                raise self.error(f"{what} needs {size} elements, found {len(values)}", data_tok)
            try:
                t = Tensor(scalars_to_array(values, dtype, dims), dtype=dtype)
            except ValueError as e:
                raise self.error(f"{what}: {e}", data_tok) from None
        elif self.accept_word("hex"):
            self.expect("<")
            raw = self.string("a hex string")
            self.expect(">")
            try:
                data = bytes.fromhex(raw.decode("ascii"))
            except ValueError:
                raise self.error("hex<...> holds a string of hex digits", data_tok) from None
            if dtype == DataType.STRING or len(data) != nbytes:
                raise self.error(f"{what} needs {nbytes} bytes, hex<...> holds {len(data)}",
                                 data_tok)
            t = Tensor(data, dtype=dtype, dims=dims)
        elif self.accept("@"):
            t = self.reference(dtype, dims, nbytes, what, data_tok)
        else:
            raise self.expected(f"the data of {what}: dense<...>, hex<\"...\">, @raw(...) or "
                                "@onnx(...)")
        del tok
        t.name = name or ""
        if self.accept("{"):
            def prop():
                key = self.ident("name, doc or meta")
                self.expect("=")
                if key == "name":
                    t.name = self.text()
                elif key == "doc":
                    t.doc_string = self.text()
                elif key == "meta":
                    t.metadata_props = self.str_dict()
                else:
                    raise self.error(f"unknown tensor property '{key}' (name, doc, meta)",
                                     self.toks[self.pos - 2])
            self.comma_list("}", prop)
        return t

    def reference(self, dtype, dims, nbytes, what, tok) -> Tensor:
        kind = self.ident("'raw' or 'onnx'")
        self.expect("(")
        where = self.text("a file path")
        path = where if os.path.isabs(where) else os.path.join(self.base_dir, where)
        if not os.path.isfile(path):
            raise self.error(f"{what}: file '{where}' not found (looked in {self.base_dir})", tok)
        if kind == "raw":
            self.expect(",")
            offset = self.int_("the byte offset")
            self.expect(",")
            length = self.int_("the byte length")
            self.expect(")")
            if length != nbytes:
                raise self.error(f"{what} needs {nbytes} bytes, @raw gives {length}", tok)
            if offset + length > os.path.getsize(path):
                raise self.error(f"{what}: '{where}' has {os.path.getsize(path)} bytes, fewer "
                                 f"than offset + length = {offset + length}", tok)
            return Tensor(ExternalLocation(os.path.realpath(path), where, offset, length),
                          dtype=dtype, dims=dims)
        if kind != "onnx":
            raise self.error(f"unknown reference '@{kind}' (use @raw or @onnx)", tok)
        self.expect(",")
        if self.accept_word("node"):
            key = ("node", self.text("the node name"))
            self.expect(",")
            key += (self.text("the attribute name"),)
        elif self.accept_word("tensor"):
            key = ("tensor", self.text("the tensor name"))
        else:
            key = ("init", self.text("the initializer name"))
        self.expect(")")
        try:
            t = SourceIndex.get(path).tensor(key)
        except Exception as e:  # onnx's DecodeError and friends
            raise self.error(f"cannot read '{where}' as ONNX: {e}", tok) from None
        if os.path.abspath(path) not in self.sources:
            self.sources.append(os.path.abspath(path))
        if t is None:
            raise self.error(f"'{where}' has no tensor {' '.join(key[1:])!r}", tok)
        if t.dtype != dtype or t.dims != tuple(dims):
            raise self.error(f"tensor {key[-1]!r} in '{where}' is {t.dtype.short_name}"
                             f"[{','.join(map(str, t.dims))}], not {what}", tok)
        return t

    def sparse(self) -> onnx.SparseTensorProto:
        self.expect_word("sparse")
        self.expect("<")
        self.expect("[")
        dims = self.comma_list("]", self.int_)
        self.expect(",")
        values = self.tensor(None)
        self.expect(",")
        indices = self.tensor(None)
        self.expect(">")
        sp = onnx.SparseTensorProto()
        sp.dims.extend(dims)
        sp.values.CopyFrom(tensor_to_proto(values))
        sp.indices.CopyFrom(tensor_to_proto(indices))
        return sp

    # -- types ----------------------------------------------------------------------------------
    def dtype(self) -> DataType:
        tok = self.tok
        word = self.ident("an element type (f32, i64, bf16, ...)")
        if word not in _DTYPES:
            raise self.error(f"unknown element type '{word}' (e.g. f32, f16, bf16, i64, bool, "
                             "str)", tok)
        return DataType.from_short_name(word)

    def type_or_unknown(self) -> Optional[Type]:
        if self.accept("?"):
            return None
        if self.at_word("sparse") or self.at_word("seq") or self.at_word("opt") or \
                self.at_word("map"):
            word = self.next().value
            self.expect("<")
            if word == "sparse":
                inner = self.type_or_unknown()
                if not isinstance(inner, TensorType):
                    raise self.expected("a tensor type inside sparse<...>")
                t: Type = SparseTensorType(inner.dtype, inner.shape)
            elif word == "map":
                key = self.dtype()
                self.expect(",")
                t = MapType(key, self.type_or_unknown())
            else:
                elem = self.type_or_unknown()
                t = SequenceType(elem) if word == "seq" else OptionalType(elem)
            self.expect(">")
        else:
            dtype = self.dtype()
            self.expect("[", "to open the shape ('[*]' for an unknown rank)")
            if self.accept("*"):
                self.expect("]")
                shape = None
            else:
                dims = self.comma_list("]", self.dim)
                shape = Shape(tuple(d for d, _ in dims), tuple(den for _, den in dims)
                              if any(den for _, den in dims) else ())
            t = TensorType(dtype, shape)
        if self.accept_word("denote"):
            t = dataclasses.replace(t, denotation=self.text())
        return t

    def dim(self):
        if self.accept("?"):
            d = None
        elif self.at(INT):
            d = self.next().value
        elif self.at(NAME) or self.at(STRING):
            d = self.ident()
        else:
            raise self.expected("a dimension (size, symbolic name or '?')")
        den = self.text() if self.accept_word("denote") else ""
        return d, den


def tensor_to_proto(t: Tensor) -> onnx.TensorProto:
    """A :class:`Tensor` as an ``onnx.TensorProto`` (raw data; ``string_data`` for strings)."""
    tp = onnx.TensorProto()
    tp.name = t.name
    tp.data_type = int(t.dtype)
    tp.dims.extend(t.dims)
    if t.dtype == DataType.STRING:
        tp.string_data.extend(x if isinstance(x, bytes) else str(x).encode("utf-8")
                              for x in t.numpy().reshape(-1))
    else:
        tp.raw_data = t.tobytes()
    return tp


def _show(t: Optional[Type]) -> str:
    from passctl.ir.printer import type_text
    return type_text(t)


def _kind_name(kind) -> str:
    return "an empty list" if kind is None else ATTR_KIND_NAMES[list(_KINDS.values()).index(kind)]
