"""Write a precision assignment into the graph: retype values, insert and simplify Casts, convert weights."""

from __future__ import annotations

import logging
from typing import Callable, Dict, Iterable, List, Optional, Set, Tuple

import numpy as np

from passctl.ir import Attr, AttrType, DataType, Graph, Model, Node, Tensor, TensorType, Value
from passctl.passes.common.constants import constant_tensor
from passctl.passes.precision.ops import ANY_TYPE_INPUTS, float_inputs, typed_outputs

logger = logging.getLogger(__name__)

# Source types whose every value float32 represents exactly, so Cast(Cast(x, FLOAT), C) == Cast(x, C).
_EXACT_IN_FLOAT = frozenset({DataType.FLOAT16, DataType.BFLOAT16, DataType.BOOL, DataType.INT8,
                             DataType.UINT8, DataType.INT16, DataType.UINT16, DataType.FLOAT})

WeightCache = Dict[Tuple[int, int], Tensor]
"""``(id(float32 tensor), target DataType) -> converted Tensor``, shared between calls so a weight is
converted once even when several candidate assignments are built (the search)."""


def _retype(value: Value, dtype: DataType) -> None:
    shape = value.shape if isinstance(value.type, TensorType) else None
    value.type = TensorType(dtype, shape)


def _cast_node(graph: Graph, value: Value, dtype: DataType, name: str) -> Node:
    out = Value(graph.fresh_name(f"{value.name}_{dtype.short_name}"), TensorType(dtype, value.shape))
    provenance = value.producer.provenance if value.producer is not None else ()
    return Node("", "Cast", [value], [Attr("to", AttrType.INT, int(dtype))], [out],
                name=graph.fresh_name(name), provenance=provenance)


def _insert_after_producer(graph: Graph, value: Value, node: Node) -> None:
    producer = value.producer
    if producer is not None and producer.graph is graph:
        graph.insert_after(producer, node)
    else:  # graph input, initializer, or a value of an outer scope: before the first node
        first = next(iter(graph), None)
        graph.insert_before(first, node)


def convert_array(arr: np.ndarray, dtype: DataType) -> Tuple[np.ndarray, int]:
    """``arr`` (float32) in ``dtype``, finite values that would round to inf clamped to the finite
    range; returns the array and how many values were clamped (the rules keep such constants out)."""
    target = dtype.numpy()
    with np.errstate(over="ignore"):
        out = np.asarray(arr).astype(target)
    bad = np.isinf(out) & np.isfinite(arr)
    clamped = int(np.count_nonzero(bad))
    if clamped:
        import ml_dtypes
        top = ml_dtypes.finfo(target).max
        out = np.where(bad, np.where(arr > 0, top, -top).astype(target), out)
    return out, clamped


class _Writer:
    """State of one :func:`apply_precision` call."""

    def __init__(self, graph: Graph, low: DataType, cache: Optional[WeightCache]):
        self.graph, self.low = graph, low
        self.cache = cache if cache is not None else {}
        self.converted: Dict[Tuple[Value, int], Value] = {}
        self.runtime_up: Dict[Value, Value] = {}
        self.stats = {"casts_inserted": 0, "weights_converted": 0, "weight_bytes_saved": 0,
                      "clamped": 0, "emulated_nodes": 0}
        self.replaced_constants: List[Value] = []

    def convert(self, value: Value, dtype: DataType) -> Value:
        """``value`` in ``dtype``: a converted initializer for constants, else a shared Cast."""
        key = (value, int(dtype))
        if key in self.converted:
            return self.converted[key]
        tensor = constant_tensor(value)
        if tensor is not None and tensor.dtype == DataType.FLOAT and dtype != DataType.FLOAT:
            ckey = (id(tensor), int(dtype))
            conv = self.cache.get(ckey)
            if conv is None:
                arr, clamped = convert_array(tensor.numpy(), dtype)
                self.stats["clamped"] += clamped
                conv = Tensor(arr, dtype)
                self.cache[ckey] = conv
            new = self.graph.add_constant(Tensor(conv.numpy(), dtype),
                                          f"{value.name}_{dtype.short_name}")
            self.stats["weights_converted"] += 1
            self.stats["weight_bytes_saved"] += tensor.nbytes - conv.nbytes
            self.replaced_constants.append(value)
        else:
            node = _cast_node(self.graph, value, dtype, "amp_cast")
            _insert_after_producer(self.graph, value, node)
            self.stats["casts_inserted"] += 1
            new = node.outputs[0]
        self.converted[key] = new
        return new

    def up_at_runtime(self, value: Value) -> Value:
        """A Cast of ``value`` to float32; for a constant a Cast node too, never a folded float32 copy
        (emulation keeps the weight stored in the low type)."""
        if constant_tensor(value) is None:  # a computed value: share the Cast other consumers use
            return self.convert(value, DataType.FLOAT)
        if value in self.runtime_up:
            return self.runtime_up[value]
        node = _cast_node(self.graph, value, DataType.FLOAT, "amp_emulate_in")
        _insert_after_producer(self.graph, value, node)
        self.runtime_up[value] = node.outputs[0]
        return node.outputs[0]


def apply_precision(model: Model, low_nodes: Iterable[Node], low: DataType,
                    emulate: Optional[Callable[[Node], bool]] = None, keep_io: bool = True,
                    cache: Optional[WeightCache] = None) -> Dict[str, int]:
    """Make ``low_nodes`` compute in ``low`` and insert the Casts the types then need.

    Steps: (1) the float32 outputs of every low node become ``low``; (2) each use whose node wants
    another type gets a converted value, one per (value, type): a constant becomes a new initializer
    converted once (``cache``), anything else a Cast placed right after its producer; (3) graph
    outputs keep float32 through a final Cast that takes the output's name (``keep_io``), graph inputs
    are cast on entry; (4) nodes for which ``emulate(node)`` is true keep the low-precision
    interface but compute in float32 (Cast up before, Cast down after), which rounds exactly like an
    fp16/bf16 kernel with float32 accumulation and lets ONNX Runtime's CPU execution provider (no
    bf16 kernels, few fp16 ones) run the graph; (5) :func:`simplify_casts`.

    Args:
        model: The model, changed in place; element types must be known (infer-shapes).
        low_nodes: Nodes of the main graph to run in ``low`` (each must satisfy ``ops.convertible``).
        low: DataType.FLOAT16 or DataType.BFLOAT16.
        emulate: Which low nodes compute in float32 behind their low-precision interface.
        keep_io: Keep float32 graph inputs and outputs float32 (else they become ``low``).
        cache: Converted weights shared between calls (see :data:`WeightCache`).

    Returns:
        Statistics: ``casts_inserted``, ``weights_converted``, ``weight_bytes_saved``, ``clamped``,
        ``emulated_nodes``, ``casts_removed``.
    """
    graph = model.graph
    low_set: Set[Node] = set(low_nodes)
    slots = {n: float_inputs(n) for n in low_set}
    w = _Writer(graph, low, cache)
    original = {}
    for node in low_set:
        for o in (node.outputs[i] for i in typed_outputs(node)):
            if o.dtype == DataType.FLOAT:
                original[o] = DataType.FLOAT
                _retype(o, low)
    if not keep_io:
        for v in graph.inputs:
            if v.dtype == DataType.FLOAT and not v.is_initializer():
                original[v] = DataType.FLOAT
                _retype(v, low)
    values: Dict[Value, None] = {}
    for v in list(graph.inputs) + list(graph.initializers.values()):
        values[v] = None
    for node in list(graph):
        for v in node.inputs:
            if v is not None:
                values[v] = None
    for v in list(values):
        for node, i in v.uses():
            if node.graph is not graph:
                continue
            if node in low_set and i in slots[node]:
                want = low
            elif i in ANY_TYPE_INPUTS.get(node.op_type, ()):
                continue
            else:
                want = original.get(v, v.dtype)
            if want is not None and v.dtype is not None and want != v.dtype:
                node.set_input(i, w.convert(v, want))
    _fix_outputs(graph, low, keep_io, w)
    if emulate is not None:
        for node in [n for n in graph if n in low_set and emulate(n)]:
            _emulate(graph, node, slots[node], w)
    removed = simplify_casts(graph)
    _drop_orphans(graph, w.replaced_constants)
    stats = dict(w.stats)
    stats["casts_removed"] = removed
    return stats


def _fix_outputs(graph: Graph, low: DataType, keep_io: bool, w: _Writer) -> None:
    """Give each graph output its interface type through a Cast that takes the output's name (an
    existing Cast of the same value to that type is reused, so no two Casts compute the same)."""
    done: Dict[Value, Value] = {}
    for i, v in enumerate(list(graph.outputs)):
        if v in done:  # the same value listed twice as an output
            graph.outputs[i] = done[v]
            continue
        if v.dtype not in (DataType.FLOAT, low) or v.is_graph_input():
            continue
        want = DataType.FLOAT if keep_io else low
        if v.dtype == want:
            continue
        if keep_io and v.producer is None:
            continue
        out = w.converted.get((v, int(want)))
        if out is None or out.producer is None:  # no Cast to reuse: a new one
            node = _cast_node(graph, v, want, "amp_output_cast")
            _insert_after_producer(graph, v, node)
            w.stats["casts_inserted"] += 1
            out = node.outputs[0]
            w.converted[(v, int(want))] = out
        name = v.name
        v.name = graph.fresh_name(f"{name}_{v.dtype.short_name}")
        out.name = name
        graph.outputs[i] = done[v] = out


def _emulate(graph: Graph, node: Node, slots: Tuple[int, ...], w: _Writer) -> None:
    for i in slots:
        v = node.inputs[i]
        if v is not None and v.dtype != DataType.FLOAT:
            node.set_input(i, w.up_at_runtime(v))
    outs = list(node.outputs)
    for k, o in enumerate(outs):
        if o.dtype != w.low:
            continue
        wide = Value(graph.fresh_name(f"{o.name}_f32"), TensorType(DataType.FLOAT, o.shape))
        outs[k] = wide
        node.set_outputs(outs)
        down = Node("", "Cast", [wide], [Attr("to", AttrType.INT, int(w.low))], [o],
                    name=graph.fresh_name("amp_emulate_out"), provenance=node.provenance)
        graph.insert_after(node, down)
    w.stats["emulated_nodes"] += 1


def simplify_casts(graph: Graph) -> int:
    """Remove redundant Casts of ``graph``; returns how many were removed.

    Rules: (1) ``Cast(x, to=type(x))`` is ``x``; (2) ``Cast(Cast(x, to=B), to=C)`` is ``Cast(x, to=C)``
    when B represents every value of x's type exactly (B float32 and x fp16/bf16/bool/8- or 16-bit
    integer, or B equal to x's type); so ``Cast(Cast(x16, f32), f16)`` ping-pong disappears, while
    ``Cast(Cast(x32, f16), f32)`` (a rounding) is kept; (3) Casts without uses are dropped (unless they
    produce a graph output).
    """
    removed = 0
    changed = True
    while changed:
        changed = False
        for node in list(graph):
            if node.op_type != "Cast" or node.domain not in ("", "ai.onnx") or node.graph is not graph:
                continue
            x, y = node.inputs[0], node.outputs[0]
            to = DataType(node.attr("to"))
            inner = x.producer if x is not None else None
            if (inner is not None and inner.op_type == "Cast" and inner.domain in ("", "ai.onnx")
                    and inner.inputs[0] is not None and inner.inputs[0].dtype is not None):
                source, mid = inner.inputs[0].dtype, DataType(inner.attr("to"))
                if mid == source or (mid == DataType.FLOAT and source in _EXACT_IN_FLOAT):
                    node.set_input(0, inner.inputs[0])
                    x = inner.inputs[0]
                    changed = True
            if x is not None and x.dtype == to and not y.is_graph_output():
                y.replace_all_uses_with(x)
            if not y.uses() and not y.is_graph_output():
                graph.remove(node)
                removed += 1
                changed = True
    return removed


def _drop_orphans(graph: Graph, values: List[Value]) -> None:
    """Remove replaced float32 constants (initializers or Constant nodes) nothing reads any more."""
    for v in values:
        if v.uses() or v.is_graph_output() or v.is_graph_input():
            continue
        if v.is_initializer():
            graph.remove_initializer(v.name)
        elif v.producer is not None and v.producer.op_type == "Constant" and v.producer.graph is graph:
            graph.remove(v.producer)
