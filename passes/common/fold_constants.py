"""fold-constants: evaluate nodes whose inputs are all constants (in ONNX Runtime) and lift Constant
nodes to initializers."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import onnx
import onnx.helper

from passctl.ir import DataType, Graph, Model, Node, Shape, Tensor, TensorType, Value
from passctl.ir.errors import UserError
from passctl.passes.base import Pass, PassResult
from passctl.passes.common.constants import (attr_to_proto, constant_node_array, constant_tensor,
                                             is_pure, tensor_to_proto)
from passctl.passes.registry import register_pass

logger = logging.getLogger(__name__)

# Ops kept even when their inputs are constant: folding DequantizeLinear of an int8 weight would turn
# a QDQ model back into a float one (ONNX Runtime needs the DQ node to pick its int8 kernels).
_KEEP_BY_DEFAULT = frozenset({"DequantizeLinear"})

LOW_BIT_DTYPES = frozenset({DataType.INT8, DataType.UINT8, DataType.INT4, DataType.UINT4,
                            DataType.INT2, DataType.UINT2})
"""Integer element types of quantized weights: a constant computed from such data is never folded
into a larger tensor (rule 5), whatever spells the dequantization (DequantizeLinear, Cast -> Mul,
Cast -> Sub -> Mul, ...)."""

REFERENCE_OPS = frozenset({
    "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Concat", "Split",
    "Slice", "Gather", "Expand", "Tile", "ConstantOfShape", "Shape", "Size",
})
"""Ops that ``onnx.reference`` may fold when ONNX Runtime's CPU provider has no kernel for the
element types at hand: data movement only, each checked against ONNX Runtime in
``tests/passes/common/test_fold_ort.py``. Every other op is folded by ONNX Runtime or not at all
(``onnx.reference`` differs from it, e.g. LpNormalization p=1 divides by ``sum(x)`` instead of
``sum(|x|)``)."""


@register_pass
class FoldConstants(Pass):
    """Replace constant subexpressions by initializers.

    Rules:
      1. A ``Constant`` node becomes an initializer holding its value (lift); its output keeps its
         name and consumers. Paddle exports (PP-OCR) keep every weight in Constant nodes.
      2. A default-domain node whose inputs are all constants (initializers that are not graph
         inputs, or Constant outputs) is evaluated by ONNX Runtime's CPU provider (the runtime the
         result must agree with) on a one-node model at ``ORT_DISABLE_ALL``, and its used outputs
         become initializers under the same names. Only where ONNX Runtime has no kernel for the
         node's types, an op of :data:`REFERENCE_OPS` (data movement, checked against ONNX
         Runtime) is evaluated with ``onnx.reference`` instead; any other node is kept.
      3. ``Shape`` / ``Size`` of a value whose shape is fully static is computed from the type;
         (3b) a ``Slice`` / ``Gather`` of a ``Shape`` output that picks only static dims of a
         partly dynamic shape (``x.shape[-1]`` of a ``[batch, seq, 8, 32]`` value) is folded too.
      4. Never folded: nodes with subgraphs, random ops (RandomNormal, Dropout, ...), custom-domain
         ops and model-local function calls, ``DequantizeLinear`` (unless ``fold_dequantize``), and
         results larger than ``size_limit`` bytes (counted in ``too_large``).
      5. Low-bit weights stay low-bit: a node whose constant inputs hold data computed from an
         int8 / uint8 / int4 / uint4 (:data:`LOW_BIT_DTYPES`) tensor is folded only when its
         result is no larger than that low-bit data (a Reshape or Transpose of int8 weights is
         folded, ``Cast(int8 -> float) -> Mul(scale)`` is not: it would store the weights 4x
         larger; counted in ``low_bit_kept``). ``fold_dequantize`` lifts this rule too.

    Subgraphs are processed too (a folded value lands in the graph that produced it); function
    bodies are not (their Constant nodes may reference the caller's attributes).

    Statistics: ``lifted`` (Constant nodes made initializers), ``folded`` (nodes evaluated and
    replaced), ``too_large`` (not folded: result over ``size_limit``), ``low_bit_kept`` (not
    folded: rule 5), ``failed`` (ONNX Runtime cannot run the node, or returned an unexpected
    element type; the node is kept).
    """

    name = "fold-constants"
    summary = "Evaluate nodes with constant inputs and lift Constant nodes to initializers"

    @dataclass
    class Options:
        """Options of fold-constants.

        Attributes:
            size_limit: largest folded result, in bytes (summed over a node's outputs); >= 0.
            fold_dequantize: also fold dequantizations of constant low-bit weights
                (DequantizeLinear, and any larger result computed from int8/uint8/int4/uint4 data).
        """

        size_limit: int = 1 << 20
        fold_dequantize: bool = False

        def __post_init__(self) -> None:
            """Raises UserError: ``size_limit`` is negative (it would silently fold nothing)."""
            if self.size_limit < 0:
                raise UserError(f"fold-constants: size_limit={self.size_limit} must be >= 0 bytes "
                                "(0 only lifts Constant nodes; the default is 1048576)")

    def run(self, model: Model) -> PassResult:
        self._model = model
        self._stats = {"lifted": 0, "folded": 0, "too_large": 0, "low_bit_kept": 0, "failed": 0}
        self._low_bit: Dict[Value, int] = {}  # folded value -> bytes of the low-bit data it comes from
        self._fold_graph(model.graph)
        stats = self._stats
        return PassResult(stats["lifted"] + stats["folded"] > 0, dict(stats))

    # -- traversal ------------------------------------------------------------------------------
    def _fold_graph(self, graph: Graph) -> None:
        self._batched, self._rebatch = self._evaluate_batch(graph), True
        for node in graph:
            subs = node.subgraphs()
            if subs:
                state = self._batched, self._rebatch
                for sub in subs:
                    self._fold_graph(sub)
                self._batched, self._rebatch = state
                continue
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                self._lift(graph, node)
                continue
            arrays = self._evaluate(node)
            if arrays is not None:
                self._replace_by_initializers(graph, node, arrays)
                self._stats["folded"] += 1

    def _lift(self, graph: Graph, node: Node) -> None:
        out = node.outputs[0]
        if out.is_graph_output() and graph.parent is not None:
            return  # A subgraph's output stays produced by a node.
        arr = constant_node_array(node)
        if arr is None:
            return
        tensor = node.attr("value") if isinstance(node.attr("value"), Tensor) else Tensor(arr)
        self._replace_by_initializers(graph, node, [tensor])
        self._stats["lifted"] += 1

    # -- evaluation -----------------------------------------------------------------------------
    def _foldable(self, node: Node) -> bool:
        if not is_pure(node) or not node.inputs:
            return False
        if node.op_type in _KEEP_BY_DEFAULT and not self.options.fold_dequantize:
            return False
        graph = node.graph
        if graph.parent is not None and any(o.is_graph_output() for o in node.outputs):
            return False
        return True

    def _evaluate(self, node: Node) -> Optional[List[np.ndarray]]:
        """The node's output arrays when it can be folded, else None (stats updated)."""
        if not self._foldable(node):
            return None
        if node.op_type in ("Shape", "Size"):
            arr = _static_shape_op(node)
            if arr is not None:
                return [arr]
        if node.op_type in ("Slice", "Gather"):
            arr = self._static_part_of_shape(node)
            if arr is not None:
                return [arr]
        inputs = [None if v is None else constant_tensor(v) for v in node.inputs]
        if any(v is not None and t is None for v, t in zip(node.inputs, inputs)):
            return None
        if self._over_limit_by_type(node):
            self._stats["too_large"] += 1
            return None
        low_bit = 0 if self.options.fold_dequantize else self._low_bit_bytes(node)
        if low_bit and _bytes_by_type(node) is not None and _bytes_by_type(node) > low_bit:
            self._stats["low_bit_kept"] += 1
            return None
        arrays = self._batched.get(node)
        if arrays is None and self._rebatch:  # constant since the batch (rule 3): the next batch
            self._batched = self._evaluate_batch(node.graph, node)
            self._rebatch = bool(self._batched)
            arrays = self._batched.get(node)
        try:
            arrays = arrays or evaluate_node(node, inputs, self._model.opset_imports)
        except Exception as e:  # ONNX Runtime raises many kinds; the node is simply kept
            logger.debug("fold-constants: cannot evaluate %r: %s: %s", node, type(e).__name__, e)
            self._stats["failed"] += 1
            return None
        nbytes = sum(a.nbytes for a, v in zip(arrays, node.outputs) if v.uses() or
                     v.is_graph_output())
        if nbytes > self.options.size_limit:
            self._stats["too_large"] += 1
            return None
        if low_bit and sum(a.nbytes for a in arrays) > low_bit:
            self._stats["low_bit_kept"] += 1
            return None
        for a, v in zip(arrays, node.outputs):
            try:
                dt = DataType.from_numpy(a.dtype)
            except TypeError:
                dt = None
            if dt is None or (v.dtype is not None and v.dtype != dt):
                logger.debug("fold-constants: %r output '%s' evaluated to %s, declared %s; kept",
                             node, v.name, a.dtype, v.dtype)
                self._stats["failed"] += 1
                return None
        if low_bit:
            self._low_bit.update((v, low_bit) for v in node.outputs)
        return arrays

    def _evaluate_batch(self, graph: Graph, start: Optional[Node] = None
                        ) -> Dict[Node, List[np.ndarray]]:
        """The outputs of every node of ``graph`` (not its subgraphs; from ``start`` on) that rule
        2 may evaluate, from one ONNX Runtime session instead of one per node: nodes whose inputs
        are constants, static ``Shape`` / ``Size`` results or outputs of such nodes, minus those
        over ``size_limit`` or reading low-bit data (rule 5) by their declared types, and what
        reads them. The results are the per-node ones (same kernels, same inputs, optimizations
        off); the per-node checks still decide what is folded. A node that became constant only
        during the traversal (rule 3b's shape slices) starts the next batch from it. Empty when
        fewer than two nodes qualify or the batch does not run (an op without a kernel): nodes
        are then evaluated alone.
        """
        known: Dict[Value, Optional[Tensor]] = {}  # value -> its constant (None: a batch output)
        picked: List[Node] = []
        started = start is None
        for node in graph:
            started = started or node is start
            if not started or not self._foldable(node) or node.op_type == "Constant":
                continue
            if node.op_type in ("Shape", "Size"):
                arr = _static_shape_op(node)
                if arr is not None:
                    known[node.outputs[0]] = Tensor(arr)
                    continue
            live = [v for v in node.inputs if v is not None]
            if not all(v in known or constant_tensor(v) is not None for v in live):
                continue
            if self._over_limit_by_type(node) or (not self.options.fold_dequantize and any(
                    v not in known and (v in self._low_bit or constant_tensor(v).dtype in
                                        LOW_BIT_DTYPES) for v in live)):
                continue  # (low-bit data, and what reads it: decided node by node, rule 5)
            try:
                for a in node.attributes.values():
                    attr_to_proto(a)
            except ValueError:
                continue
            picked.append(node)
            known.update((o, None) for o in node.outputs)
        if len(picked) < 2:
            return {}
        names: Dict[Value, str] = {}
        inits: List[onnx.TensorProto] = []

        def name(v: Value) -> str:
            if v not in names:
                names[v] = f"v{len(names)}"
                t = known.get(v) if v in known else constant_tensor(v)
                if t is not None:
                    inits.append(tensor_to_proto(t, names[v]))
            return names[v]

        protos = []
        for node in picked:
            proto = onnx.helper.make_node(node.op_type, ["" if v is None else name(v)
                                                         for v in node.inputs],
                                          [name(o) for o in node.outputs], domain=node.domain)
            proto.attribute.extend(attr_to_proto(a) for a in node.attributes.values())
            protos.append(proto)
        outs = [o for n in picked for o in n.outputs]
        version = self._model.opset_imports.get("", self._model.opset_imports.get("ai.onnx", 21))
        opset = onnx.helper.make_opsetid("", version)
        model = onnx.helper.make_model(
            onnx.helper.make_graph(protos, "fold", [], [onnx.ValueInfoProto(name=names[o])
                                                        for o in outs], inits),
            opset_imports=[opset], ir_version=max(onnx.helper.find_min_ir_version_for([opset]), 8))
        try:
            arrays = _run_ort(model)
        except Exception as e:  # one node ORT cannot run: every node alone, as without a batch
            logger.debug("fold-constants: batch of %d nodes not run (%s); node by node",
                         len(picked), str(e).splitlines()[0][:200])
            return {}
        by_value = dict(zip(outs, arrays))
        return {n: [by_value[o] for o in n.outputs] for n in picked}

    def _low_bit_bytes(self, node: Node) -> int:
        """Bytes of low-bit integer data (rule 5) that ``node``'s constant inputs are computed from:
        low-bit initializers / Constant values themselves, and values folded from them."""
        total = 0
        for v in {u for u in node.inputs if u is not None}:
            if v in self._low_bit:
                total += self._low_bit[v]
                continue
            t = constant_tensor(v)
            if t is not None and t.dtype in LOW_BIT_DTYPES:
                total += (int(np.prod(t.dims, dtype=np.int64)) * t.dtype.bitwidth + 7) // 8
        return total

    def _static_part_of_shape(self, node: Node) -> Optional[np.ndarray]:
        """Slice / Gather of a ``Shape`` output that selects only static dims (rule 3b).

        The selected positions are found by evaluating the node on ``arange(rank)`` in place of
        the shape vector (same indices, starts, ends...), so every Slice / Gather form is covered.
        """
        data = node.inputs[0]
        shape_node = data.producer if data is not None else None
        if shape_node is None or shape_node.op_type != "Shape" or not is_pure(shape_node):
            return None
        src = shape_node.inputs[0]
        if src is None or src.shape is None:
            return None
        dims = _shape_slice(shape_node, list(src.shape.dims))
        rest = [None if v is None else constant_tensor(v) for v in node.inputs[1:]]
        if any(v is not None and t is None for v, t in zip(node.inputs[1:], rest)):
            return None
        positions = Tensor(np.arange(len(dims), dtype=np.int64))
        try:
            (picked,) = evaluate_node(node, [positions] + rest, self._model.opset_imports)
        except Exception as e:  # an unsupported form: simply not folded
            logger.debug("fold-constants: cannot evaluate %r on positions: %s", node, e)
            return None
        selected = [dims[int(i)] for i in picked.reshape(-1)]
        if not all(isinstance(d, int) for d in selected):
            return None
        return np.array(selected, dtype=np.int64).reshape(picked.shape)

    def _over_limit_by_type(self, node: Node) -> bool:
        total = _bytes_by_type(node)
        return total is not None and total > self.options.size_limit

    # -- rewriting ------------------------------------------------------------------------------
    def _replace_by_initializers(self, graph: Graph, node: Node, arrays: Sequence) -> None:
        """Remove ``node``; each of its outputs that is still needed becomes an initializer.

        The output Value objects are kept (names, consumers and graph-output slots stay), only
        their producer changes.
        """
        outputs = list(node.outputs)
        graph.remove(node, safe=False)
        node.set_outputs(())
        for v, data in zip(outputs, arrays):
            if not v.uses() and not any(o is v for o in graph.outputs):
                continue
            tensor = data if isinstance(data, Tensor) else Tensor(np.asarray(data))
            if not v.name or v.name in graph.initializers:
                v.name = graph.fresh_name(v.name or "folded")
            tensor.name = v.name
            v.const = tensor
            v.type = TensorType(tensor.dtype, Shape(tensor.dims))
            graph.add_initializer(v)


def _static_shape_op(node: Node) -> Optional[np.ndarray]:
    """``Shape`` (with start/end, opset 15) or ``Size`` of a statically shaped input, else None."""
    shape = node.inputs[0].shape if node.inputs and node.inputs[0] is not None else None
    if shape is None or not shape.is_static():
        return None
    dims = list(shape.dims)
    if node.op_type == "Size":
        return np.array(int(np.prod(dims, dtype=np.int64)), dtype=np.int64)
    return np.array(_shape_slice(node, dims), dtype=np.int64)


def _shape_slice(shape_node: Node, dims: list) -> list:
    """The dims a ``Shape`` node returns: ``dims[start:end]`` (Shape-15 spec, clamped)."""
    rank = len(dims)
    start = shape_node.attr("start", 0)
    end = shape_node.attr("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return dims[start:end]


def _bytes_by_type(node: Node) -> Optional[int]:
    """Bytes of all of ``node``'s outputs from their declared types, or None when one is unknown."""
    total = 0
    for v in node.outputs:
        if v.shape is None or v.dtype is None or not v.shape.is_static():
            return None
        total += (v.shape.numel() * v.dtype.bitwidth + 7) // 8
    return total


def evaluate_node(node: Node, inputs: Sequence[Optional[Tensor]],
                  opset_imports: Dict[str, int]) -> List[np.ndarray]:
    """``node``'s outputs on the constant ``inputs`` (None: an omitted optional input), computed
    by ONNX Runtime's CPU provider on a one-node model (inputs as initializers, graph
    optimizations off); where ONNX Runtime cannot build that model (no kernel for these types)
    and the op is in :data:`REFERENCE_OPS`, by ``onnx.reference.ReferenceEvaluator``.

    Raises:
        Exception: whatever ONNX Runtime (or the reference evaluator) raises for an op it cannot
            run or bad inputs.
    """
    proto = _one_node_model(node, inputs, opset_imports)
    try:
        return _run_ort(proto)
    except Exception:
        if node.op_type not in REFERENCE_OPS:
            raise
    from onnx.reference import ReferenceEvaluator

    return [np.asarray(a) for a in ReferenceEvaluator(proto).run(None, {})]


def _one_node_model(node: Node, inputs: Sequence[Optional[Tensor]],
                    opset_imports: Dict[str, int]) -> onnx.ModelProto:
    """A model computing ``node`` alone from ``inputs`` held as initializers; outputs untyped
    (ONNX Runtime infers them)."""
    in_names = ["" if t is None else f"in{i}" for i, t in enumerate(inputs)]
    out_names = [f"out{i}" for i in range(len(node.outputs))]
    proto = onnx.helper.make_node(node.op_type, in_names, out_names, domain=node.domain)
    proto.attribute.extend(attr_to_proto(a) for a in node.attributes.values())
    version = opset_imports.get("", opset_imports.get("ai.onnx", 21))
    inits = [tensor_to_proto(t, n) for n, t in zip(in_names, inputs) if t is not None]
    graph = onnx.helper.make_graph([proto], "fold", [], [onnx.ValueInfoProto(name=n)
                                                         for n in out_names], inits)
    opset = onnx.helper.make_opsetid("", version)
    return onnx.helper.make_model(graph, opset_imports=[opset],
                                  ir_version=max(onnx.helper.find_min_ir_version_for([opset]), 8))


def _run_ort(proto: onnx.ModelProto) -> List[np.ndarray]:
    """Run a one-node model in ONNX Runtime's CPU provider, graph optimizations off."""
    from passctl.support.check import cpu_session

    session = cpu_session(proto.SerializeToString(), optimize=False, threads=1)
    return [np.asarray(a) for a in session.run(None, {})]
