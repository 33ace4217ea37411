"""A node builder with an insertion point, used by passes and rewrite rules."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union

from passctl.ir._core import Graph, Node, Value


class Builder:
    """Creates nodes at an insertion point of a graph.

    Args:
        graph: the graph to insert into.
        before: insert each new node before this node; at the end of the graph when None.
        provenance: source-node names given to every node built here (e.g. the union of the nodes a
            rewrite replaces); nodes built without it get an empty provenance, which
            :meth:`Graph.replace_nodes` fills in.
        insert: when False, nodes are only recorded in :attr:`nodes`, not inserted (a rewrite
            collects them first and hands them to ``Graph.replace_nodes``).

    Example::

        b = Builder(graph, before=node)
        y = b.op("Relu", x)
        a, b_ = b.op("Split", y, outputs=2, axis=1)
    """

    def __init__(self, graph: Graph, before: Optional[Node] = None,
                 provenance: Sequence[str] = (), insert: bool = True):
        self.graph = graph
        self.before = before
        self.provenance = tuple(provenance)
        self.insert = insert
        self.nodes: List[Node] = []

    def set_insertion_point(self, before: Optional[Node]) -> None:
        self.before = before

    def op(self, op_type: str, *inputs: Optional[Value], domain: str = "", outputs: int = 1,
           name: str = "", output_names: Sequence[str] = (), **attrs: Any
           ) -> Union[Value, Tuple[Value, ...]]:
        """Build ``op_type(*inputs, **attrs)``; returns its output Value (a tuple when outputs > 1).

        Attribute values with ``None`` are left out. Output names are fresh names derived from
        ``output_names`` or the op type.
        """
        attributes = {k: v for k, v in attrs.items() if v is not None}
        outs: List[Value] = []
        pending: set = set()
        for i in range(outputs):
            base = output_names[i] if i < len(output_names) else f"{op_type.lower()}_out"
            outs.append(Value(self._fresh(base, pending)))
            pending.add(outs[-1].name)
        node = Node(domain, op_type, list(inputs), attributes, outs,
                    name=self._fresh(name or op_type, pending), provenance=self.provenance)
        if self.insert:
            self.graph.insert_before(self.before, node)
        self.nodes.append(node)
        return outs[0] if outputs == 1 else tuple(outs)

    def constant(self, array, name: str = "") -> Value:
        """A new initializer holding ``array`` (numpy array or Tensor)."""
        return self.graph.add_constant(array, name)

    def _fresh(self, base: str, pending: set = frozenset()) -> str:
        taken = {v.name for n in self.nodes for v in n.outputs} | {n.name for n in self.nodes}
        taken |= pending
        name = self.graph.fresh_name(base)
        i = 0
        while name in taken:
            i += 1
            name = self.graph.fresh_name(f"{base}_{i}")
        return name
