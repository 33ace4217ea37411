"""TensorRT optimization profiles: min / opt / max sizes for the dynamic dims of the graph inputs."""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

from passctl.ir import Model, TensorType, is_anonymous_dim
from passctl.ir.errors import UserError

Range = Tuple[int, int, int]
#: ``{input name: {"min": [...], "opt": [...], "max": [...]}}``, one full shape per input.
Profile = Dict[str, Dict[str, List[int]]]

_OWNER = "tensorrt{shapes=...}"


def parse_shape_ranges(text: str) -> Dict[str, Range]:
    """``"batch=1:8:32,sequence=128"`` -> ``{"batch": (1, 8, 32), "sequence": (128, 128, 128)}``.

    Keys are ``dim_param`` names or ``INPUT[AXIS]`` (for unnamed dims), as in ``lower-tvm{dims}``;
    a value is ``SIZE`` (min = opt = max) or ``MIN:OPT:MAX`` (trtexec's ``--minShapes`` /
    ``--optShapes`` / ``--maxShapes``: the engine accepts every size in [MIN, MAX] and is tuned for
    OPT).

    Raises:
        UserError: an item is not ``KEY=SIZE`` / ``KEY=MIN:OPT:MAX`` with positive integers and
            MIN <= OPT <= MAX, or a key is given twice.
    """
    ranges: Dict[str, Range] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = (part.strip() for part in item.partition("="))
        parts = value.split(":")
        if not sep or not key or len(parts) not in (1, 3) or not all(p.isdigit() for p in parts):
            raise UserError(f"{_OWNER}: item '{item}' is not NAME=SIZE or NAME=MIN:OPT:MAX, e.g. "
                            "shapes=\"batch=1:8:32,sequence=128\"")
        sizes = [int(p) for p in parts] * (3 if len(parts) == 1 else 1)
        low, opt, high = sizes
        if not 0 < low <= opt <= high:
            raise UserError(f"{_OWNER}: item '{item}' needs 0 < MIN <= OPT <= MAX")
        if key in ranges:
            raise UserError(f"{_OWNER}: '{key}' is given twice; give each dim once")
        ranges[key] = (low, opt, high)
    return ranges


def optimization_profile(model: Model, ranges: Dict[str, Range]) -> Optional[Profile]:
    """The optimization profile of ``model``'s graph inputs, or None when every input is static.

    A dynamic dim takes its range from ``ranges`` by ``INPUT[AXIS]`` first, then by its
    ``dim_param`` name. TensorRT needs a range for every dynamic input dim
    (``IOptimizationProfile::setDimensions``), so a dim without one is an error.

    Raises:
        UserError: a key of ``ranges`` matches no dynamic dim, a range is given for a static axis,
            or a dynamic dim has no range (the message lists the missing ones and the option that
            gives them).
    """
    from passctl.support.dims import check_dims

    check_dims(model, {k: r[1] for k, r in ranges.items()}, owner=_OWNER)
    profile: Profile = {}
    missing: List[str] = []
    dynamic = False
    for value in model.graph.inputs:
        if not isinstance(value.type, TensorType) or value.shape is None:
            missing.append(f"{value.name} (unknown rank)")
            continue
        rows: Dict[str, List[int]] = {"min": [], "opt": [], "max": []}
        for axis, dim in enumerate(value.shape.dims):
            if isinstance(dim, int) and dim >= 0:
                sizes: Range = (dim, dim, dim)
                given = ranges.get(f"{value.name}[{axis}]")
                if given is not None and given != sizes:
                    raise UserError(f"{_OWNER}: axis {axis} of input '{value.name}' is static with "
                                    f"size {dim}, so the range {':'.join(map(str, given))} cannot "
                                    f"apply; drop {value.name}[{axis}] from shapes")
            else:
                dynamic = True
                key = f"{value.name}[{axis}]"
                found = ranges.get(key) or (None if is_anonymous_dim(dim) else ranges.get(dim))
                if found is None:
                    missing.append(key if is_anonymous_dim(dim) else str(dim))
                    continue
                sizes = found
            for row, size in zip(("min", "opt", "max"), sizes):
                rows[row].append(size)
        profile[value.name] = rows
    if missing:
        names = list(dict.fromkeys(missing))
        raise UserError(f"TensorRT needs a size range for every dynamic input dim; missing: "
                        f"{', '.join(names)}; give them as --emit 'tensorrt{{shapes=\""
                        f"{'=MIN:OPT:MAX,'.join(names)}=MIN:OPT:MAX\"}}' with the smallest, "
                        "typical and largest sizes the engine must run (e.g. 1:8:32)")
    return profile if dynamic else None


def trtexec_shapes(profile: Profile, row: str) -> str:
    """trtexec's ``--minShapes`` / ``--optShapes`` / ``--maxShapes`` value for ``row``
    (``"input_ids:1x128,attention_mask:1x128"``; names quoted when they hold ``:`` or ``,``)."""
    def name(n: str) -> str:
        return f"'{n}'" if re.search(r"[:,\s]", n) else n

    return ",".join(f"{name(n)}:{'x'.join(str(d) for d in rows[row])}" for n, rows in profile.items())


__all__ = ["optimization_profile", "parse_shape_ranges", "trtexec_shapes"]
