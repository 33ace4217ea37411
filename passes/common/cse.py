"""cse: merge nodes that compute the same thing (common subexpression elimination)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, Hashable, Optional, Tuple

import numpy as np

from passctl.ir import Attr, AttrType, Graph, Model, Node, Tensor, Value
from passctl.passes.base import Pass, PassResult
from passctl.passes.common.constants import is_pure
from passctl.passes.registry import register_pass

logger = logging.getLogger(__name__)


@register_pass
class CommonSubexpressionElimination(Pass):
    """Common subexpression elimination.

    Rules:
      1. Two deterministic default-domain nodes with the same op type, domain, overload, attributes
         and inputs compute the same outputs: the later one is removed and its consumers read the
         earlier one's outputs. Nodes are visited in order, so chains of equal nodes merge in one
         sweep.
      2. Inputs are compared by identity, except initializers of at most ``max_const_bytes`` bytes,
         which are compared by element type, shape and bytes (two equal small constants are one).
         Tensor attributes (``Constant`` values) are compared the same way.
      3. Never merged: nodes with subgraphs, random ops (RandomNormal, Dropout, ...), custom-domain
         ops and function calls; a node whose output is a graph output is kept (its name is part of
         the model's interface).

    Each graph and subgraph is processed on its own (no merging across scopes).

    Statistics: ``eliminated`` (nodes removed).
    """

    name = "cse"
    summary = "Merge nodes with the same op, attributes and inputs"

    @dataclass
    class Options:
        """Options of cse.

        Attributes:
            max_const_bytes: initializers and tensor attributes up to this many bytes are compared
                by value; larger ones by identity.
        """

        max_const_bytes: int = 4096

    def run(self, model: Model) -> PassResult:
        count = self._cse_graph(model.graph)
        for fn in model.functions.values():
            count += self._cse_graph(fn.graph)
        return PassResult(count > 0, {"eliminated": count})

    def _cse_graph(self, graph: Graph) -> int:
        count = 0
        seen: Dict[Hashable, Node] = {}
        outputs = {id(v) for v in graph.outputs}
        for node in graph:
            for sub in node.subgraphs():
                count += self._cse_graph(sub)
            if not is_pure(node):
                continue
            key = self._node_key(node)
            if key is None:
                continue
            first = seen.get(key)
            if first is None:
                seen[key] = node
                continue
            if any(id(v) in outputs for v in node.outputs):
                continue
            for old, new in zip(node.outputs, first.outputs):
                old.replace_all_uses_with(new)
            graph.remove(node, safe=True)
            count += 1
        return count

    def _node_key(self, node: Node) -> Optional[Tuple]:
        attrs = []
        for name in sorted(node.attributes):
            k = self._attr_key(node.attributes[name])
            if k is None:
                return None
            attrs.append((name, k))
        inputs = tuple(self._value_key(v) for v in node.inputs)
        return (node.domain, node.op_type, node.overload, len(node.outputs), tuple(attrs), inputs)

    def _value_key(self, value: Optional[Value]) -> Hashable:
        if value is None:
            return None
        t = value.const
        if t is not None and not value.is_graph_input() and t.nbytes <= self.options.max_const_bytes:
            k = self._tensor_key(t)
            if k is not None:
                return k
        return ("v", id(value))

    def _tensor_key(self, t: Tensor) -> Optional[Hashable]:
        if t.nbytes > self.options.max_const_bytes:
            return None
        try:
            data = t.tobytes()
        except TypeError:  # string tensors
            data = repr(np.asarray(t.numpy()).tolist()).encode()
        return ("c", int(t.dtype), t.dims, data)

    def _attr_key(self, attr: Attr) -> Optional[Hashable]:
        if attr.ref_attr_name:
            return ("ref", attr.ref_attr_name)
        if attr.type in (AttrType.GRAPH, AttrType.GRAPHS, AttrType.SPARSE_TENSOR,
                         AttrType.SPARSE_TENSORS, AttrType.TYPE_PROTO, AttrType.TYPE_PROTOS):
            return None
        if attr.type == AttrType.TENSOR:
            return self._tensor_key(attr.value)
        if attr.type == AttrType.TENSORS:
            keys = tuple(self._tensor_key(t) for t in attr.value)
            return None if any(k is None for k in keys) else keys
        value: Any = attr.value
        if attr.type in (AttrType.FLOAT, AttrType.FLOATS):
            # Compare floats by their float32 bits so -0.0 != 0.0 and NaN == NaN.
            value = np.asarray(value, dtype=np.float32).tobytes()
        return (int(attr.type), value)
