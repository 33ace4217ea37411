"""Input sizes (dims): the CLI's ``--dim NAME=SIZE`` flags, option text such as
``dims="batch=1,x[2]=48"``, and checking that each key names an unknown graph-input dim.

A key is a symbolic ``dim_param`` name (``batch``) or ``INPUT[AXIS]`` (``x[2]``, for unnamed dims).
"""

from __future__ import annotations

import re
from typing import Dict, List

from passctl.ir import UNNAMED_DIM_PARAMS, Model, TensorType, is_anonymous_dim
from passctl.ir.errors import UserError

__all__ = ["check_dims", "format_dims", "parse_dim_args", "parse_dims"]


def parse_dim_args(items: List[str]) -> Dict[str, int]:
    """``["batch=2", "x[2]=48"]`` -> ``{"batch": 2, "x[2]": 48}``.

    Raises:
        UserError: an item is not ``NAME=SIZE`` with a positive integer size.
    """
    dims: Dict[str, int] = {}
    for item in items:
        name, sep, size = item.partition("=")
        if not sep or not name or not size.isdigit() or int(size) <= 0:
            raise UserError(f"--dim '{item}': expected NAME=SIZE with a positive integer size, "
                            "e.g. --dim batch=1")
        dims[name.strip()] = int(size)
    return dims


def parse_dims(text: str, owner: str = "lower-tvm") -> Dict[str, int]:
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
            raise UserError(f"{owner}: dims item '{item}' is not NAME=SIZE with a positive "
                            "integer size, e.g. dims=\"batch=1,sequence=128\"")
        if name in UNNAMED_DIM_PARAMS:
            raise UserError(f"{owner}: dims item '{item}': '{name}' marks unnamed dims, "
                            "not one dim; give each as INPUT[AXIS]=SIZE, e.g. dims=\"x[2]=48\"")
        if name in dims:
            raise UserError(f"{owner}: dims name '{name}' is given twice "
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


def format_dims(dims: Dict[str, int]) -> str:
    """``{"batch": 1, "x[2]": 48}`` -> ``"batch=1,x[2]=48"`` (the text :func:`parse_dims` reads)."""
    return ",".join(f"{k}={v}" for k, v in dims.items())
