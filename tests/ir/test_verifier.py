"""Tests of passctl.ir.verifier: one broken graph per diagnostic kind, clean graphs, the corpus."""

from __future__ import annotations

import pytest

from passctl.ir import (Attr, AttrType, Builder, DataType, Function, Graph, Model, Node, Shape,
                        TensorType, Value)
from passctl.ir import verifier as V
from passctl.ir.errors import PassctlError
from passctl.ir.onnx_import import load
from passctl.ir.printer import format_node


def f32(*dims):
    return TensorType(DataType.FLOAT, Shape(dims))


def i64(*dims):
    return TensorType(DataType.INT64, Shape(dims))


def small_model():
    """x: f32[2, 3] -> Relu -> Add(relu, x) -> output; returns (model, relu node, add node)."""
    x = Value("x", f32(2, 3))
    g = Graph([x], name="main")
    b = Builder(g)
    y = b.op("Relu", x, name="relu")
    z = b.op("Add", y, x, name="add")
    y.type = z.type = f32(2, 3)
    g.outputs.append(z)
    return Model(g, {"": 21}), y.producer, z.producer


def only(diags, kind, severity="error"):
    """The single diagnostic; fails unless there is exactly one and it has this kind/severity."""
    assert [(d.severity, d.kind) for d in diags] == [(severity, kind)], [str(d) for d in diags]
    return diags[0]


def assert_shows_node(d, node, token=None):
    """str(d) names the node and its op, shows its IR line and a caret under ``token``."""
    text = str(d)
    assert d.node is node
    assert f"node '{node.name}' ({node.op_type})" in text
    assert d.ir_line is not None and d.ir_line == format_node(node).strip()
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.endswith(d.ir_line))
    code_col = lines[at].index(d.ir_line)
    carets = lines[at + 1]
    start = carets.index("^")
    width = len(carets) - start
    assert set(carets[start:]) == {"^"}
    underlined = lines[at][start:start + width]
    if token is None:
        assert underlined == d.ir_line
    else:
        assert underlined == token
        # The caret is under an occurrence of the token inside the IR line.
        assert d.ir_line[start - code_col:start - code_col + width] == token


def test_clean_model_has_no_diagnostics():
    model, _, _ = small_model()
    assert V.verify(model) == []
    assert V.verify_or_raise(model) == []


def test_ssa_value_defined_twice():
    model, relu, _ = small_model()
    model.graph.add_input(relu.outputs[0])  # now both a graph input and Relu's output
    d = only(V.verify(model, check_output_types=False), V.SSA)
    assert "defined twice" in d.message and "'%relu_out'" in d.message
    assert_shows_node(d, relu, "%relu_out")


def test_duplicate_value_name():
    model, relu, add = small_model()
    add.outputs[0].name = "relu_out"
    d = only(V.verify(model, check_output_types=False), V.DUPLICATE_NAME)
    assert "two distinct values are named '%relu_out'" in d.message
    assert_shows_node(d, add, "%relu_out")


def test_use_before_definition():
    x = Value("x", f32(2, 3))
    g = Graph([x], name="main")
    relu = Node("", "Relu", [x], name="relu", outputs=[Value("r", f32(2, 3))])
    add = Node("", "Add", [relu.outputs[0], x], name="add", outputs=[Value("s", f32(2, 3))])
    g.append(add)  # the consumer comes before Relu
    g.append(relu)
    g.outputs.append(add.outputs[0])
    model = Model(g, {"": 21})
    d = only(V.verify(model, check_output_types=False), V.USE_BEFORE_DEF)
    assert "input 0 '%r'" in d.message and "Relu 'relu'" in d.message
    assert_shows_node(d, add, "%r")
    g.sort()
    assert V.verify(model) == []


def test_dangling_use():
    model, _, add = small_model()
    ghost = Value("ghost", f32(2, 3))
    add.set_input(1, ghost)
    d = only(V.verify(model, check_output_types=False), V.DANGLING_USE)
    assert "input 1 '%ghost'" in d.message and "defined nowhere" in d.message
    assert_shows_node(d, add, "%ghost")


def test_use_list_inconsistent_with_inputs():
    model, relu, add = small_model()
    # Break the internal invariant on purpose (the public API cannot): bypass set_input.
    add._inputs = (add.inputs[0], relu.outputs[0])
    diags = V.verify(model, check_output_types=False)
    # Both sides of the one inconsistency: relu_out lacks the use, x keeps a use that is gone.
    assert [d.kind for d in diags] == [V.USE_LIST, V.USE_LIST]
    d = diags[0]
    assert "input 1 '%relu_out'" in d.message and "missing from the value's use list" in d.message
    assert_shows_node(d, add, "%relu_out")
    assert "value '%x' lists a use as input 1 of Node(Add 'add')" in diags[1].message
    assert diags[1].node is add


def test_stale_use_by_node_outside_the_graph():
    model, relu, add = small_model()
    x = model.graph.inputs[0]
    stray = Node("", "Neg", [x], name="stray")  # never inserted, but it registered a use of x
    d = only(V.verify(model, check_output_types=False), V.USE_LIST)
    assert "'%x'" in d.message and "Neg 'stray'" in d.message and "in no graph" in d.message
    stray.set_inputs(())
    assert V.verify(model, check_output_types=False) == []


def test_graph_output_undefined():
    model, _, _ = small_model()
    model.graph.outputs.append(Value("nowhere", f32(2, 3)))
    d = only(V.verify(model, check_output_types=False), V.UNDEFINED_OUTPUT)
    assert "output 1 '%nowhere' of graph 'main'" in d.message
    assert d.node is None and d.ir_line is None


def _if_node(x: Value, read: Value, name: str = "if") -> Node:
    """If(x) whose branches output ``read`` through an Identity (an outer-scope read)."""
    then = Graph(name="then")
    ident = Node("", "Identity", [read], name="then_id")
    then.append(ident)
    then.outputs.append(ident.outputs[0])
    els = Graph(name="else")
    ident2 = Node("", "Identity", [read], name="else_id")
    els.append(ident2)
    els.outputs.append(ident2.outputs[0])
    return Node("", "If", [x], {"then_branch": then, "else_branch": els}, name=name)


def test_subgraph_reads_outer_value_defined_after_its_node():
    cond = Value("cond", TensorType(DataType.BOOL, Shape(())))
    x = Value("x", f32(2))
    g = Graph([cond, x], name="main")
    later = Node("", "Neg", [x], name="neg", outputs=[Value("late", f32(2))])
    if_node = _if_node(cond, later.outputs[0])
    g.append(if_node)
    g.append(later)
    g.outputs.append(if_node.outputs[0])
    model = Model(g, {"": 21})
    diags = V.verify(model, check_output_types=False)
    assert [d.kind for d in diags] == [V.SUBGRAPH_SCOPE, V.SUBGRAPH_SCOPE]
    then_id = if_node.attributes["then_branch"].value.nodes[0]
    assert "'%late'" in diags[0].message and "subgraph 'then'" in diags[0].message
    assert_shows_node(diags[0], then_id, "%late")
    g.sort()  # the outer read counts as an input of the If node, so Neg moves first
    assert [n.name for n in g] == ["neg", "if"]
    assert V.verify(model, check_output_types=False) == []


def test_arity_against_schema():
    model, relu, _ = small_model()
    relu.set_input(1, model.graph.inputs[0])
    d = only(V.verify(model, check_output_types=False), V.ARITY)
    assert "has 2 inputs; Relu (opset 14) takes 1" in d.message
    assert_shows_node(d, relu)


def test_arity_missing_required_input():
    model, _, add = small_model()
    add.set_input(0, None)
    diags = V.verify(model, check_output_types=False)
    d = only(diags, V.ARITY)
    assert "omits input 0 'A'" in d.message


@pytest.mark.parametrize("attr, expect", [
    (Attr("alpha", AttrType.FLOAT, 0.1), "has attribute 'alpha', which Relu (opset 14) does not declare"),
])
def test_attribute_unknown(attr, expect):
    model, relu, _ = small_model()
    relu.attributes[attr.name] = attr
    d = only(V.verify(model, check_output_types=False), V.ATTRIBUTE)
    assert expect in d.message
    assert_shows_node(d, relu, attr.name)


def test_attribute_missing_required_and_wrong_kind():
    x = Value("x", f32(2, 3))
    g = Graph([x], name="main")
    b = Builder(g)
    c = b.op("Cast", x, name="cast")  # 'to' is required
    t = b.op("Transpose", x, name="tr", perm=(1, 0))
    t.producer.attributes["perm"] = Attr("perm", AttrType.FLOATS, (1.0, 0.0))
    g.outputs.extend([c, t])
    diags = V.verify(Model(g, {"": 21}), check_output_types=False)
    assert [d.kind for d in diags] == [V.ATTRIBUTE, V.ATTRIBUTE]
    assert "lacks attribute 'to', which Cast (opset 21) requires" in diags[0].message
    assert diags[0].node is c.producer
    assert "attribute 'perm' is FLOATS; Transpose (opset 21) declares it INTS" in diags[1].message
    assert_shows_node(diags[1], t.producer, "perm")


def test_type_constraint_binding_and_allowed_set():
    x = Value("x", f32(2, 3))
    n = Value("n", i64(2, 3))
    s = Value("s", f32(2))
    g = Graph([x, n, s], name="main")
    b = Builder(g)
    y = b.op("Add", x, n, name="add")  # T bound to float by A, int64 by B
    r = b.op("Reshape", x, s, name="reshape")  # shape must be tensor(int64)
    g.outputs.extend([y, r])
    diags = V.verify(Model(g, {"": 21}), check_output_types=False)
    assert [d.kind for d in diags] == [V.TYPE, V.TYPE]
    assert "input 1 '%n' of Node(Add 'add') is tensor(int64) but input 0 is tensor(float)" in \
        diags[0].message
    assert_shows_node(diags[0], y.producer, "%n")
    assert "input 1 '%s' of Node(Reshape 'reshape') is tensor(float)" in diags[1].message
    assert "tensor(int64)" in diags[1].message


def test_declared_output_type_disagreeing_with_inference_is_a_warning():
    model, _, add = small_model()
    add.outputs[0].type = f32(2, 4)
    d = only(V.verify(model), V.OUTPUT_TYPE, severity="warning")
    assert "declared float[2, 4] but shape inference computes float[2, 3] (dim 1: 4 vs 3)" in d.message
    assert_shows_node(d, add, "%add_out")
    warnings = V.verify_or_raise(model)  # warnings do not raise
    assert [(w.kind, w.message) for w in warnings] == [(d.kind, d.message)]


def test_custom_domain_ops_are_not_errors():
    x = Value("x", f32(2, 3))
    g = Graph([x], name="main")
    y = Builder(g).op("FancyOp", x, x, x, domain="com.example", outputs=1, whatever=3)
    g.outputs.append(y)
    assert V.verify(Model(g, {"": 21, "com.example": 1}), check_output_types=False) == []


def test_unknown_default_domain_op_is_an_error():
    x = Value("x", f32(2, 3))
    g = Graph([x], name="main")
    y = Builder(g).op("Softmaxx", x, name="sm")
    g.outputs.append(y)
    d = only(V.verify(Model(g, {"": 21}), check_output_types=False), V.UNKNOWN_OP)
    assert "op 'Softmaxx' is not an ONNX op" in d.message and "Softmax" in d.message
    assert_shows_node(d, y.producer)


def test_op_newer_than_the_model_opset_is_a_warning():
    x = Value("x", f32(2, 3))
    g = Graph([x], name="main")
    y = Builder(g).op("Gelu", x, name="gelu")  # Gelu is in the default domain from opset 20
    g.outputs.append(y)
    d = only(V.verify(Model(g, {"": 17}), check_output_types=False), V.UNKNOWN_OP, "warning")
    assert "from opset 20" in d.message and "opset 17" in d.message
    assert V.verify(Model(g, {"": 20}), check_output_types=False) == []


def test_onnx_runtime_default_domain_op_is_a_warning():
    x = Value("x", f32(2, 3))
    g = Graph([x], name="main")
    y = Builder(g).op("SimplifiedLayerNormalization", x, name="sln", axis=-1)
    g.outputs.append(y)
    d = only(V.verify(Model(g, {"": 17}), check_output_types=False), V.UNKNOWN_OP, "warning")
    assert "ONNX Runtime op" in d.message


def test_function_bodies_are_verified():
    a = Value("a")
    body = Graph([a], name="f_body")
    ghost = Value("ghost")
    neg = Node("", "Neg", [ghost], name="neg_in_f")
    body.append(neg)
    body.outputs.append(neg.outputs[0])
    fn = Function("local", "F", body, {"": 21})
    x = Value("x", f32(2))
    g = Graph([x], name="main")
    call = Node("local", "F", [x], name="call", outputs=[Value("y", f32(2))])
    g.append(call)
    g.outputs.append(call.outputs[0])
    model = Model(g, {"": 21, "local": 1}, functions=[fn])
    d = only(V.verify(model, check_output_types=False), V.DANGLING_USE)
    assert d.node is neg and "'%ghost'" in d.message
    call.set_input(1, x)  # F takes one input
    kinds = [d.kind for d in V.verify(model, check_output_types=False)]
    assert sorted(kinds) == [V.ARITY, V.DANGLING_USE]


def test_verify_or_raise_lists_errors():
    model, _, add = small_model()
    add.set_input(1, Value("ghost"))
    with pytest.raises(V.VerificationError) as info:
        V.verify_or_raise(model, check_output_types=False)
    assert isinstance(info.value, PassctlError)
    assert "1 error(s)" in str(info.value) and "dangling-use" in str(info.value)
    assert [d.kind for d in info.value.diagnostics] == [V.DANGLING_USE]


def test_diagnostic_str_without_printer_line():
    node = Node("", "Relu", [Value("a")], name="r", outputs=[Value("b")])
    d = V.Diagnostic("error", V.ARITY, "something is wrong", node,
                     ir_line=V.format_node_fallback(node), highlight="a", in_operands=True)
    assert str(d).splitlines() == [
        "error[arity]: something is wrong",
        "  --> node 'r' (Relu)",
        "  | %b = Relu(%a)",
        "  |           ^^",
    ]


def test_corpus_model_verifies(corpus_model):
    model = load(corpus_model.path)
    diags = V.verify(model)
    errors = [str(d) for d in diags if d.severity == "error"]
    assert errors == []
    warnings = [d for d in diags if d.severity == "warning"]
    if corpus_model.declared_shapes_match:
        assert [str(w) for w in warnings] == []
    else:
        # ddddocr's OCR models declare output [1, seqlen]; the graph computes a rank-3 tensor.
        assert [w.kind for w in warnings] == [V.OUTPUT_TYPE]
        assert "rank 2 vs 3" in warnings[0].message
        assert warnings[0].node.op_type == "Reshape"
