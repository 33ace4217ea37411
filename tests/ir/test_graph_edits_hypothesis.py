"""Property test: random graph edits keep every use list exact and the node list consistent."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from passctl.ir import Graph, Node, Value

OPS = ("add", "insert_before", "insert_after", "set_input", "set_inputs", "rauw", "remove",
       "remove_while_iterating", "sort", "mark_output")


class World:
    """A graph under random edits. Each value gets a creation rank; an edit only makes a node read
    values of lower rank than the node, so the graph stays acyclic and ``sort`` always succeeds."""

    def __init__(self):
        self.graph = Graph([Value("in0"), Value("in1")], name="g")
        self.rank = {v: i for i, v in enumerate(self.graph.inputs)}
        self.values = list(self.graph.inputs)
        self.all_nodes = []
        self.counter = 0

    def new_node(self, data) -> Node:
        inputs = data.draw(st.lists(st.sampled_from(self.live_values()), max_size=3))
        self.counter += 1
        node = Node("", "Op", inputs, name=f"n{self.counter}",
                    outputs=[Value(f"v{self.counter}_{k}") for k in range(data.draw(
                        st.integers(1, 2)))])
        self.rank[node] = len(self.rank)  # below its own outputs: a node never reads them
        for v in node.outputs:
            self.rank[v] = len(self.rank)
            self.values.append(v)
        self.all_nodes.append(node)
        return node

    def live_values(self):
        """Graph inputs and outputs of nodes still in the graph."""
        return [v for v in self.values if v.producer is None or v.producer.graph is self.graph]

    def older_values(self, node: Node):
        return [v for v in self.live_values() if self.rank[v] < self.rank[node]]


def check_invariants(world: World) -> None:
    g = world.graph
    order = list(g)
    # The linked list, walked both ways through the cells and through Node.next/prev.
    cells, link = [], g._root.next
    while link is not g._root:
        cells.append(link.node)
        assert link.next.prev is link
        link = link.next
    assert cells == order
    back, link = [], g._root.prev
    while link is not g._root:
        back.append(link.node)
        link = link.prev
    assert back == order[::-1] == list(reversed(g))
    assert len(g) == len(order) == len(set(order))
    for i, n in enumerate(order):
        assert n.graph is g
        assert n.prev is (order[i - 1] if i else None)
        assert n.next is (order[i + 1] if i + 1 < len(order) else None)
    live = set(order)
    for n in world.all_nodes:
        assert (n.graph is g) == (n in live)
    # Use lists equal exactly what the live nodes' inputs say.
    expected = {}
    for n in order:
        for i, v in enumerate(n.inputs):
            if v is not None:
                expected.setdefault(v, set()).add((n, i))
    for v in world.values:
        uses = v.uses()
        assert len(uses) == len(set(uses))
        assert set(uses) == expected.get(v, set()), v


def topological(world: World) -> bool:
    seen = set(world.graph.inputs)
    for n in world.graph:
        if any(v is not None and v not in seen for v in n.inputs):
            return False
        seen.update(n.outputs)
    return True


def step(world: World, data) -> None:
    g = world.graph
    op = data.draw(st.sampled_from(OPS))
    nodes = list(g)
    if op == "add" or (not nodes and op != "sort"):
        g.append(world.new_node(data))
    elif op in ("insert_before", "insert_after"):
        anchor = data.draw(st.sampled_from(nodes + [None]))
        new = [world.new_node(data) for _ in range(data.draw(st.integers(1, 2)))]
        (g.insert_before if op == "insert_before" else g.insert_after)(anchor, new)
    elif op == "set_input":
        node = data.draw(st.sampled_from(nodes))
        index = data.draw(st.integers(-len(node.inputs), len(node.inputs) + 1))
        if index < 0 and not node.inputs:
            index = 0
        value = data.draw(st.sampled_from(world.older_values(node) + [None]))
        node.set_input(index, value)
    elif op == "set_inputs":
        node = data.draw(st.sampled_from(nodes))
        node.set_inputs(data.draw(st.lists(st.sampled_from(world.older_values(node) + [None]),
                                           max_size=4)))
    elif op == "rauw":
        old = data.draw(st.sampled_from(world.values))
        consumers = [n for n, _ in old.uses()]
        limit = min([world.rank[n] for n in consumers], default=len(world.rank))
        candidates = [v for v in world.live_values() if world.rank[v] < limit]
        new = data.draw(st.sampled_from(candidates))
        old.replace_all_uses_with(new, replace_graph_outputs=data.draw(st.booleans()))
    elif op == "remove":
        node = data.draw(st.sampled_from(nodes))
        removable = all(not v.uses() and not any(v is o for o in g.outputs) for v in node.outputs)
        before = (list(g), {v: set(v.uses()) for v in world.values})
        if removable:
            g.remove(node)
            assert node.graph is None and node.inputs == ()
        else:
            with pytest.raises(ValueError):
                g.remove(node)
            assert (list(g), {v: set(v.uses()) for v in world.values}) == before
    elif op == "remove_while_iterating":
        chosen = set(data.draw(st.lists(st.sampled_from(nodes), max_size=3)))
        visited = []
        for n in g:
            visited.append(n)
            free = all(not v.uses() and not any(v is o for o in g.outputs) for v in n.outputs)
            if n in chosen and free:
                g.remove(n)
        assert visited == nodes
    elif op == "sort":
        g.sort()
        assert topological(world)
    elif op == "mark_output":
        v = data.draw(st.sampled_from(world.live_values()))
        if not any(v is o for o in g.outputs):
            g.outputs.append(v)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_edits_keep_use_lists_and_node_list_exact(data):
    world = World()
    for _ in range(data.draw(st.integers(1, 30), label="steps")):
        step(world, data)
        check_invariants(world)
    world.graph.sort()
    assert topological(world)
    check_invariants(world)
