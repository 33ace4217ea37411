"""Well-formedness checks of the IR (SSA, scoping, use lists, op schemas, types) as diagnostics."""

from __future__ import annotations

import functools
import logging
from typing import Dict, Iterable, List, Optional, Sequence, Set, Union

import onnx
import onnx.defs

from passctl.ir._core import Function, Graph, Model, Node, Value
from passctl.ir._types import SparseTensorType, TensorType
from passctl.ir.diagnostics import (ARITY, ATTRIBUTE, DANGLING_USE, DUPLICATE_NAME, KINDS,
                                    OUTPUT_TYPE, SSA, SUBGRAPH_SCOPE, TYPE, UNDEFINED_OUTPUT,
                                    UNKNOWN_OP, USE_BEFORE_DEF, USE_LIST, Diagnostic, type_string)
from passctl.ir.errors import PassctlError

logger = logging.getLogger(__name__)

__all__ = ["ARITY", "ATTRIBUTE", "DANGLING_USE", "DUPLICATE_NAME", "Diagnostic", "KINDS",
           "OUTPUT_TYPE", "SSA", "SUBGRAPH_SCOPE", "TYPE", "UNDEFINED_OUTPUT", "UNKNOWN_OP",
           "USE_BEFORE_DEF", "USE_LIST", "VerificationError", "format_node_fallback", "type_string",
           "verify", "verify_or_raise"]

class VerificationError(PassctlError):
    """The IR does not verify; ``diagnostics`` holds every diagnostic, ``str()`` the errors."""

    def __init__(self, diagnostics: Sequence[Diagnostic]):
        self.diagnostics = list(diagnostics)
        errors = [d for d in self.diagnostics if d.severity == "error"]
        head = f"the IR does not verify: {len(errors)} error(s)"
        super().__init__("\n".join([head] + [str(d) for d in errors]))


def verify(model_or_graph: Union[Model, Graph], check_output_types: bool = True,
           opset_imports: Optional[Dict[str, int]] = None) -> List[Diagnostic]:
    """Check that a model (or a lone graph) is well formed.

    Checks, each reported with its own ``kind`` (see :data:`KINDS`): SSA and duplicate value names;
    use before definition; dangling uses; use lists against the nodes' inputs; graph outputs
    defined; subgraph scoping; negative dims in value shapes (``type``); arity, attributes and
    input types against the ONNX op schemas
    (``onnx.defs.get_schema`` at the model's opset for the node's domain; an op the default ONNX
    domain does not define at all is an ``unknown-op`` error, one it defines only from a later
    opset, or that only ONNX Runtime registers there (its contrib ops), an ``unknown-op`` warning; ops of other domains, i.e. custom ops, are not checked); model-local function bodies. With ``check_output_types``
    (models only), each declared graph-output type is compared with what ONNX shape inference
    computes from the exported model (``onnx.shape_inference``, then ONNX Runtime's symbolic shape
    inference where ONNX's leaves a shape unknown); a disagreement is a WARNING. That check exports
    the whole model, so callers that verify often (verify-each) should turn it off.

    Args:
        model_or_graph: the :class:`Model`, or a :class:`Graph` (then ``opset_imports`` or the
            newest ONNX opset is used).
        check_output_types: run the shape-inference comparison of graph outputs.
        opset_imports: domain -> version for a lone graph.

    Returns:
        The diagnostics, errors and warnings, in graph order (empty when the IR is well formed).
    """
    if isinstance(model_or_graph, Model):
        model: Optional[Model] = model_or_graph
        graph = model_or_graph.graph
        opsets = dict(model_or_graph.opset_imports)
        functions = model_or_graph.functions
    else:
        model, graph, functions = None, model_or_graph, {}
        opsets = dict(opset_imports or {"": onnx.defs.onnx_opset_version()})
    diags: List[Diagnostic] = []
    _GraphChecker(diags, opsets, functions).run(graph)
    for fn in functions.values():
        _GraphChecker(diags, dict(fn.opset_imports), functions, fn).run(fn.graph)
    if model is not None and check_output_types:
        from passctl.ir.verifier_types import output_type_diagnostics

        diags.extend(output_type_diagnostics(model))
    _attach_ir_lines(model, graph, diags)
    return diags


def verify_or_raise(model_or_graph: Union[Model, Graph], **kwargs) -> List[Diagnostic]:
    """Run :func:`verify`; raise if it finds an error, else return the warnings.

    Raises:
        VerificationError: at least one diagnostic has severity ``"error"``.
    """
    diags = verify(model_or_graph, **kwargs)
    if any(d.severity == "error" for d in diags):
        raise VerificationError(diags)
    return diags


class _GraphChecker:
    """Walks a graph and its subgraphs in order, tracking which values are visible."""

    def __init__(self, diags: List[Diagnostic], opsets: Dict[str, int], functions: Dict,
                 function: Optional[Function] = None):
        self.diags = diags
        self.opsets = opsets
        self.functions = functions
        self.function = function
        self.names: Dict[str, Value] = {}
        self.nodes: Set[Node] = set()

    def error(self, kind: str, message: str, node: Optional[Node] = None,
              highlight: Optional[str] = None, severity: str = "error",
              in_operands: bool = False) -> None:
        self.diags.append(Diagnostic(severity, kind, message, node, highlight=highlight,
                                     in_operands=in_operands))

    def run(self, graph: Graph) -> None:
        self.nodes = set(graph.all_nodes())
        self._walk(graph, set(), set())
        self._check_use_lists(graph)

    # -- scoping, SSA, names ---------------------------------------------------------------------
    def _define(self, v: Value, defined: Set[Value], node: Optional[Node], what: str) -> None:
        self._check_dims(v, node)
        if v in defined:
            first = f"{v.producer!r}" if v.producer is not None and v.producer is not node \
                else "a graph input or initializer"
            self.error(SSA, f"value '%{v.name}' is defined twice: by {what}, and before that by "
                       f"{first}", node, v.name)
        defined.add(v)
        if v.name:
            other = self.names.setdefault(v.name, v)
            if other is not v:
                self.error(DUPLICATE_NAME, f"two distinct values are named '%{v.name}' "
                           f"({what} and {_describe(other)}); rename one", node, v.name)

    def _walk(self, graph: Graph, outer_visible: Set[Value], outer_all: Set[Value]) -> None:
        defined: Set[Value] = set(outer_visible)
        for v in graph.inputs:
            self._define(v, defined, None, f"an input of graph '{graph.name}'")
        for v in graph.initializers.values():
            if not any(v is i for i in graph.inputs):
                self._define(v, defined, None, f"an initializer of graph '{graph.name}'")
        local = {o for n in graph for o in n.outputs}
        here_all = outer_all | local | set(graph.inputs) | set(graph.initializers.values())
        for node in graph:
            for i, v in enumerate(node.inputs):
                if v is None or v in defined:
                    continue
                self._undefined_use(node, i, v, graph, local, outer_all)
            for sub in node.subgraphs():
                self._walk(sub, defined, here_all)
            for i, v in enumerate(node.outputs):
                if v.producer is not node or v.index != i:
                    self.error(SSA, f"value '%{v.name}' is output {i} of {node!r} but records "
                               f"output {v.index} of {v.producer!r} as its producer", node, v.name)
                    continue
                self._define(v, defined, node, f"{node!r}")
            self._check_schema(node)
        for i, v in enumerate(graph.outputs):
            if v is not None and v not in defined:
                self.error(UNDEFINED_OUTPUT, f"output {i} '%{v.name}' of graph '{graph.name}' is "
                           f"not defined in it or an enclosing scope ({_describe(v)})",
                           graph.parent, v.name)

    def _check_dims(self, v: Value, node: Optional[Node]) -> None:
        """A shape dim is a size >= 0, a name or unknown; a negative int (an ONNX ``dim_value``
        of -1 read as a size) would pass for a static dim."""
        if not isinstance(v.type, (TensorType, SparseTensorType)) or v.type.shape is None:
            return
        shape = v.type.shape
        bad = [d for d in shape.dims if isinstance(d, int) and d < 0]
        if bad:
            self.error(TYPE, f"value '%{v.name}' has a negative dim {bad[0]} in its shape "
                       f"{list(shape.dims)}; an unknown size is None ('?' in the text form)",
                       node, v.name)

    def _undefined_use(self, node: Node, i: int, v: Value, graph: Graph, local: Set[Value],
                       outer_all: Set[Value]) -> None:
        what = f"input {i} '%{v.name}' of {node!r}"
        if v in local:
            self.error(USE_BEFORE_DEF, f"{what} is used before its producer {v.producer!r} "
                       "defines it (the nodes are not in topological order; Graph.sort() orders "
                       "them, unless they form a cycle)", node, v.name,
                       in_operands=True)
        elif v in outer_all:
            self.error(SUBGRAPH_SCOPE, f"{what} reads an outer-scope value that is defined after "
                       f"the node holding subgraph '{graph.name}' ({_describe(v)})", node, v.name,
                       in_operands=True)
        else:
            self.error(DANGLING_USE, f"{what} is defined nowhere in scope ({_describe(v)})",
                       node, v.name, in_operands=True)

    # -- use lists ---------------------------------------------------------------------------------
    def _check_use_lists(self, graph: Graph) -> None:
        values: Dict[Value, None] = {}
        for g in [graph] + [s for n in graph.all_nodes() for s in n.subgraphs()]:
            values.update(dict.fromkeys(g.inputs))
            values.update(dict.fromkeys(g.initializers.values()))
        for n in graph.all_nodes():
            for i, v in enumerate(n.inputs):
                if v is None:
                    continue
                values[v] = None
                if (n, i) not in v._uses:
                    self.error(USE_LIST, f"input {i} '%{v.name}' of {n!r} is missing from the "
                               "value's use list", n, v.name, in_operands=True)
            values.update(dict.fromkeys(n.outputs))
        for v in values:
            for user, i in v.uses():
                if user not in self.nodes and user.graph is None:
                    self.error(USE_LIST, f"value '%{v.name}' lists a use by {user!r}, which is in no "
                               "graph (a removed node kept its inputs)", v.producer, v.name)
                elif user in self.nodes and (i >= len(user.inputs) or user.inputs[i] is not v):
                    self.error(USE_LIST, f"value '%{v.name}' lists a use as input {i} of {user!r}, "
                               "but that input is another value", user, v.name)

    # -- op schemas --------------------------------------------------------------------------------
    def _check_schema(self, node: Node) -> None:
        fn = self.functions.get((node.domain, node.op_type, node.overload))
        if fn is not None:
            self._check_function_call(node, fn)
            return
        domain = "" if node.domain == "ai.onnx" else node.domain
        version = self.opsets.get(domain, self.opsets.get("ai.onnx") if domain == "" else None)
        if version is None:
            return
        schema = _schema(node.op_type, version, domain)
        if schema is None:
            if domain == "":
                # An op ONNX defines only from a later opset is a warning: ONNX Runtime still
                # runs some of them (e.g. LayerNormalization below opset 17, a contrib kernel
                # registered in the default domain), and fusion passes emit them.
                known = onnx.defs.has(node.op_type) or node.op_type in _ort_default_ops()
                self.error(UNKNOWN_OP, _unknown_op_message(node, version), node,
                           severity="warning" if known else "error")
            return
        from passctl.ir.verifier_schema import check_node_against_schema

        check_node_against_schema(self, node, schema, in_function=self.function is not None)

    def _check_function_call(self, node: Node, fn: Function) -> None:
        if len(node.inputs) > len(fn.graph.inputs):
            self.error(ARITY, f"{node!r} has {len(node.inputs)} inputs; function "
                       f"'{fn.domain}::{fn.name}' takes at most {len(fn.graph.inputs)}", node)
        if len(node.outputs) > len(fn.graph.outputs):
            self.error(ARITY, f"{node!r} has {len(node.outputs)} outputs; function "
                       f"'{fn.domain}::{fn.name}' has {len(fn.graph.outputs)}", node)
        known = set(fn.attributes) | {a.name for a in fn.attribute_defaults}
        for name in node.attributes:
            if name not in known:
                self.error(ATTRIBUTE, f"{node!r} has attribute '{name}', which function "
                           f"'{fn.domain}::{fn.name}' does not declare", node, name)


@functools.lru_cache(maxsize=1)
def _ort_default_ops() -> frozenset:
    """Ops ONNX Runtime registers in the default domain beyond ONNX's own (its contrib kernels,
    e.g. ``SimplifiedLayerNormalization``); empty when onnxruntime is not installed."""
    try:
        from onnxruntime.capi import _pybind_state
    except ImportError:
        return frozenset()
    try:
        schemas = _pybind_state.get_all_operator_schema()
    except Exception:  # a build without schema export
        return frozenset()
    return frozenset(s.name for s in schemas if s.domain in ("", "ai.onnx"))


def _unknown_op_message(node: Node, version: int) -> str:
    """Why the default ONNX domain has no ``node.op_type`` at opset ``version``, and what to do."""
    if not onnx.defs.has(node.op_type) and node.op_type in _ort_default_ops():
        return (f"{node!r}: op '{node.op_type}' is an ONNX Runtime op in the default domain, not "
                "an ONNX op; runtimes other than ONNX Runtime may not run it")
    if onnx.defs.has(node.op_type):
        since = min(s.since_version for s in onnx.defs.get_all_schemas_with_history()
                    if s.name == node.op_type and s.domain == "")
        return (f"{node!r}: op '{node.op_type}' exists in ONNX only from opset {since}, the model "
                f"imports opset {version}; raise the model's opset or use another op")
    import difflib

    names = sorted({s.name for s in onnx.defs.get_all_schemas() if s.domain == ""})
    close = difflib.get_close_matches(node.op_type, names, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return (f"{node!r}: op '{node.op_type}' is not an ONNX op (default domain, opset {version}); "
            f"{hint}a custom op needs its own domain")


@functools.lru_cache(maxsize=4096)
def _schema(op_type: str, version: int, domain: str):
    try:
        return onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return None


def _describe(v: Value) -> str:
    if v.producer is not None:
        where = f"graph '{v.producer.graph.name}'" if v.producer.graph is not None else "no graph"
        return f"produced by {v.producer!r} in {where}"
    if v.graph is not None:
        return f"an input or initializer of graph '{v.graph.name}'"
    return "no producer, not a graph input or initializer"


def _attach_ir_lines(model: Optional[Model], graph: Graph, diags: Iterable[Diagnostic]) -> None:
    """Fill ``ir_line`` and ``line`` of diagnostics that name a node (printer when available)."""
    with_node = [d for d in diags if d.node is not None]
    if not with_node:
        return
    line_map: Dict[Node, int] = {}
    fmt = None
    try:
        from passctl.ir import printer

        fmt = printer.format_node
        if model is not None:
            printer.print_model(model, line_map=line_map)
        else:
            printer.print_graph(graph, line_map=line_map)
    except Exception as e:  # noqa: BLE001 - the printer is optional here; fall back to one line
        logger.debug("verifier: IR printer unavailable (%s); using one-line rendering", e)
    for d in with_node:
        # The line is format_node's rendering (print_model may rename clashing values); the number
        # is where print_model put the node.
        d.line = line_map.get(d.node)
        try:
            d.ir_line = fmt(d.node).strip() if fmt is not None else format_node_fallback(d.node)
        except Exception:  # noqa: BLE001 - a broken node must still get a diagnostic
            d.ir_line = format_node_fallback(d.node)


def format_node_fallback(node: Node) -> str:
    """A simple one-line rendering, ``%y = Add(%a, %b) {axis=1}``, used when no printer exists."""
    outs = ", ".join(f"%{v.name}" for v in node.outputs)
    ins = ", ".join("%" + v.name if v is not None else "None" for v in node.inputs)
    attrs = ", ".join(f"{k}={_short(a.value)}" for k, a in node.attributes.items())
    text = f"{node.qualified_op}({ins})" + (f" {{{attrs}}}" if attrs else "")
    return f"{outs} = {text}" if outs else text


def _short(value) -> str:
    text = repr(value) if not isinstance(value, Graph) else f"<graph {value.name}>"
    return text if len(text) <= 40 else text[:37] + "..."
