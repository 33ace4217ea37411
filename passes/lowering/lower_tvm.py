"""lower-tvm: static input shapes and the rewrites TVM 0.27's Relax ONNX frontend needs."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict

import numpy as np

from passctl.ir import Graph, Model, Shape, TensorType, is_anonymous_dim
from passctl.passes.base import Pass, PassResult
from passctl.passes.common.constants import constant_array
from passctl.passes.registry import get_pass, register_pass
from passctl.support.dims import check_dims, parse_dims

logger = logging.getLogger(__name__)


MAX_ROUNDS = 4
"""Rounds of infer-shapes + fold-constants + dce after static dims (rule 2)."""


@register_pass
class LowerTvm(Pass):
    """Prepare the IR for TVM's Relax ONNX frontend (run it last, after lower-standard).

    Rules (stat key in brackets):
      1. Symbolic input dims named in ``dims`` (by ``dim_param`` or ``input[axis]``; unnamed
         dims, ``?``, only by ``input[axis]``) become static [dims_fixed]: TVM artifacts are
         built for static shapes, and with static shapes every Shape -> Gather/Concat ->
         Expand/Reshape chain folds to constants, which avoids the
         frontend's Expand converter comparing symbolic dims with Python ``==`` ("Cannot use and /
         or / not operator to Expr").
      2. When rule 1 changed anything: infer-shapes, fold-constants and dce run again, up to
         :data:`MAX_ROUNDS` times while folding changes the IR (statistics summed in
         [infer-shapes:*, fold-constants:*, dce:*]).
      3. ``ConstantOfShape`` whose shape input is a constant empty 1-D tensor (a scalar result)
         becomes a scalar initializer [scalar_constant_of_shape]. Cause of BERT's import failure
         in TVM 0.27 ("broadcast_to expects the input shape to have the number of ndim at least as
         the input tensor's"): its converter broadcasts the 1-element ``value`` tensor to the
         shape ``()``, which Relax refuses (ConstantOfShape-9 spec: the result has the input's
         shape, here rank 0).
    """

    name = "lower-tvm"
    summary = "Static input shapes and TVM frontend legalizations (scalar ConstantOfShape)"

    @dataclass
    class Options:
        """Options of lower-tvm.

        Attributes:
            dims: sizes of symbolic input dims: ``NAME=SIZE`` for a ``dim_param`` name
                (``"batch=1,sequence=128"``) or ``INPUT[AXIS]=SIZE`` for one axis of a graph
                input (``"x[0]=1,x[2]=48"``), needed for unnamed dims (``?``). A NAME that matches
                no input dim, or an axis that is static with another size, is an error.
        """

        dims: str = field(default="", metadata={
            "help": "symbolic input dims: NAME=SIZE or INPUT[AXIS]=SIZE (unnamed dims), "
                    "e.g. batch=1,sequence=128 or x[0]=1,x[2]=48"})

    def run(self, model: Model) -> PassResult:
        stats: Dict[str, int] = {"dims_fixed": 0, "scalar_constant_of_shape": 0}
        dims = parse_dims(self.options.dims)
        check_dims(model, dims)
        for v in model.graph.inputs:
            if not isinstance(v.type, TensorType) or v.shape is None:
                continue
            new = []
            for axis, d in enumerate(v.shape.dims):
                key = f"{v.name}[{axis}]"
                named = isinstance(d, str) and not is_anonymous_dim(d) and d in dims
                if not (isinstance(d, int) and d >= 0) and (key in dims or named):
                    new.append(dims.get(key, dims.get(d)))
                    stats["dims_fixed"] += 1
                else:
                    new.append(d)
            if new != list(v.shape.dims):
                v.type = TensorType(v.type.dtype, Shape(tuple(new)), v.type.denotation)
        if stats["dims_fixed"]:
            # NOTE: repeated: a folded Shape gives shape inference a constant, which lets the next
            # round fold the Shape of a value further down (Range -> Reshape chains).
            for _ in range(MAX_ROUNDS):
                changed = False
                for name in ("infer-shapes", "fold-constants", "dce"):
                    result = get_pass(name)()(model)
                    changed |= name == "fold-constants" and result.modified
                    for k, n in result.stats.items():
                        if isinstance(n, int):
                            stats[f"{name}:{k}"] = stats.get(f"{name}:{k}", 0) + n
                if not changed:
                    break
        stats["scalar_constant_of_shape"] = _scalar_constant_of_shape(model.graph)
        modified = stats["dims_fixed"] > 0 or stats["scalar_constant_of_shape"] > 0
        return PassResult(modified, stats)


def _scalar_constant_of_shape(graph: Graph) -> int:
    """Rule 3; returns the count of nodes replaced."""
    count = 0
    for node in list(graph):
        if node.domain not in ("", "ai.onnx") or node.op_type != "ConstantOfShape":
            continue
        shape = constant_array(node.inputs[0]) if node.inputs and node.inputs[0] is not None else None
        if shape is None or np.asarray(shape).size != 0 or node.outputs[0].is_graph_output():
            continue
        value = node.attr("value")
        array = np.asarray(value.numpy() if hasattr(value, "numpy") else value) if value is not None \
            else np.zeros(1, dtype=np.float32)
        scalar = graph.add_constant(array.reshape(()).copy(), f"{node.outputs[0].name}_scalar")
        node.outputs[0].replace_all_uses_with(scalar)
        graph.remove(node)
        count += 1
    return count


__all__ = ["LowerTvm"]
