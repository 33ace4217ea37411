"""lower-tvm: static input shapes and the rewrites TVM 0.27's Relax ONNX frontend needs."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np

from passctl.ir import UNNAMED_DIM_PARAMS, Graph, Model, Shape, TensorType, is_anonymous_dim
from passctl.ir.errors import UserError
from passctl.passes.base import Pass, PassResult
from passctl.passes.common.constants import constant_array
from passctl.passes.registry import get_pass, register_pass

logger = logging.getLogger(__name__)


MAX_ROUNDS = 4
"""Rounds of infer-shapes + fold-constants + dce after static dims (rule 2)."""


def parse_dims(text: str) -> Dict[str, int]:
    """``"batch=1,sequence=128"`` -> ``{"batch": 1, "sequence": 128}`` (also ``input_ids[1]=128``).

    Raises:
        UserError: an item is not ``NAME=SIZE`` with a positive integer size, a NAME is given
            twice, or NAME is one of
            :data:`~passctl.ir.UNNAMED_DIM_PARAMS` (``?``: an unnamed dim, which needs
            ``input[axis]``).
    """
    dims: Dict[str, int] = {}
    for item in filter(None, (s.strip() for s in text.replace(";", ",").split(","))):
        name, sep, size = (part.strip() for part in item.partition("="))
        if not sep or not name or not size.isdigit() or int(size) <= 0:
            raise UserError(f"lower-tvm: dims item '{item}' is not NAME=SIZE with a positive "
                            "integer size, e.g. dims=\"batch=1,sequence=128\"")
        if name in UNNAMED_DIM_PARAMS:
            raise UserError(f"lower-tvm: dims item '{item}': '{name}' marks unnamed dims, "
                            "not one dim; give each as INPUT[AXIS]=SIZE, e.g. dims=\"x[2]=48\"")
        if name in dims:
            raise UserError(f"lower-tvm: dims name '{name}' is given twice "
                            f"({dims[name]} and {int(size)}); give each dim once")
        dims[name] = int(size)
    return dims


_POSITIONAL = re.compile(r"^(?P<input>.+)\[(?P<axis>\d+)\]$")


def check_dims(model: Model, dims: Dict[str, int], owner: str = "lower-tvm") -> None:
    """Every key of ``dims`` names a symbolic input dim or an axis ``input[axis]`` of a graph input.

    An ``input[axis]`` key on a static axis is accepted when the sizes agree (nothing to do).
    ``owner`` starts the error messages (the pass or emitter option that gave ``dims``).

    Raises:
        UserError: a NAME matches no dim_param of the graph inputs, an ``input[axis]`` names no
            input or axis, or it names a static axis of another size; the message lists the
            model's symbolic dim names and the ``input[axis]`` keys of its unknown axes.
    """
    shapes = {v.name: v.shape for v in model.graph.inputs
              if isinstance(v.type, TensorType) and v.shape is not None}
    names: List[str] = []
    positional: List[str] = []
    for input_name, shape in shapes.items():
        for axis, d in enumerate(shape.dims):
            if isinstance(d, int) and d >= 0:
                continue
            positional.append(f"{input_name}[{axis}]")
            if isinstance(d, str) and not is_anonymous_dim(d) and d not in names:
                names.append(d)
    for key, size in dims.items():
        match = _POSITIONAL.match(key)
        if match and match["input"] in shapes and int(match["axis"]) < len(shapes[match["input"]]):
            d = shapes[match["input"]].dims[int(match["axis"])]
            if isinstance(d, int) and d >= 0 and d != size:
                raise UserError(f"{owner}: dims item '{key}={size}': axis {match['axis']} of "
                                f"input '{match['input']}' is static with size {d}; drop the item "
                                f"or give {key}={d}")
            continue
        if key in names:
            continue
        if match and match["input"] in shapes:
            rank = len(shapes[match["input"]])
            raise UserError(f"{owner}: dims item '{key}={size}': input '{match['input']}' has rank "
                            f"{rank}, so its axes are 0..{rank - 1}")
        raise UserError(f"{owner}: dims name '{key}' matches no dim of the model's inputs "
                        f"(symbolic dim names: {', '.join(names) or 'none'}; unknown axes, as "
                        f"INPUT[AXIS]: {', '.join(positional) or 'none'})")


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


__all__ = ["LowerTvm", "check_dims", "parse_dims"]
