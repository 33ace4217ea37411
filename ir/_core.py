"""The graph IR: Value (SSA, use lists), Node, Graph (a linked list of nodes), Function, Model.

Design after onnx_ir (onnx/ir-py): a Value knows its producer and its uses, setting a node's input
updates the use lists, values compare by identity, and only the graph adds or removes nodes.
"""

from __future__ import annotations

import enum
import itertools
from typing import (Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple,
                    Union)

from passctl.ir._tensor import Tensor
from passctl.ir._types import DataType, Shape, TensorType, Type


class AttrType(enum.IntEnum):
    """ONNX attribute kinds; values are ``onnx.AttributeProto.AttributeType``'s."""

    UNDEFINED = 0
    FLOAT = 1
    INT = 2
    STRING = 3
    TENSOR = 4
    GRAPH = 5
    SPARSE_TENSOR = 11
    TYPE_PROTO = 13
    FLOATS = 6
    INTS = 7
    STRINGS = 8
    TENSORS = 9
    GRAPHS = 10
    SPARSE_TENSORS = 12
    TYPE_PROTOS = 14


class Attr:
    """A node attribute.

    ``value`` is: float / int / str (STRING values are ``str`` when valid UTF-8, else ``bytes``);
    :class:`Tensor`; :class:`Graph`; an ``onnx.SparseTensorProto`` or :class:`Type` for the rarer
    kinds; or a tuple of those for the list kinds. ``ref_attr_name`` is set for attributes inside a
    function body that refer to an attribute of the calling node (the value is then None).
    """

    __slots__ = ("name", "type", "value", "doc_string", "ref_attr_name")

    def __init__(self, name: str, type: AttrType, value: Any, doc_string: str = "",
                 ref_attr_name: str = ""):
        self.name = name
        self.type = AttrType(type)
        self.value = tuple(value) if isinstance(value, list) else value
        self.doc_string = doc_string
        self.ref_attr_name = ref_attr_name

    @classmethod
    def infer(cls, name: str, value: Any) -> "Attr":
        """Build an attribute, choosing its kind from the Python value.

        Raises:
            TypeError: when the kind cannot be told from the value (e.g. an empty list).
        """
        import numpy as np

        if isinstance(value, Attr):
            return value
        if isinstance(value, (bool, np.bool_, int, np.integer)):
            return cls(name, AttrType.INT, int(value))
        if isinstance(value, (float, np.floating)):
            return cls(name, AttrType.FLOAT, float(value))
        if isinstance(value, (str, bytes)):
            return cls(name, AttrType.STRING, value)
        if isinstance(value, np.ndarray):
            return cls(name, AttrType.TENSOR, Tensor(value))
        if isinstance(value, Tensor):
            return cls(name, AttrType.TENSOR, value)
        if isinstance(value, Graph):
            return cls(name, AttrType.GRAPH, value)
        if isinstance(value, (list, tuple)):
            if not value:
                raise TypeError(f"attribute '{name}': cannot tell the kind of an empty list; "
                                "build Attr(name, AttrType.INTS, ()) explicitly")
            first = value[0]
            if isinstance(first, (bool, np.bool_, int, np.integer)):
                return cls(name, AttrType.INTS, tuple(int(v) for v in value))
            if isinstance(first, (float, np.floating)):
                return cls(name, AttrType.FLOATS, tuple(float(v) for v in value))
            if isinstance(first, (str, bytes)):
                return cls(name, AttrType.STRINGS, tuple(value))
            if isinstance(first, Tensor):
                return cls(name, AttrType.TENSORS, tuple(value))
            if isinstance(first, Graph):
                return cls(name, AttrType.GRAPHS, tuple(value))
        raise TypeError(f"attribute '{name}': unsupported value of type {type(value).__name__}")

    def graphs(self) -> Tuple["Graph", ...]:
        if self.type == AttrType.GRAPH:
            return (self.value,)
        if self.type == AttrType.GRAPHS:
            return tuple(self.value)
        return ()

    def __repr__(self):
        return f"Attr({self.name!r}, {self.type.name}, {self.value!r})"


class Value:
    """An SSA value: produced by one node output (or a graph input / initializer), used by many.

    Attributes:
        name: the ONNX name; unique within a model at export (the graph renames on conflict).
        type: a :class:`Type` (usually :class:`TensorType`) or None when unknown.
        const: the :class:`Tensor` for an initializer, else None.
    Values compare by identity.
    """

    __slots__ = ("_name", "type", "producer", "index", "_uses", "const", "doc_string",
                 "metadata_props", "graph", "__weakref__")

    def __init__(self, name: str = "", type: Optional[Type] = None, const: Optional[Tensor] = None,
                 doc_string: str = ""):
        self._name = name
        self.type = type
        self.producer: Optional[Node] = None
        self.index: Optional[int] = None
        self._uses: Dict[Tuple[Node, int], None] = {}
        self.const = const
        self.doc_string = doc_string
        self.metadata_props: Dict[str, str] = {}
        # The graph that owns this value when it is a graph input or initializer.
        self.graph: Optional[Graph] = None

    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, name: str) -> None:
        self._name = name
        g = self.producer.graph if self.producer is not None else self.graph
        if g is not None:
            g._note_names((name,))

    # -- type helpers ---------------------------------------------------------------------------
    @property
    def dtype(self) -> Optional[DataType]:
        return self.type.dtype if isinstance(self.type, TensorType) else None

    @property
    def shape(self) -> Optional[Shape]:
        return self.type.shape if isinstance(self.type, TensorType) else None

    # -- use-def --------------------------------------------------------------------------------
    def uses(self) -> List[Tuple["Node", int]]:
        """(consumer node, input index) pairs; a copy, safe to mutate the graph while iterating."""
        return list(self._uses)

    def consumers(self) -> List["Node"]:
        """Distinct consumer nodes, in first-use order."""
        return list(dict.fromkeys(n for n, _ in self._uses))

    def is_graph_input(self) -> bool:
        return self.graph is not None and self in self.graph._input_set

    def is_graph_output(self) -> bool:
        g = self.graph if self.graph is not None else (
            self.producer.graph if self.producer is not None else None)
        return g is not None and any(o is self for o in g.outputs)

    def is_initializer(self) -> bool:
        return self.graph is not None and self.graph.initializers.get(self.name) is self

    def replace_all_uses_with(self, other: "Value", replace_graph_outputs: bool = False) -> None:
        """Point every consumer of this value at ``other``.

        Graph outputs are rewired too when ``replace_graph_outputs`` is set (the new value then
        takes the output's name, so the model's interface keeps its names).
        """
        if other is self:
            return
        for node, i in self.uses():
            node.set_input(i, other)
        if replace_graph_outputs:
            g = self.producer.graph if self.producer is not None else self.graph
            if g is not None:
                for i, o in enumerate(g.outputs):
                    if o is self:
                        g.outputs[i] = other
                        if other.producer is not None and not other.is_graph_input():
                            name = self.name
                            self.name = g.fresh_name(name + "_replaced")
                            other.name = name

    def __repr__(self):
        ty = _type_str(self.type)
        return f"Value(%{self.name}: {ty})"


def _type_str(t: Optional[Type]) -> str:
    if t is None:
        return "?"
    if isinstance(t, TensorType):
        shape = "*" if t.shape is None else str(t.shape)
        return f"{t.dtype.short_name}[{shape}]"
    return type(t).__name__


class Node:
    """One operator application.

    Attributes:
        domain, op_type, overload: the operator ("" is the default ONNX domain).
        inputs: a tuple of Values (None for an omitted optional input); set them with
            :meth:`set_input` / :meth:`replace_input_with` so use lists stay exact.
        outputs: a tuple of Values produced by this node.
        attributes: name -> :class:`Attr`, in order.
        provenance: the names of the source-model nodes this node came from (a tuple of str).
    """

    __slots__ = ("domain", "op_type", "overload", "name", "_inputs", "_outputs", "attributes",
                 "doc_string", "metadata_props", "provenance", "graph", "_link",
                 "__weakref__")

    def __init__(self, domain: str, op_type: str, inputs: Sequence[Optional[Value]] = (),
                 attributes: Union[Mapping[str, Any], Sequence[Attr], None] = None,
                 outputs: Union[int, Sequence[Value], None] = None, name: str = "",
                 overload: str = "", doc_string: str = "",
                 provenance: Sequence[str] = (), metadata_props: Optional[Dict[str, str]] = None):
        self.domain = domain
        self.op_type = op_type
        self.overload = overload
        self.name = name
        self.doc_string = doc_string
        self.metadata_props = dict(metadata_props or {})
        self.provenance: Tuple[str, ...] = tuple(provenance)
        self.graph: Optional[Graph] = None
        # This node's cell in its graph's node list (None while in no graph).
        self._link: Optional[_Link] = None
        self.attributes: Dict[str, Attr] = {}
        if attributes:
            items = attributes.values() if isinstance(attributes, Mapping) and all(
                isinstance(v, Attr) for v in attributes.values()) else attributes
            if isinstance(items, Mapping):
                for k, v in items.items():
                    self.attributes[k] = Attr.infer(k, v)
            else:
                for a in items:
                    self.attributes[a.name] = a
        for sub in self.subgraphs():
            sub.parent = self
        self._inputs: Tuple[Optional[Value], ...] = ()
        self._inputs = tuple(inputs)
        for i, v in enumerate(self._inputs):
            if v is not None:
                v._uses[(self, i)] = None
        if outputs is None:
            outputs = 1
        if isinstance(outputs, int):
            outputs = [Value() for _ in range(outputs)]
        self._outputs: Tuple[Value, ...] = tuple(outputs)
        for i, v in enumerate(self._outputs):
            if v.producer is not None and v.producer is not self:
                raise ValueError(f"value '{v.name}' already has a producer ({v.producer.op_type})")
            v.producer = self
            v.index = i

    # -- inputs / outputs -----------------------------------------------------------------------
    @property
    def inputs(self) -> Tuple[Optional[Value], ...]:
        return self._inputs

    @property
    def outputs(self) -> Tuple[Value, ...]:
        return self._outputs

    def set_input(self, index: int, value: Optional[Value]) -> None:
        """Set input ``index`` (appending None-padded inputs if needed), keeping use lists exact.

        A negative ``index`` counts from the end, as in Python.

        Raises:
            IndexError: a negative ``index`` before the first input.
        """
        ins = list(self._inputs)
        if index < 0:
            if index < -len(ins):
                raise IndexError(f"{self!r}: input index {index} out of range ({len(ins)} inputs)")
            index += len(ins)
        while index >= len(ins):
            ins.append(None)
        old = ins[index]
        if old is value:
            return
        if old is not None:
            old._uses.pop((self, index), None)
        ins[index] = value
        if value is not None:
            value._uses[(self, index)] = None
        self._inputs = tuple(ins)

    def replace_input_with(self, index: int, value: Optional[Value]) -> None:
        """Alias of :meth:`set_input` (onnx_ir's name)."""
        self.set_input(index, value)

    def set_inputs(self, values: Sequence[Optional[Value]]) -> None:
        """Replace all inputs at once (the count may change)."""
        for i, v in enumerate(self._inputs):
            if v is not None:
                v._uses.pop((self, i), None)
        self._inputs = tuple(values)
        for i, v in enumerate(self._inputs):
            if v is not None:
                v._uses[(self, i)] = None

    def append_output(self, value: Optional[Value] = None) -> Value:
        """Add an output (a new Value when None) and return it.

        Raises:
            ValueError: the value is already produced by another node.
        """
        value = Value() if value is None else value
        if value.producer is not None and value.producer is not self:
            raise ValueError(f"value '{value.name}' already has a producer ({value.producer!r})")
        value.producer = self
        value.index = len(self._outputs)
        self._outputs = self._outputs + (value,)
        return value

    def set_outputs(self, values: Sequence[Value]) -> None:
        """Replace the output list (values that leave must be unused).

        Raises:
            ValueError: a new value is already produced by another node.
        """
        for v in values:
            if v.producer is not None and v.producer is not self:
                raise ValueError(f"value '{v.name}' already has a producer ({v.producer!r})")
        for v in self._outputs:
            if not any(v is w for w in values):
                v.producer = None
                v.index = None
        self._outputs = tuple(values)
        for i, v in enumerate(self._outputs):
            v.producer = self
            v.index = i

    # -- attributes -----------------------------------------------------------------------------
    def attr(self, name: str, default: Any = None) -> Any:
        """The attribute's value, or ``default`` when absent."""
        a = self.attributes.get(name)
        return default if a is None else a.value

    def set_attr(self, name: str, value: Any) -> None:
        """Set attribute ``name`` (kind inferred by :meth:`Attr.infer`); subgraphs get this parent."""
        attr = Attr.infer(name, value)
        if attr.name != name:
            attr = Attr(name, attr.type, attr.value, attr.doc_string, attr.ref_attr_name)
        self.attributes[name] = attr
        for sub in attr.graphs():
            sub.parent = self

    def subgraphs(self) -> List["Graph"]:
        return [g for a in self.attributes.values() for g in a.graphs()]

    # -- misc -----------------------------------------------------------------------------------
    @property
    def qualified_op(self) -> str:
        """``op_type`` with its domain when not the default one, e.g. ``com.microsoft::FusedConv``."""
        return f"{self.domain}::{self.op_type}" if self.domain not in ("", "ai.onnx") else self.op_type

    @property
    def next(self) -> Optional["Node"]:
        """The following node of its graph (None at the end or outside a graph)."""
        link = self._link
        if link is None or link.next.node is None:
            return None
        return link.next.node

    @property
    def prev(self) -> Optional["Node"]:
        """The preceding node of its graph (None at the start or outside a graph)."""
        link = self._link
        if link is None or link.prev.node is None:
            return None
        return link.prev.node

    def __repr__(self):
        return f"Node({self.qualified_op} {self.name!r})"


class Graph:
    """A graph: inputs, outputs, initializers and an ordered, doubly linked list of nodes.

    Iterating a graph yields its nodes in order; removing the current node (or any other) while
    iterating is safe. Membership changes only through :meth:`append`, :meth:`insert_before`,
    :meth:`insert_after`, :meth:`remove`, :meth:`replace_nodes` and :meth:`sort`.
    """

    def __init__(self, inputs: Sequence[Value] = (), outputs: Sequence[Value] = (),
                 nodes: Iterable[Node] = (), initializers: Sequence[Value] = (), name: str = "",
                 doc_string: str = ""):
        self.name = name
        self.doc_string = doc_string
        self.metadata_props: Dict[str, str] = {}
        # GraphProto fields passctl does not model (sparse_initializer, quantization_annotation),
        # as serialized protos, so export writes them back unchanged.
        self.extra: Dict[str, List[bytes]] = {}
        self.inputs: List[Value] = []
        self._input_set: Dict[Value, None] = {}
        self.outputs: List[Value] = list(outputs)
        self.initializers: Dict[str, Value] = {}
        # The node whose attribute holds this graph (None for a model's main graph / function body).
        self.parent: Optional[Node] = None
        # Sentinel of the circular doubly linked node list.
        self._root = _Link(None)
        self._count = 0
        self._name_counter = itertools.count()
        # Names taken in this (root) graph and its subgraphs; built lazily by fresh_name.
        self._name_cache: Optional[set] = None
        for v in inputs:
            self.add_input(v)
        for v in initializers:
            self.add_initializer(v)
        for n in nodes:
            self.append(n)

    # -- inputs / initializers -------------------------------------------------------------------
    def add_input(self, value: Value) -> Value:
        value.graph = self
        self.inputs.append(value)
        self._input_set[value] = None
        self._note_names((value.name,))
        return value

    def remove_input(self, value: Value) -> None:
        self.inputs.remove(value)
        self._input_set.pop(value, None)

    def add_initializer(self, value: Value) -> Value:
        """Register an initializer value (its ``const`` must be set).

        Raises:
            ValueError: the value has no constant data, or another initializer has its name.
        """
        if value.const is None:
            raise ValueError(f"initializer '{value.name}' has no constant data")
        if value.name in self.initializers and self.initializers[value.name] is not value:
            raise ValueError(f"graph '{self.name}' already has an initializer '{value.name}'")
        value.graph = self
        if value.type is None:
            value.type = TensorType(value.const.dtype, Shape(value.const.dims))
        self.initializers[value.name] = value
        self._note_names((value.name,))
        return value

    def remove_initializer(self, name: str) -> None:
        v = self.initializers.pop(name)
        if v not in self._input_set:
            v.graph = None

    def add_constant(self, array, name: str = "") -> Value:
        """Add an initializer holding ``array`` (numpy or :class:`Tensor`) under a fresh name."""
        name = self.fresh_name(name or "const")
        tensor = array if isinstance(array, Tensor) else Tensor(array)
        tensor.name = name
        return self.add_initializer(Value(name, const=tensor))

    # -- node list ------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Node]:
        """The nodes in order. Removing or inserting nodes while iterating is safe: a removed
        node's cell keeps its successor, so the walk goes on from where it was."""
        link = self._root.next
        while link is not self._root:
            if not link.erased:
                yield link.node
            link = link.next

    def __reversed__(self) -> Iterator[Node]:
        link = self._root.prev
        while link is not self._root:
            if not link.erased:
                yield link.node
            link = link.prev

    def __len__(self) -> int:
        return self._count

    @property
    def nodes(self) -> List[Node]:
        """A list copy of the nodes, in order."""
        return list(self)

    def _link_before(self, node: Node, nxt: "_Link") -> None:
        link = _Link(node)
        link.prev, link.next = nxt.prev, nxt
        nxt.prev.next = link
        nxt.prev = link
        node.graph = self
        node._link = link
        self._count += 1
        for sub in node.subgraphs():
            sub.parent = node
        root = self._root_graph()
        if root._name_cache is not None:
            root._name_cache.add(node.name)
            root._name_cache.update(v.name for v in node.outputs)
            for sub in node.subgraphs():
                sub._collect_names(root._name_cache)

    def _check_insertable(self, anchor: Optional[Node], nodes: List[Node]) -> None:
        if anchor is not None:
            self._check_member(anchor)
        seen = set()
        for n in nodes:
            if n.graph is not None:
                raise ValueError(f"node {n!r} already belongs to graph '{n.graph.name}'; remove it "
                                 "there first")
            if n in seen:
                raise ValueError(f"node {n!r} appears twice in the nodes to insert")
            seen.add(n)

    def append(self, node: Node) -> Node:
        """Add ``node`` at the end.

        Raises:
            ValueError: the node already belongs to a graph.
        """
        self._check_insertable(None, [node])
        self._link_before(node, self._root)
        return node

    def extend(self, nodes: Iterable[Node]) -> None:
        self.insert_before(None, list(nodes))

    def insert_before(self, anchor: Optional[Node], nodes: Union[Node, Sequence[Node]]) -> None:
        """Insert ``nodes`` (in order) before ``anchor``; at the end when ``anchor`` is None.

        Raises:
            ValueError: ``anchor`` is not in this graph, or a node already belongs to a graph or
                appears twice (checked before anything changes).
        """
        nodes = [nodes] if isinstance(nodes, Node) else list(nodes)
        self._check_insertable(anchor, nodes)
        nxt = self._root if anchor is None else anchor._link
        for n in nodes:
            self._link_before(n, nxt)

    def insert_after(self, anchor: Optional[Node], nodes: Union[Node, Sequence[Node]]) -> None:
        """Insert ``nodes`` (in order) after ``anchor``; at the start when ``anchor`` is None.

        Raises:
            ValueError: as :meth:`insert_before`.
        """
        nodes = [nodes] if isinstance(nodes, Node) else list(nodes)
        self._check_insertable(anchor, nodes)
        nxt = self._root.next if anchor is None else anchor._link.next
        for n in nodes:
            self._link_before(n, nxt)

    def _check_member(self, node: Node) -> None:
        if node.graph is not self:
            raise ValueError(f"node {node!r} is not in graph '{self.name}'")

    def remove(self, nodes: Union[Node, Sequence[Node]], safe: bool = True) -> None:
        """Remove ``nodes`` from the graph and detach their inputs (and those of the nodes in their
        subgraphs, so outer values do not keep uses by nodes that left the graph).

        With ``safe`` (the default) nothing changes unless every output of every removed node is
        unused outside the removed set (nodes inside removed nodes' subgraphs count as removed) and
        is no graph output.

        Raises:
            ValueError: (``safe``) a removed node's output is still used or is a graph output; or a
                node is not in this graph. Nothing has changed when it raises.
        """
        nodes = [nodes] if isinstance(nodes, Node) else list(dict.fromkeys(nodes))
        for n in nodes:
            self._check_member(n)
        if safe:
            removing = set(nodes)
            for n in nodes:
                for sub in n.subgraphs():
                    removing.update(sub.all_nodes())
            found = self._first_outside_use(nodes, removing)
            if found is not None:
                n, v, user = found
                raise ValueError(f"cannot remove {n!r}: its output '{v.name}' is "
                                 + (f"used by {user!r}" if user else "a graph output"))
        for n in nodes:
            n.set_inputs(())
            for sub in n.subgraphs():
                for inner in sub.all_nodes():
                    inner.set_inputs(())
            link = n._link
            link.prev.next = link.next
            link.next.prev = link.prev
            # The cell keeps prev/next so an iterator standing on it can go on.
            link.erased = True
            n._link = None
            n.graph = None
            self._count -= 1

    def _first_outside_use(self, nodes: Sequence[Node], inside: Iterable[Node],
                           skip: Sequence[Value] = ()) -> Optional[Tuple[Node, Value, Optional[Node]]]:
        """The first output of ``nodes`` (not in ``skip``) that is a graph output, as
        ``(node, value, None)``, or is used by a node outside ``inside``, as ``(node, value, user)``."""
        inside = set(inside)
        skipped = {id(v) for v in skip}
        outs = {id(o) for o in self.outputs}
        for n in nodes:
            for v in n.outputs:
                if id(v) in skipped:
                    continue
                if id(v) in outs:
                    return n, v, None
                for user, _ in v.uses():
                    if user not in inside:
                        return n, v, user
        return None

    def replace_nodes(self, old_nodes: Sequence[Node], new_nodes: Sequence[Node],
                      old_values: Sequence[Value], new_values: Sequence[Value]) -> None:
        """Replace ``old_nodes`` by ``new_nodes``, rewiring each ``old_values[i]`` to ``new_values[i]``.

        The new nodes are inserted before the first old node in graph order (their inputs must be
        defined by then). Each new node without provenance gets the union of the old nodes'
        provenance (as MLIR's fused locations). Graph outputs among ``old_values`` are rewired and keep
        their names. The old nodes are then removed.

        Raises:
            ValueError: the value lists differ in length, a new node already belongs to a graph, or
                an old node's output that is not in ``old_values`` is still used outside the
                replaced set or is a graph output. Nothing has changed when it raises.
        """
        if len(old_values) != len(new_values):
            raise ValueError("replace_nodes: old_values and new_values differ in length")
        old_nodes = list(dict.fromkeys(old_nodes))
        for n in old_nodes:
            self._check_member(n)
        old_set = set(old_nodes)
        for n in old_nodes:
            for sub in n.subgraphs():
                old_set.update(sub.all_nodes())
        found = self._first_outside_use(old_nodes, old_set, skip=old_values)
        if found is not None:
            n, v, user = found
            raise ValueError(f"replace_nodes: output '{v.name}' of {n!r} is "
                             + (f"still used by {user!r}" if user else "a graph output")
                             + " but not in old_values")
        anchor = next((n for n in self if n in old_set), None)
        self._check_insertable(anchor, list(new_nodes))
        prov = union_provenance(old_nodes)
        for n in new_nodes:
            if not n.provenance:
                n.provenance = prov
        self.insert_before(anchor, list(new_nodes))
        for old, new in zip(old_values, new_values):
            old.replace_all_uses_with(new, replace_graph_outputs=True)
        self.remove(old_nodes, safe=True)

    # -- names ----------------------------------------------------------------------------------
    def fresh_name(self, prefix: str = "v") -> str:
        """A value/node name not used in this graph, its subgraphs or its ancestors, from ``prefix``.

        The returned name is reserved at once, so two calls never return the same name. The set of
        taken names is built once per root graph and then kept up to date as nodes, inputs and
        initializers are added and values renamed (removed names stay taken), so a call costs O(1)
        amortized.
        """
        taken = self._root_graph()._taken_names()
        name = prefix
        while name in taken:
            name = f"{prefix}_{next(self._name_counter)}"
        taken.add(name)
        return name

    def _root_graph(self) -> "Graph":
        root: Graph = self
        while root.parent is not None and root.parent.graph is not None:
            root = root.parent.graph
        return root

    def _taken_names(self) -> set:
        if self._name_cache is None:
            names: set = set()
            self._collect_names(names)
            self._name_cache = names
        return self._name_cache

    def _note_names(self, names) -> None:
        root = self._root_graph()
        if root._name_cache is not None:
            root._name_cache.update(names)

    def _names(self) -> set:
        return set(self._root_graph()._taken_names())

    def _collect_names(self, names: set) -> None:
        names.update(self.initializers)
        names.update(v.name for v in self.inputs)
        for n in self:
            names.update(v.name for v in n.outputs)
            names.add(n.name)
            for sub in n.subgraphs():
                sub._collect_names(names)

    # -- traversal ------------------------------------------------------------------------------
    def all_nodes(self) -> Iterator[Node]:
        """Every node of this graph and, recursively, of its subgraphs (pre-order)."""
        for n in self:
            yield n
            for sub in n.subgraphs():
                yield from sub.all_nodes()

    def sort(self, recursive: bool = True) -> None:
        """Topologically sort the nodes, keeping the current order wherever it is valid.

        Outer-scope values read inside a node's subgraphs count as that node's inputs. With
        ``recursive`` the subgraphs are sorted too.

        Raises:
            ValueError: the graph has a cycle (the message names a node on it).
        """
        import networkx as nx

        order = list(self)
        pos = {n: i for i, n in enumerate(order)}
        dg = nx.DiGraph()
        dg.add_nodes_from(range(len(order)))
        for n in order:
            for v in list(n.inputs) + implicit_inputs(n):
                if v is not None and v.producer in pos and v.producer is not n:
                    dg.add_edge(pos[v.producer], pos[n])
        try:
            sorted_ids = list(nx.lexicographical_topological_sort(dg))
        except nx.NetworkXUnfeasible:
            cycle = nx.find_cycle(dg)
            raise ValueError(f"graph '{self.name}' has a cycle through {order[cycle[0][0]]!r}")
        # Relink the existing cells in the new order (use lists are untouched).
        prev = self._root
        for i in sorted_ids:
            link = order[i]._link
            link.prev = prev
            prev.next = link
            prev = link
        prev.next = self._root
        self._root.prev = prev
        if recursive:
            for n in order:
                for sub in n.subgraphs():
                    sub.sort(recursive=True)

    def __repr__(self):
        return f"Graph({self.name!r}, {len(self)} nodes)"


class _Link:
    """One cell of a graph's circular doubly linked node list (the root cell has no node)."""

    __slots__ = ("node", "prev", "next", "erased")

    def __init__(self, node: Optional[Node]):
        self.node = node
        self.prev: _Link = self
        self.next: _Link = self
        self.erased = False


def implicit_inputs(node: Node) -> List[Value]:
    """Values from outside ``node``'s subgraphs that those subgraphs read (outer-scope reads)."""
    result: Dict[Value, None] = {}
    for sub in node.subgraphs():
        defined = set(sub.inputs) | set(sub.initializers.values())
        _collect_outer(sub, defined, result)
    return list(result)


def _collect_outer(graph: Graph, defined: set, result: Dict[Value, None]) -> None:
    defined = set(defined)
    for n in graph:
        for v in n.inputs:
            if v is not None and v not in defined:
                result[v] = None
        for sub in n.subgraphs():
            _collect_outer(sub, defined | set(sub.inputs) | set(sub.initializers.values()), result)
        defined.update(n.outputs)
    for v in graph.outputs:
        if v not in defined:
            result[v] = None


def union_provenance(nodes: Iterable[Node]) -> Tuple[str, ...]:
    """The ordered union of the nodes' provenance (each source name once)."""
    out: Dict[str, None] = {}
    for n in nodes:
        for p in n.provenance:
            out[p] = None
    return tuple(out)


class Function:
    """A model-local function (``onnx.FunctionProto``): a body graph plus attribute parameters.

    ``attributes`` lists the attribute parameter names without defaults; ``attribute_defaults``
    holds those with a default (``Attr``), as in ``FunctionProto.attribute_proto``.
    """

    def __init__(self, domain: str, name: str, graph: Graph, opset_imports: Dict[str, int],
                 attributes: Sequence[str] = (), attribute_defaults: Sequence[Attr] = (),
                 overload: str = "", doc_string: str = ""):
        self.domain = domain
        self.name = name
        self.overload = overload
        self.graph = graph
        self.opset_imports = dict(opset_imports)
        self.attributes = list(attributes)
        self.attribute_defaults = list(attribute_defaults)
        self.doc_string = doc_string
        self.metadata_props: Dict[str, str] = {}

    @property
    def key(self) -> Tuple[str, str, str]:
        return (self.domain, self.name, self.overload)

    def __repr__(self):
        return f"Function({self.domain}::{self.name})"


class Model:
    """A model: the main graph, opset imports, model-local functions and metadata.

    ``extra`` keeps the ModelProto fields passctl does not model (``training_info``,
    ``configuration``) as serialized protos, so export writes them back unchanged.
    """

    def __init__(self, graph: Graph, opset_imports: Optional[Dict[str, int]] = None,
                 ir_version: int = 10, producer_name: str = "passctl", producer_version: str = "",
                 domain: str = "", model_version: int = 0, doc_string: str = "",
                 functions: Sequence[Function] = ()):
        self.graph = graph
        self.opset_imports: Dict[str, int] = dict(opset_imports or {"": 21})
        self.ir_version = ir_version
        self.producer_name = producer_name
        self.producer_version = producer_version
        self.domain = domain
        self.model_version = model_version
        self.doc_string = doc_string
        self.metadata_props: Dict[str, str] = {}
        self.functions: Dict[Tuple[str, str, str], Function] = {f.key: f for f in functions}
        self.extra: Dict[str, List[bytes]] = {}
        # Folder of the source file (external data resolves against it), when imported from a file.
        self.base_dir: Optional[str] = None
        # The ONNX file the model was imported from (set by the importer); the IR text form refers to
        # unchanged weights in it by tensor name instead of copying them.
        self.source_path: Optional[str] = None

    def graphs(self) -> List[Graph]:
        """Every graph of the model: the main graph, its subgraphs (If/Loop/Scan bodies, recursively),
        then each model-local function's body and its subgraphs."""
        out = [self.graph]
        out.extend(g for n in self.graph.all_nodes() for g in n.subgraphs())
        for f in self.functions.values():
            out.append(f.graph)
            out.extend(g for n in f.graph.all_nodes() for g in n.subgraphs())
        return out

    @property
    def opset(self) -> int:
        """The default-domain opset version."""
        return self.opset_imports.get("", self.opset_imports.get("ai.onnx", 0))

    def __repr__(self):
        return f"Model({self.graph.name!r}, opset {self.opset}, {len(self.graph)} nodes)"
