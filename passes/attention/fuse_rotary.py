"""fuse-rotary: rotary position embedding (rotate-half or interleaved) -> ``passctl::RotaryEmbedding``."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from passctl.dialect.canonical import DOMAIN, VERSION, ensure_opset
from passctl.dialect.rotary import OP_TYPE
from passctl.ir import Builder, Graph, Model, Node, Value
from passctl.passes.attention.cone import run_subgraph, subgraph_model
from passctl.passes.base import Pass, PassResult
from passctl.passes.common.constants import constant_array, constant_tensor
from passctl.passes.registry import register_pass

logger = logging.getLogger(__name__)

_CONE_LIMIT = 200
"""Most nodes a cos/sin computation may have (beyond it the match is refused)."""


@dataclass
class _Tables:
    """The canonical form of one (cos, sin) pair: the position ids and the two caches."""

    positions: Value
    cos: Value
    sin: Value


@register_pass
class FuseRotary(Pass):
    """Replace rotary position embedding written with standard ops by ``passctl::RotaryEmbedding``.

    Rules (the root is ``Add``; Mul and Add operands in either order):
      1. rotate-half (transformers' ``rotate_half``, dynamo and legacy exports):
         ``Add(Mul(x, c), Mul(Concat(Neg(Slice(x, D/2:D)), Slice(x, 0:D/2), axis=-1), s))``
         [rotate-half].
      2. interleaved (GPT-J's ``rotate_every_two``, ``torch.stack((-x2, x1), -1).flatten(-2)``):
         ``Add(Mul(x, c), Mul(Reshape(Concat(Unsqueeze(Neg(Slice(x, 1::2))), Unsqueeze(Slice(x,
         0::2)), axis=-1)), s))`` with the Reshape back to x's shape [interleaved].
      3. ONNX ``RotaryEmbedding`` (opset 23) without position_ids, cos/sin ``[B, S, R/2]``
         computed from them (what the dynamo exporter writes for rule 1 at opset 23) [onnx-23].
    x is ``[B, H, S, D]`` with a static D. ``c`` and ``s`` may be any computation whose only
    non-constant input is one int64 ``[batch, sequence]`` graph input (``position_ids``), which
    covers every rope variant that does not change with length (default, linear, llama3, yarn's
    attention scaling): the pass evaluates them in ONNX Runtime on positions 0 .. ``max_positions``
    - 1, checks that row (b, s) depends on ``position_ids[b, s]`` alone (a second run on random
    positions of another batch and length must read the same rows), that they broadcast over the
    heads (``[B, 1, S, D]``), and that the halves (rule 1) or the pairs (rule 2) repeat, and folds
    them into ``cos_cache`` / ``sin_cache`` ``[max_positions, D/2]`` initializers.

    A near miss is left alone with a reason in the statistic ``unfused`` (e.g. the Neg on the other
    half, a split that is not D/2, tables whose halves differ). The cos/sin computation is left for
    ``dce``. Positions at or beyond ``max_positions`` are out of the caches' range (the lowered
    kernels refuse them): set ``max_positions`` to the longest sequence the model will see.

    Statistics: ``rotate-half``, ``interleaved``, ``onnx-23``, ``fused`` (their sum), ``unfused``.
    """

    name = "fuse-rotary"
    summary = "Recognize rotary position embedding (rotate-half, interleaved) as passctl::RotaryEmbedding"

    @dataclass
    class Options:
        max_positions: int = 4096
        """Rows of the folded cos/sin caches: positions 0 .. max_positions - 1."""

    def run(self, model: Model) -> PassResult:
        stats: Dict[str, object] = {"rotate-half": 0, "interleaved": 0, "onnx-23": 0, "fused": 0}
        unfused: List[str] = []
        self._model = model
        for graph in model.graphs():
            tables: Dict[Tuple[Value, Value, int], object] = {}
            for node in list(graph):
                if node.domain != "" or node.graph is None:
                    continue
                if node.op_type == "Add":
                    why = self._try(graph, node, tables, stats)
                elif node.op_type == "RotaryEmbedding" and len(node.inputs) == 3:
                    why = self._onnx23(graph, node, tables, stats)
                else:
                    continue
                if why:
                    unfused.append(f"{node.op_type} '{node.name}': {why}")
        if unfused:
            stats["unfused"] = unfused
        if stats["fused"]:
            ensure_opset(model, DOMAIN, VERSION)
        return PassResult(stats["fused"] > 0, stats)

    # -- one candidate -------------------------------------------------------------------------
    def _try(self, graph: Graph, add: Node, tables: dict, stats: dict) -> Optional[str]:
        """Fuse at ``add``; returns None when fused or when ``add`` is no rotary candidate at
        all, else the reason of the closest miss."""
        a, b = (v.producer if v is not None else None for v in add.inputs[:2])
        if a is None or b is None or a.op_type != "Mul" or b.op_type != "Mul":
            return None
        best = None
        for m1, m2 in ((a, b), (b, a)):
            for x, c in _pairs(m1):
                for rot, s in _pairs(m2):
                    form = _rotation(rot, x)
                    if isinstance(form, str):
                        best = best or (form if form != "-" else None)
                        continue
                    interleaved = form
                    why = self._fuse(graph, add, m1, m2, x, c, s, interleaved, tables)
                    if why is None:
                        key = "interleaved" if interleaved else "rotate-half"
                        stats[key] += 1
                        stats["fused"] += 1
                        return None
                    best = why
        return best

    def _onnx23(self, graph: Graph, node: Node, tables: dict, stats: dict) -> Optional[str]:
        """Rule 3: ONNX RotaryEmbedding-23 with computed cos/sin [B, S, R/2] -> the cache form."""
        x, c, s = node.inputs[:3]
        d = _static_last_dim(x)
        if x.shape is None or x.shape.rank != 4 or d is None:
            return "X is not rank 4 [B, H, S, D] with a static D"
        dim = int(node.attr("rotary_embedding_dim", 0) or 0)
        key = (c, s, None)
        if key not in tables:
            tables[key] = self._tables(graph, c, s, dim or d, None, x)
        found = tables[key]
        if isinstance(found, str):
            return found
        b = Builder(graph, provenance=node.provenance, insert=False)
        y = b.op(OP_TYPE, x, found.positions, found.cos, found.sin, domain=DOMAIN,
                 interleaved=int(node.attr("interleaved", 0) or 0),
                 rotary_embedding_dim=dim or None,
                 output_names=[node.outputs[0].name + "_rotary"])
        y.type = node.outputs[0].type
        graph.replace_nodes([node], b.nodes, [node.outputs[0]], [y])
        stats["onnx-23"] += 1
        stats["fused"] += 1
        return None

    def _fuse(self, graph: Graph, add: Node, m1: Node, m2: Node, x: Value, c: Value, s: Value,
              interleaved: int, tables: dict) -> Optional[str]:
        for m in (m1, m2):
            if len(m.outputs[0].uses()) != 1 or m.outputs[0].is_graph_output():
                return f"'{m.outputs[0].name}' is used outside the rotary computation"
        d = _static_last_dim(x)
        if x.shape is None or x.shape.rank != 4 or d is None:
            return "x is not rank 4 [B, H, S, D] with a static D"
        key = (c, s, interleaved)
        if key not in tables:
            tables[key] = self._tables(graph, c, s, d, interleaved, x)
        found = tables[key]
        if isinstance(found, str):
            return found
        b = Builder(graph, provenance=add.provenance, insert=False)
        y = b.op(OP_TYPE, x, found.positions, found.cos, found.sin, domain=DOMAIN,
                 interleaved=interleaved, output_names=[add.outputs[0].name + "_rotary"])
        y.type = add.outputs[0].type
        try:
            graph.replace_nodes([add, m1, m2], b.nodes, [add.outputs[0]], [y])
        except ValueError as e:  # a matched value used elsewhere
            return str(e)
        return None

    def _tables(self, graph: Graph, c: Value, s: Value, d: int, interleaved: Optional[int],
                x: Value):
        """The :class:`_Tables` of (c, s), or why they are no rotary tables. ``interleaved`` None:
        c and s are already the [B, S, d/2] rows of ONNX RotaryEmbedding-23 (rule 3)."""
        cone, positions = _cone(c, s)
        if isinstance(cone, str):
            return cone
        if x.dtype is None or c.dtype != x.dtype or s.dtype != x.dtype:
            return "cos/sin are not of x's element type"
        n = int(self.options.max_positions)
        try:
            full = _evaluate(self._model, cone, positions, (c, s), np.arange(n, dtype=np.int64)[None])
            rng = np.random.default_rng(0)
            probe = rng.integers(0, n, size=(2, 3)).astype(np.int64)
            part = _evaluate(self._model, cone, positions, (c, s), probe)
        except Exception as e:  # noqa: BLE001 - a computation ONNX Runtime cannot run alone
            return f"cos/sin cannot be evaluated on positions alone ({type(e).__name__}: {e})"
        caches = []
        for table, got in zip(full, part):
            if interleaved is None:  # rule 3: rows [B, S, d/2] as they are
                if table.shape != (1, n, d // 2) or got.shape != (2, 3, d // 2) or not np.allclose(
                        got, table[0][probe], rtol=0, atol=1e-6):
                    return "cos/sin rows are not [B, S, R/2] rows of position_ids[b, s] alone"
                caches.append(np.ascontiguousarray(table[0]))
                continue
            if table.shape != (1, 1, n, d):
                return (f"cos/sin on positions [1, {n}] have shape {list(table.shape)}, not "
                        f"[1, 1, {n}, {d}] (they must broadcast over the heads of x [B, H, S, D])")
            rows = table[0, 0]
            if got.shape != (2, 1, 3, d) or not np.allclose(got, rows[probe][:, None], rtol=0,
                                                          atol=1e-6):
                return "cos/sin rows do not depend on position_ids[b, s] alone"
            half = rows[:, 0::2] if interleaved else rows[:, :d // 2]
            other = rows[:, 1::2] if interleaved else rows[:, d // 2:]
            if not np.array_equal(half, other):
                return ("cos/sin " + ("pairs" if interleaved else "halves")
                        + " differ: not the tables of a rotary embedding")
            caches.append(np.ascontiguousarray(half))
        cos = graph.add_constant(caches[0].astype(x.dtype.numpy()), "rotary_cos_cache")
        sin = graph.add_constant(caches[1].astype(x.dtype.numpy()), "rotary_sin_cache")
        return _Tables(positions, cos, sin)


def _pairs(mul: Node):
    """(operand, other operand) both ways round."""
    p, q = mul.inputs[:2]
    return ((p, q), (q, p))


def _static_last_dim(v: Value) -> Optional[int]:
    shape = v.shape
    if shape is None or not shape.rank:
        return None
    d = shape[shape.rank - 1]
    return d if isinstance(d, int) else None


def _ints(v: Optional[Value]) -> Optional[List[int]]:
    arr = constant_array(v)
    return None if arr is None else [int(i) for i in np.asarray(arr).reshape(-1)]


def _slice(v: Value, x: Value, d: int) -> Optional[Tuple[int, int, int]]:
    """(start, end, step) of ``v = Slice(x, ...)`` on the last axis (end clipped to D), else None."""
    node = v.producer
    if node is None or node.op_type != "Slice" or node.inputs[0] is not x:
        return None
    starts, ends = _ints(node.inputs[1]), _ints(node.inputs[2])
    axes = _ints(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else [0]
    steps = _ints(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else [1]
    if None in (starts, ends, axes, steps) or len(starts) != 1 or axes[0] not in (-1, 3):
        return None
    start = starts[0] + d if starts[0] < 0 else starts[0]
    end = ends[0] + d if ends[0] < 0 else min(ends[0], d)
    return start, end, steps[0]


def _producer(v: Optional[Value], op_type: str) -> Optional[Node]:
    node = v.producer if v is not None else None
    return node if node is not None and node.op_type == op_type and node.domain == "" else None


def _last_axis_concat(node: Optional[Node], rank: int) -> bool:
    return node is not None and len(node.inputs) == 2 and node.attr("axis") in (-1, rank - 1)


def _part(v: Optional[Value], x: Value, d: int):
    """(negated, (start, end, step)) when ``v`` is ``Slice(x)`` or ``Neg(Slice(x))`` on the last
    axis, else None."""
    neg = _producer(v, "Neg")
    sl = _slice(neg.inputs[0] if neg is not None else v, x, d) if v is not None else None
    return None if sl is None else (neg is not None, sl)


def _rotation(rot: Value, x: Value):
    """1 (interleaved) or 0 (rotate-half) when ``rot`` is x rotated that way; else why not ("-":
    not a rotation at all)."""
    d = _static_last_dim(x)
    if d is None or d % 2:
        return "-"
    concat = _producer(rot, "Concat")
    if _last_axis_concat(concat, 4):  # rule 1: Concat(Neg(x[h:]), x[:h])
        parts = [_part(v, x, d) for v in concat.inputs]
        if parts == [None, None]:
            return "-"
        if None in parts or [p[0] for p in parts] != [True, False]:
            return "the rotated x is not Concat(Neg(x2), x1) (the Neg on the first part only)"
        if parts[0][1] != (d // 2, d, 1) or parts[1][1] != (0, d // 2, 1):
            return (f"the halves are x[{parts[0][1]}] and x[{parts[1][1]}] as (start, end, step), "
                    f"not x[{d // 2}:{d}] and x[0:{d // 2}]")
        return 0
    reshape = _producer(rot, "Reshape")
    concat = _producer(reshape.inputs[0], "Concat") if reshape is not None else None
    if not _last_axis_concat(concat, 5):  # rule 2: stack((-x[1::2], x[0::2]), -1) flattened
        return "-"
    pair = [_producer(v, "Unsqueeze") for v in concat.inputs]
    if None in pair or any(_ints(u.inputs[1]) not in ([-1], [4]) for u in pair if len(u.inputs) > 1):
        return "-"
    parts = [_part(u.inputs[0], x, d) for u in pair]
    if parts == [None, None]:
        return "-"
    if None in parts or [p[0] for p in parts] != [True, False]:
        return "the rotated x is not stack(-x[1::2], x[0::2]) (the Neg on the odd elements only)"
    (_, odd), (_, even) = parts
    if odd[0] != 1 or even[0] != 0 or odd[2] != 2 or even[2] != 2 or min(odd[1], even[1]) < d - 1:
        return f"the pairs are x[{odd}] and x[{even}], not x[1::2] and x[0::2]"
    out = rot.shape
    if out is None or out.rank != 4 or _static_last_dim(rot) != d or any(
            out[i] != x.shape[i] for i in range(3) if out[i] is not None and x.shape[i] is not None):
        return "the stacked pairs are not reshaped back to x's shape"
    return 1


def _cone(c: Value, s: Value):
    """(the nodes computing c and s in graph order, the one int64 [batch, sequence] graph input
    they depend on), or why not."""
    nodes: Dict[Node, None] = {}
    leaves: Dict[Value, None] = {}
    stack = [c, s]
    seen = set()
    while stack:
        v = stack.pop()
        if v is None or v in seen:
            continue
        seen.add(v)
        if constant_tensor(v) is not None and (v.producer is None or v.producer.op_type != "Constant"):
            continue
        node = v.producer
        if node is None:
            leaves[v] = None
            continue
        if node.subgraphs():
            return "cos/sin are computed with control flow", None
        nodes[node] = None
        if len(nodes) > _CONE_LIMIT:
            return f"cos/sin take more than {_CONE_LIMIT} nodes to compute", None
        stack.extend(node.inputs)
    names = ", ".join(v.name for v in leaves) or "no input"
    if len(leaves) != 1:
        return (f"cos/sin depend on {names}, not on one int64 [batch, sequence] position_ids "
                "input"), None
    (positions,) = leaves
    shape = positions.shape
    if positions.dtype is None or positions.dtype.name != "INT64" or shape is None or shape.rank != 2:
        return f"cos/sin depend on {names}, which is not int64 [batch, sequence]", None
    graph = c.producer.graph if c.producer is not None else None
    order = {n: i for i, n in enumerate(graph)} if graph is not None else {}
    return sorted(nodes, key=lambda n: order.get(n, 0)), positions


def _evaluate(model: Model, cone: List[Node], positions: Value, outputs, ids: np.ndarray):
    """Run the nodes of ``cone`` in ONNX Runtime with ``positions`` = ``ids``; the ``outputs``."""
    return run_subgraph(subgraph_model(model, cone, [positions], outputs), {positions.name: ids})


__all__ = ["FuseRotary"]
