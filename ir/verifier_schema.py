"""Verifier checks of one node against its ONNX op schema: arity, attributes, input types."""

from __future__ import annotations

from typing import Dict, Tuple

import onnx.defs

from passctl.ir._core import Node

_Option = onnx.defs.OpSchema.FormalParameterOption


def check_node_against_schema(checker, node: Node, schema: onnx.defs.OpSchema,
                              in_function: bool = False) -> None:
    """Report arity, attribute and type problems of ``node`` through ``checker.error``.

    Source of the rules: ``onnx::OpSchema::Verify`` (onnx/defs/schema.cc): input/output counts
    within ``[min, max]``, required (``Single``) inputs present, attribute names known, required
    attributes present, attribute kinds as declared; and the type constraints (each input's type in
    its parameter's allowed set, one type per constraint parameter across homogeneous inputs).

    Args:
        checker: the verifier's graph checker (its ``error(kind, message, node, highlight)``).
        node: the node, whose op the schema describes.
        schema: ``onnx.defs.get_schema(op_type, opset, domain)``.
        in_function: the node is in a function body (attributes may refer to the caller's).
    """
    from passctl.ir.diagnostics import ARITY, ATTRIBUTE

    op = f"{schema.name} (opset {schema.since_version})"
    n_in, n_out = len(node.inputs), len(node.outputs)
    if n_in < schema.min_input or n_in > schema.max_input:
        checker.error(ARITY, f"{node!r} has {n_in} inputs; {op} takes "
                      f"{_range(schema.min_input, schema.max_input)}", node)
    if n_out < schema.min_output or n_out > schema.max_output:
        checker.error(ARITY, f"{node!r} has {n_out} outputs; {op} produces "
                      f"{_range(schema.min_output, schema.max_output)}", node)
    for i, formal in enumerate(schema.inputs):
        if formal.option == _Option.Single and i < n_in and node.inputs[i] is None:
            checker.error(ARITY, f"{node!r} omits input {i} '{formal.name}', which {op} requires",
                          node)
    declared = schema.attributes
    for name, attr in node.attributes.items():
        spec = declared.get(name)
        if spec is None:
            checker.error(ATTRIBUTE, f"{node!r} has attribute '{name}', which {op} does not "
                          f"declare (known: {', '.join(sorted(declared)) or 'none'})", node, name)
        elif int(spec.type) != int(attr.type):
            checker.error(ATTRIBUTE, f"{node!r} attribute '{name}' is {attr.type.name}; {op} "
                          f"declares it {spec.type.name}", node, name)
    for name, spec in declared.items():
        if spec.required and name not in node.attributes:
            checker.error(ATTRIBUTE, f"{node!r} lacks attribute '{name}', which {op} requires",
                          node)
    _check_types(checker, node, schema, op)


def _check_types(checker, node: Node, schema: onnx.defs.OpSchema, op: str) -> None:
    from passctl.ir.diagnostics import TYPE, type_string

    formals = list(schema.inputs)
    if not formals:
        return
    constraints = {tc.type_param_str: set(tc.allowed_type_strs) for tc in schema.type_constraints}
    bound: Dict[str, Tuple[str, int]] = {}
    last = formals[-1]
    for i, v in enumerate(node.inputs):
        if v is None:
            continue
        if i < len(formals):
            formal = formals[i]
        elif last.option == _Option.Variadic:
            formal = last
        else:
            break
        ts = type_string(v.type)
        if ts is None:
            continue
        allowed = constraints.get(formal.type_str, {formal.type_str})
        if ts not in allowed:
            checker.error(TYPE, f"input {i} '%{v.name}' of {node!r} is {ts}; {op} allows "
                          f"{_allowed(allowed)} for '{formal.name}' ({formal.type_str})", node,
                          v.name, in_operands=True)
            continue
        if formal.type_str not in constraints:
            continue
        if formal.option == _Option.Variadic and not formal.is_homogeneous:
            continue
        prev = bound.setdefault(formal.type_str, (ts, i))
        if prev[0] != ts:
            checker.error(TYPE, f"input {i} '%{v.name}' of {node!r} is {ts} but input {prev[1]} is "
                          f"{prev[0]}; {op} needs one type for {formal.type_str}", node, v.name,
                          in_operands=True)


def _range(lo: int, hi: int) -> str:
    if lo == hi:
        return str(lo)
    return f"{lo} or more" if hi >= 2**31 - 1 else f"{lo} to {hi}"


def _allowed(allowed) -> str:
    items = sorted(allowed)
    return ", ".join(items) if len(items) <= 6 else ", ".join(items[:6]) + ", ..."
