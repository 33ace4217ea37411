"""Rules for what stays float32 under mixed precision: value-range and precision hazards of fp16/bf16."""

from __future__ import annotations

import logging
from typing import Dict, Iterable, List, Optional

import ml_dtypes
import numpy as np

from passctl.ir import DataType, Graph, Node, Value, implicit_inputs
from passctl.passes.common.constants import constant_array
from passctl.passes.precision.ops import ADDING_REDUCTIONS, convertible, schema_refusal, typed_inputs

logger = logging.getLogger(__name__)

LOW_DTYPES = {"fp16": DataType.FLOAT16, "bf16": DataType.BFLOAT16}
"""Pipeline spelling -> IR element type of the low precisions ``amp`` can assign."""

# Rule names as they appear in the report (``why`` of an fp32 node).
LAYERNORM = "layernorm-statistics"
SOFTMAX = "softmax-input"
EXP = "exp"
LONG_REDUCTION = "long-reduction"
MASK_CONSTANT = "mask-constant"
SUBGRAPH_READ = "read-by-subgraph"
NO_LOW_FORM = "no-low-precision-form"

# How the statistics chain of a decomposed norm continues after each op (see layernorm_chains).
_NEXT_IN_CHAIN = {"ReduceMean": ("Add", "Sqrt"), "Add": ("Sqrt",), "Sqrt": ("Reciprocal", "Div")}
_MASKING_OPS = frozenset({"Add", "Sub", "Where", "Mul", "Div"})


def finite_max(low: DataType) -> float:
    """Largest finite value of ``low`` (65504 for fp16, about 3.39e38 for bf16; IEEE 754 / bfloat16)."""
    return float(ml_dtypes.finfo(low.numpy()).max)


def becomes_inf(absmax: float, low: DataType) -> bool:
    """Whether a finite float32 magnitude ``absmax`` rounds to infinity in ``low``.

    fp16 rounds values from 65520 up to inf (round to nearest even past 65504); float32's largest
    value -3.4028235e38 (``torch.finfo(float32).min``, the usual mask constant) rounds to -inf in bf16.
    """
    if not np.isfinite(absmax):
        return False
    if absmax > float(np.finfo(np.float32).max):
        return True
    with np.errstate(over="ignore"):
        return bool(np.isinf(np.array([absmax], np.float32).astype(low.numpy()))[0])


def constant_overflows(value: Optional[Value], low: DataType) -> Optional[float]:
    """The largest finite magnitude of constant ``value`` when it becomes inf in ``low``, else None."""
    arr = constant_array(value)
    if arr is None or arr.dtype != np.float32 or arr.size == 0:
        return None
    finite = np.abs(arr[np.isfinite(arr)]) if not np.isfinite(arr).all() else np.abs(arr)
    if finite.size == 0:
        return None
    absmax = float(finite.max())
    return absmax if becomes_inf(absmax, low) else None


def _exponent_is_two(node: Node) -> bool:
    if node.op_type == "Mul":
        return len(node.inputs) == 2 and node.inputs[0] is node.inputs[1]
    if node.op_type != "Pow" or len(node.inputs) < 2:
        return False
    arr = constant_array(node.inputs[1])
    return arr is not None and arr.size == 1 and float(arr.reshape(-1)[0]) == 2.0


def _consumers(value: Value, ops: Iterable[str]) -> List[Node]:
    ops = set(ops)
    return [n for n in value.consumers() if n.op_type in ops]


def layernorm_chains(graph: Graph) -> List[Node]:
    """Nodes computing the statistics of a decomposed LayerNorm or RMSNorm.

    The chain (as exporters write ``torch.nn.LayerNorm`` / LLaMA's RMSNorm): ``mean = ReduceMean(x)``,
    ``d = Sub(x, mean)`` (LayerNorm only), ``Pow(d, 2)`` (or ``Mul(d, d)``), ``var = ReduceMean(.)``,
    ``Add(var, epsilon)``, ``Sqrt``, then ``Reciprocal`` (and the ``Mul`` by it) or the ``Div`` by the
    root, then the affine ``Mul(gamma)`` / ``Add(beta)`` with constant operands. In fp16, ``d**2``
    overflows once ``|d| > 256`` (65504 ** 0.5), so the chain stays float32; the normalizing and
    affine nodes join it so no Cast splits the norm: ONNX Runtime's LayerNormFusion otherwise fuses
    across a Cast into a LayerNormalization with mixed input types, which then fails to load.
    """
    found: Dict[Node, None] = {}
    for node in graph:
        if not _exponent_is_two(node):
            continue
        means = _consumers(node.outputs[0], ["ReduceMean"])
        if not means:
            continue
        found[node] = None
        source = node.inputs[0].producer if node.inputs[0] is not None else None
        if source is not None and source.op_type == "Sub":
            mean = source.inputs[1].producer if source.inputs[1] is not None else None
            if mean is not None and mean.op_type == "ReduceMean" and mean.inputs[0] is source.inputs[0]:
                found[source] = None
                found[mean] = None
        frontier = list(means)
        while frontier:
            n = frontier.pop()
            found[n] = None
            for nxt in n.outputs[0].consumers():
                if nxt.op_type in _NEXT_IN_CHAIN.get(n.op_type, ()):
                    if nxt.op_type == "Div" and nxt.inputs[1] is not n.outputs[0]:
                        continue  # the root must be the divisor
                    frontier.append(nxt)
    for n in list(found):
        if n.op_type == "Div":
            _affine_tail(n, found)
        elif n.op_type == "Reciprocal":
            for mul in _consumers(n.outputs[0], ["Mul"]):
                found[mul] = None
                _affine_tail(mul, found)
    return list(found)


def _affine_tail(node: Node, found: Dict[Node, None]) -> None:
    """Add the ``Mul(., gamma)`` then ``Add(., beta)`` (constant operands, each optional) after the
    normalizing node, so the whole norm is one float32 region without a Cast inside it."""
    for op_type in ("Mul", "Add"):
        nxt = [c for c in _consumers(node.outputs[0], [op_type])
               if any(constant_array(v) is not None for v in c.inputs if v is not node.outputs[0])]
        if len(node.outputs[0].consumers()) != 1 or len(nxt) != 1:
            return
        node = nxt[0]
        found[node] = None


def _reduced_count(node: Node) -> Optional[int]:
    """Elements added per output element of a reduction, None when a reduced dimension is unknown."""
    x = node.inputs[0]
    shape = x.shape if x is not None else None
    if shape is None:
        return None
    axes = node.attr("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
        arr = constant_array(node.inputs[1])
        if arr is None:
            return None
        axes = [int(a) for a in arr.reshape(-1)]
    if axes is None or len(axes) == 0:
        if node.attr("noop_with_empty_axes", 0):
            return 1
        axes = list(range(shape.rank))
    count = 1
    for a in axes:
        dim = shape[a % shape.rank] if shape.rank else 1
        if not isinstance(dim, int):
            return None
        count *= dim
    return count


def rule_fp32_nodes(graph: Graph, low: DataType, long_reduction: int = 4096,
                    opset: Optional[int] = None) -> Dict[Node, str]:
    """Nodes of ``graph`` that stay float32 by rule, with the reason (a rule name and detail).

    Rules (each a known fp16/bf16 hazard):
      1. ``layernorm-statistics``: :func:`layernorm_chains` (squares overflow fp16 past |x| 256).
      2. ``softmax-input``: Softmax / LogSoftmax and the Add/Sub/Where/Mul/Div producing their input
         (where the attention mask and scale are applied; exp(x - max) needs float32 inputs to keep
         small logit differences and masked positions exact).
      3. ``exp``: Exp overflows fp16 past x = 11.09.
      4. ``long-reduction``: ReduceSum/ReduceMean/... adding ``long_reduction`` or more elements, or an
         unknown count (fp16 has 11 significant bits: a running sum loses its small terms).
      5. ``mask-constant``: a node reading a constant that becomes inf in ``low`` (float32 min, the usual
         additive attention-mask value, is -inf in both fp16 and bf16; -inf + -inf rows then give NaN
         in Softmax). Kept float32 rather than rewritten to ``low``'s finite min, because
         ``finite_min + x`` still overflows to -inf in fp16 for any x < -16 and the mask ops are cheap.
      6. ``no-low-precision-form``: an op with float32 values but no low-precision form here (Cast,
         ConstantOfShape, Range, custom domains, ops with subgraphs, ops already in another type), or
         whose ONNX schema at ``opset`` does not admit ``low`` for the values amp retypes
         (``ops.schema_refusal``: "Conv-11 has no bfloat16 (from opset 22)").
      7. ``read-by-subgraph``: the producer of a float32 value that an If/Loop/Scan body reads from the
         outer scope (the body's types are not rewritten, so the value must stay float32).

    Args:
        graph: The main graph, with element types known (run infer-shapes first).
        low: DataType.FLOAT16 or DataType.BFLOAT16.
        long_reduction: Smallest reduced element count that counts as long.
        opset: The model's default-domain opset (``Model.opset``); None skips the schema check.

    Returns:
        ``{node: reason}`` for every float32 node that must stay float32.
    """
    reasons: Dict[Node, str] = {}

    def keep(node: Node, why: str) -> None:
        reasons.setdefault(node, why)

    for node in graph:
        if not any(v is not None and v.dtype == DataType.FLOAT for v in (*node.inputs, *node.outputs)):
            continue
        if not convertible(node):
            unknown = any(v is not None and v.dtype is None for v in (*node.inputs, *node.outputs))
            keep(node, f"{NO_LOW_FORM} ({node.op_type}" + (": element types unknown, run "
                                                           "infer-shapes first)" if unknown else ")"))
            continue
        refusal = schema_refusal(node, opset, low) if opset else None
        if refusal is not None:
            keep(node, f"{NO_LOW_FORM}: {refusal}")
            continue
        for i in typed_inputs(node) or ():
            absmax = constant_overflows(node.inputs[i] if i < len(node.inputs) else None, low)
            if absmax is not None:
                keep(node, f"{MASK_CONSTANT} (|c| = {absmax:.3g} is inf in {low.short_name})")
    for node in graph:
        for v in implicit_inputs(node) if node.subgraphs() else ():
            if v.producer is not None and v.producer.graph is graph and v.dtype == DataType.FLOAT:
                keep(v.producer, SUBGRAPH_READ)
    for node in layernorm_chains(graph):
        keep(node, LAYERNORM)
    for node in graph:
        if node.op_type in ("Softmax", "LogSoftmax"):
            keep(node, SOFTMAX)
            src = node.inputs[0].producer if node.inputs[0] is not None else None
            if src is not None and src.op_type in _MASKING_OPS and src.graph is graph:
                keep(src, SOFTMAX)
        elif node.op_type == "Exp":
            keep(node, EXP)
        elif node.op_type in ADDING_REDUCTIONS:
            count = _reduced_count(node)
            if count is None:
                keep(node, f"{LONG_REDUCTION} (unknown element count)")
            elif count >= long_reduction:
                keep(node, f"{LONG_REDUCTION} ({count} elements)")
    return reasons
