"""Tests of the IR data-model API: builder, insertion, removal, sort, replace_nodes, RAUW, identity."""

from __future__ import annotations

import pytest

from passctl.ir import Builder, Graph, Node, Value, union_provenance


def uses_from_nodes(graph: Graph) -> dict:
    """value -> set of (node, index), recomputed from the inputs of every node (subgraphs too)."""
    out: dict = {}
    for n in graph.all_nodes():
        for i, v in enumerate(n.inputs):
            if v is not None:
                out.setdefault(v, set()).add((n, i))
    return out


def assert_uses_exact(graph: Graph, *values: Value) -> None:
    expected = uses_from_nodes(graph)
    for v in set(expected) | set(values):
        assert set(v.uses()) == expected.get(v, set()), v


def chain(n: int):
    """x -> n0 -> n1 -> ... (Neg nodes named n0..), output the last; returns (graph, x, nodes)."""
    x = Value("x")
    g = Graph([x], name="g")
    nodes, v = [], x
    for i in range(n):
        node = Node("", "Neg", [v], name=f"n{i}", outputs=[Value(f"v{i}")])
        g.append(node)
        nodes.append(node)
        v = node.outputs[0]
    g.outputs.append(v)
    return g, x, nodes


def names(graph: Graph):
    return [n.name for n in graph]


def snapshot(graph: Graph):
    return (names(graph), [n.name for n in reversed(graph)], len(graph),
            {v: set(v.uses()) for v in uses_from_nodes(graph)}, list(graph.outputs))


# -- builder ------------------------------------------------------------------------------------
def test_builder_inserts_at_its_insertion_point():
    g, x, (n0, n1, n2) = chain(3)
    b = Builder(g, before=n1, provenance=("src",))
    y = b.op("Relu", n0.outputs[0], name="r")
    a, c = b.op("Split", y, outputs=2, axis=0)
    assert names(g) == ["n0", "r", "Split", "n1", "n2"]
    assert a.name != c.name and a.producer is c.producer and (a.index, c.index) == (0, 1)
    assert y.producer.provenance == ("src",)
    assert y.producer.attributes == {} and a.producer.attr("axis") == 0
    b.set_insertion_point(None)
    b.op("Identity", c, name="tail")
    assert names(g)[-1] == "tail"
    assert_uses_exact(g)


def test_builder_without_insert_only_records():
    g, x, _ = chain(1)
    b = Builder(g, insert=False)
    y = b.op("Relu", x)
    z = b.op("Relu", x)
    assert names(g) == ["n0"] and [n.op_type for n in b.nodes] == ["Relu", "Relu"]
    assert y.name != z.name and y.producer.name != z.producer.name


def test_builder_names_avoid_existing_values():
    g, x, _ = chain(1)
    y = Builder(g).op("Neg", x, output_names=["v0"], name="n0")
    assert y.name != "v0" and y.producer.name != "n0"


# -- insertion ------------------------------------------------------------------------------------
def test_insert_before_and_after():
    g, x, (n0, n1) = chain(2)
    a = Node("", "Relu", [x], name="a")
    b = Node("", "Relu", [x], name="b")
    g.insert_before(n1, [a, b])
    assert names(g) == ["n0", "a", "b", "n1"]
    c = Node("", "Relu", [x], name="c")
    d = Node("", "Relu", [x], name="d")
    g.insert_after(n0, [c, d])
    assert names(g) == ["n0", "c", "d", "a", "b", "n1"]
    e, f = Node("", "Relu", [x], name="e"), Node("", "Relu", [x], name="f")
    g.insert_after(None, e)
    g.insert_before(None, f)
    assert names(g) == ["e", "n0", "c", "d", "a", "b", "n1", "f"]
    assert [n.name for n in reversed(g)] == names(g)[::-1]
    assert n0.prev is e and n0.next is c and e.prev is None and f.next is None


def test_failed_insert_leaves_graph_untouched():
    g, x, (n0, n1) = chain(2)
    other = Graph(name="other")
    stranger = Node("", "Relu", [x], name="stranger")
    other.append(stranger)
    fresh = Node("", "Relu", [x], name="fresh")
    before = snapshot(g)
    with pytest.raises(ValueError, match="already belongs"):
        g.insert_before(n1, [fresh, stranger])
    with pytest.raises(ValueError, match="already belongs"):
        g.insert_after(n0, [fresh, n1])
    with pytest.raises(ValueError, match="is not in graph"):
        g.insert_before(stranger, [fresh])
    with pytest.raises(ValueError, match="twice"):
        g.insert_before(None, [fresh, fresh])
    assert fresh.graph is None
    after = snapshot(g)
    assert after[:3] == before[:3] and after[4] == before[4]


# -- removal --------------------------------------------------------------------------------------
def test_safe_remove_refuses_and_changes_nothing():
    g, x, (n0, n1, n2) = chain(3)
    before = snapshot(g)
    with pytest.raises(ValueError, match="used by"):
        g.remove(n1)
    with pytest.raises(ValueError, match="graph output"):
        g.remove(n2)
    with pytest.raises(ValueError, match="used by"):
        g.remove([n0, n2])  # n0's output feeds n1, which stays
    assert snapshot(g) == before
    assert all(n.graph is g for n in (n0, n1, n2))


def test_safe_remove_of_a_closed_set():
    g, x, (n0, n1, n2) = chain(3)
    extra = Node("", "Relu", [n0.outputs[0]], name="extra")
    sink = Node("", "Relu", [extra.outputs[0]], name="sink")
    g.append(extra)
    g.append(sink)
    g.remove([sink, extra, extra])  # duplicates are ignored
    assert names(g) == ["n0", "n1", "n2"] and len(g) == 3
    assert extra.graph is None and extra.inputs == () and sink.inputs == ()
    assert set(n0.outputs[0].uses()) == {(n1, 0)}
    assert_uses_exact(g, extra.outputs[0])


def test_remove_while_iterating():
    g, x, nodes = chain(6)
    for n in nodes:
        n.set_input(0, x)  # make every node removable
    g.outputs.clear()
    visited = []
    for n in g:
        visited.append(n.name)
        if n.name == "n1":
            g.remove([n, nodes[2]])  # the current node and the next one
        if n.name == "n3":
            g.remove(n)
            g.append(n)  # moved to the end while the walk is on it: the walk goes on from n4
            n.set_input(0, x)
    assert visited == ["n0", "n1", "n3", "n4", "n5", "n3"]
    assert names(g) == ["n0", "n4", "n5", "n3"]
    assert [n.name for n in reversed(g)] == ["n3", "n5", "n4", "n0"]
    back = []
    for n in reversed(g):
        back.append(n.name)
        g.remove(n)
    assert back == ["n3", "n5", "n4", "n0"] and len(g) == 0 and list(g) == []
    assert x.uses() == []


def test_remove_node_with_subgraph_drops_inner_outer_uses():
    x = Value("x")
    g = Graph([x], name="g")
    body = Graph(name="body")
    inner = Node("", "Neg", [x], name="inner")
    body.append(inner)
    body.outputs.append(inner.outputs[0])
    loop = Node("", "If", [x], {"then_branch": body, "else_branch": Graph(outputs=[x])}, name="if")
    g.append(loop)
    assert body.parent is loop
    assert set(x.uses()) == {(loop, 0), (inner, 0)}
    g.remove(loop)
    assert x.uses() == []


# -- sort -----------------------------------------------------------------------------------------
def test_sort_keeps_valid_order_and_fixes_invalid():
    g, x, (n0, n1, n2) = chain(3)
    side = Node("", "Relu", [x], name="side")
    g.insert_after(None, side)
    g.sort()
    assert names(g) == ["side", "n0", "n1", "n2"]  # already valid: unchanged
    g.remove(n0, safe=False)
    g.append(n0)
    n0.set_input(0, x)
    g.sort()
    assert names(g) == ["side", "n0", "n1", "n2"]
    assert [n.name for n in reversed(g)] == ["n2", "n1", "n0", "side"]


def test_sort_orders_subgraph_outer_reads():
    x = Value("x")
    g = Graph([x], name="g")
    late = Node("", "Neg", [x], name="late")
    body = Graph(name="then")
    ident = Node("", "Identity", [late.outputs[0]], name="id")
    body.append(ident)
    body.outputs.append(ident.outputs[0])
    if_node = Node("", "If", [x], {"then_branch": body, "else_branch": Graph(outputs=[x])},
                   name="if")
    g.append(if_node)
    g.append(late)
    g.sort()
    assert names(g) == ["late", "if"]


def test_sort_reports_a_cycle():
    x = Value("x")
    g = Graph([x], name="g")
    a = Node("", "Add", [x, None], name="a")
    b = Node("", "Neg", [a.outputs[0]], name="b")
    a.set_input(1, b.outputs[0])
    g.extend([a, b])
    with pytest.raises(ValueError, match="cycle"):
        g.sort()
    assert names(g) == ["a", "b"]


# -- replace_nodes, RAUW --------------------------------------------------------------------------
def test_replace_nodes_unions_provenance_and_keeps_output_names():
    g, x, (n0, n1, n2) = chain(3)
    n0.provenance, n1.provenance, n2.provenance = ("conv",), ("bn", "conv"), ("relu",)
    fused = Node("", "Abs", [x], name="fused", outputs=[Value("f")])
    kept = Node("", "Identity", [fused.outputs[0]], name="kept", provenance=("mine",),
                outputs=[Value("k")])
    g.replace_nodes([n1, n2, n0], [fused, kept], [n2.outputs[0]], [kept.outputs[0]])
    assert names(g) == ["fused", "kept"]
    assert fused.provenance == ("bn", "conv", "relu") == union_provenance([n1, n2, n0])
    assert kept.provenance == ("mine",)
    assert g.outputs == [kept.outputs[0]] and kept.outputs[0].name == "v2"
    assert n2.outputs[0].name != "v2"
    assert_uses_exact(g, n0.outputs[0], n1.outputs[0])


def test_replace_nodes_refusal_changes_nothing():
    g, x, (n0, n1, n2) = chain(3)
    new = Node("", "Abs", [x], name="new")
    before = snapshot(g)
    with pytest.raises(ValueError, match="still used"):
        g.replace_nodes([n0], [new], [], [])  # n0's output still feeds n1
    with pytest.raises(ValueError, match="differ in length"):
        g.replace_nodes([n0], [new], [n0.outputs[0]], [])
    assert snapshot(g) == before and new.graph is None and new.provenance == ()


def test_rauw_rewires_uses_and_optionally_graph_outputs():
    g, x, (n0, n1) = chain(2)
    other = Node("", "Abs", [x], name="abs", outputs=[Value("a")])
    g.insert_after(n0, other)
    n0.outputs[0].replace_all_uses_with(other.outputs[0])
    assert set(other.outputs[0].uses()) == {(n1, 0)} and n0.outputs[0].uses() == []
    out = n1.outputs[0]
    neg = Node("", "Neg", [x], name="neg", outputs=[Value("n")])
    g.append(neg)
    out.replace_all_uses_with(neg.outputs[0])
    assert g.outputs == [out]  # graph outputs only move when asked
    out.replace_all_uses_with(neg.outputs[0], replace_graph_outputs=True)
    assert g.outputs == [neg.outputs[0]] and neg.outputs[0].name == "v1" and out.name != "v1"
    assert out.is_graph_output() is False and neg.outputs[0].is_graph_output()
    x.replace_all_uses_with(x)  # a no-op
    assert_uses_exact(g)


def test_set_input_and_set_inputs_keep_use_lists_exact():
    g, x, (n0,) = chain(1)
    y = Value("y")
    node = Node("", "Sum", [x, x, y], name="sum")
    g.append(node)
    node.set_input(-1, x)
    assert node.inputs == (x, x, x) and y.uses() == []
    node.set_input(4, y)
    assert node.inputs == (x, x, x, None, y)
    assert set(y.uses()) == {(node, 4)}
    node.set_inputs([y, x])
    assert set(x.uses()) == {(n0, 0), (node, 1)} and set(y.uses()) == {(node, 0)}
    with pytest.raises(IndexError):
        node.set_input(-3, x)
    assert_uses_exact(g, y)


def test_values_compare_by_identity():
    a, b = Value("same"), Value("same")
    assert a != b and a == a and len({a, b}) == 2
    g, x, (n0,) = chain(1)
    uses = x.uses()
    uses.clear()  # uses() is a copy
    assert x.uses() == [(n0, 0)]
    with pytest.raises(ValueError, match="already has a producer"):
        Node("", "Neg", [x], outputs=[n0.outputs[0]])
    with pytest.raises(ValueError, match="already has a producer"):
        Node("", "Neg", [x]).append_output(n0.outputs[0])


def test_fresh_name_sees_subgraph_names():
    x = Value("x")
    g = Graph([x], name="g")
    body = Graph([Value("inner_in")], name="body")
    g.append(Node("", "Loop", [x], {"body": body}, name="loop"))
    assert g.fresh_name("inner_in") != "inner_in"
    assert body.fresh_name("x") != "x"
    assert g.fresh_name("unused") == "unused"
