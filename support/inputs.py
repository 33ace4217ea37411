"""Seeded random inputs for a model's declared graph inputs (used by every numeric check)."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from passctl.ir import UNNAMED_DIM_PARAMS
from passctl.ir.errors import UserError

logger = logging.getLogger(__name__)

DEFAULT_BATCH = 1
DEFAULT_SEQUENCE = 16
DEFAULT_SPATIAL = 32
DEFAULT_OTHER = 16
ID_HIGH = 1000
OTHER_INT_HIGH = 10

_BATCH_NAME = re.compile(r"batch|^n$|^b$|^bs$|^num_seq", re.IGNORECASE)
_SEQUENCE_NAME = re.compile(r"seq|len|time|token|step|frames", re.IGNORECASE)


def _load_header(model: Union[onnx.ModelProto, str]) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        return onnx.load(str(model), load_external_data=False)
    except (OSError, DecodeError) as error:
        raise UserError(f"{model}: cannot read the ONNX model ({error}); pass a valid .onnx path") from error


def load_header(path: str) -> onnx.ModelProto:
    """The ONNX model at ``path`` as far as input planning needs it, read once by a caller that
    plans several times (``compile``: ``--dim`` names, ``--inputs``, ``--check-each``, ``--check``).

    External data is not read, and every initializer's data is dropped (its name is kept, so
    :func:`graph_inputs` still tells initializers from inputs), so holding it costs little memory.

    Raises:
        UserError: the file cannot be read or is not ONNX.
    """
    return drop_initializer_data(_load_header(path))


def drop_initializer_data(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Clear the data of every initializer of ``proto``'s main graph in place, keeping its name
    (what :func:`graph_inputs` needs), so a header kept for input planning holds no weights.

    Returns:
        ``proto`` itself.
    """
    for tensor in proto.graph.initializer:
        name = tensor.name
        tensor.Clear()
        tensor.name = name
    return proto


def graph_inputs(model: onnx.ModelProto) -> list:
    """The graph inputs that are not initializers (IR version < 4 lists initializers as inputs too).

    Args:
        model: The ONNX model.

    Returns:
        The ``onnx.ValueInfoProto`` of every real input, in graph order.
    """
    initializers = {init.name for init in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in initializers]


def _elem_dtype(value: onnx.ValueInfoProto) -> np.dtype:
    if not value.type.HasField("tensor_type"):
        raise UserError(f"graph input '{value.name}' is not a tensor ({value.type.WhichOneof('value')}); "
                        "give it in overrides")
    elem_type = value.type.tensor_type.elem_type
    if elem_type == onnx.TensorProto.STRING:
        raise UserError(f"graph input '{value.name}' is a string tensor; give it in overrides")
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def _default_dim(dim_name: str, axis: int, rank: int) -> int:
    """The default of one unknown dimension (rules 4-7 of :func:`make_inputs`)."""
    if dim_name and _BATCH_NAME.search(dim_name):
        return DEFAULT_BATCH
    if dim_name and _SEQUENCE_NAME.search(dim_name):
        return DEFAULT_SEQUENCE
    if axis == 0 and rank > 1:
        return DEFAULT_BATCH
    if rank == 4 and axis in (2, 3):
        return DEFAULT_SPATIAL
    if rank in (1, 2):
        return DEFAULT_SEQUENCE
    return DEFAULT_OTHER


def _resolve_shape(value: onnx.ValueInfoProto, dim_values: Mapping[str, int],
                   bound: Dict[str, int], used: Dict[str, Tuple[int, str]]) -> tuple:
    """The shape of one input without an override (rules 1-7 of :func:`make_inputs`); records each
    unknown dimension's size and source (``given`` or ``default``) in ``used``."""
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        raise UserError(f"graph input '{value.name}' has no declared shape (unknown rank); "
                        "give it in overrides")
    dims = tensor_type.shape.dim
    shape = []
    for axis, dim in enumerate(dims):
        if dim.HasField("dim_value") and dim.dim_value > 0:
            shape.append(dim.dim_value)
            continue
        dim_name = dim.dim_param if dim.HasField("dim_param") else ""
        if dim_name in UNNAMED_DIM_PARAMS:
            dim_name = ""
        positional = f"{value.name}[{axis}]"
        key, source = dim_name or positional, "given"
        if positional in dim_values:
            size, key = int(dim_values[positional]), positional
        elif dim_name and dim_name in dim_values:
            size = int(dim_values[dim_name])
        elif dim_name and dim_name in bound:
            size = bound[dim_name]
        else:
            size, source = _default_dim(dim_name, axis, len(dims)), "default"
        if dim_name:
            bound.setdefault(dim_name, size)
        used.setdefault(key, (size, source))
        shape.append(size)
    return tuple(shape)


def _bind_override(value: onnx.ValueInfoProto, array: np.ndarray, bound: Dict[str, int],
                   used: Dict[str, Tuple[int, str]]) -> None:
    if not value.type.HasField("tensor_type") or not value.type.tensor_type.HasField("shape"):
        return
    dims = value.type.tensor_type.shape.dim
    if len(dims) != array.ndim:
        return
    for axis, (dim, size) in enumerate(zip(dims, array.shape)):
        if dim.HasField("dim_value") and dim.dim_value > 0:
            continue
        named = dim.HasField("dim_param") and dim.dim_param not in UNNAMED_DIM_PARAMS
        if named:
            bound.setdefault(dim.dim_param, int(size))
        used.setdefault(dim.dim_param if named else f"{value.name}[{axis}]", (int(size), "inputs"))


def _declared(value: onnx.ValueInfoProto) -> str:
    tensor_type = value.type.tensor_type
    dtype = str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)))
    if not tensor_type.HasField("shape"):
        return f"{dtype} of any shape"
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0
            else (d.dim_param or "?") for d in tensor_type.shape.dim]
    return f"{dtype} [{', '.join(str(d) for d in dims)}]"


def check_override(value: onnx.ValueInfoProto, array: np.ndarray) -> None:
    """Check a given input array against its graph input's declared element type and shape.

    Dimensions declared with a positive ``dim_value`` must match; symbolic ones take any size.

    Raises:
        UserError: the dtype, the rank or a fixed dimension differs; names the array and input.
    """
    if not value.type.HasField("tensor_type") or not value.type.tensor_type.elem_type:
        return
    tensor_type = value.type.tensor_type
    if tensor_type.elem_type == onnx.TensorProto.STRING:
        return
    want = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
    problem = None
    if array.dtype != want:
        problem = f"its dtype is {array.dtype}; convert it with .astype(numpy.{want})"
    elif tensor_type.HasField("shape"):
        dims = tensor_type.shape.dim
        if len(dims) != array.ndim:
            problem = f"it has rank {array.ndim}, the input rank {len(dims)}"
        else:
            for axis, (dim, size) in enumerate(zip(dims, array.shape)):
                if dim.HasField("dim_value") and dim.dim_value > 0 and dim.dim_value != size:
                    problem = f"axis {axis} is {size}, the input declares {dim.dim_value}"
                    break
    if problem:
        raise UserError(f"input array '{value.name}' ({array.dtype} {list(array.shape)}) does not "
                        f"fit graph input '{value.name}' ({_declared(value)}): {problem}")


def check_dim_names(model: Union[onnx.ModelProto, str], dim_values: Mapping[str, int],
                    option: str = "--dim") -> None:
    """Every key of ``dim_values`` must name a symbolic dimension or ``<input>[<axis>]``.

    Raises:
        UserError: a key matches no dimension; lists the dimension names and inputs.
    """
    proto = _load_header(model)
    params, positional = [], []
    for value in graph_inputs(proto):
        if not value.type.HasField("tensor_type") or not value.type.tensor_type.HasField("shape"):
            continue
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                continue
            positional.append(f"{value.name}[{axis}]")
            if dim.dim_param and dim.dim_param not in UNNAMED_DIM_PARAMS and dim.dim_param not in params:
                params.append(dim.dim_param)
    for key in dim_values:
        if key not in params and key not in positional:
            known = ", ".join(params + positional) or "none: every input dimension is fixed"
            raise UserError(f"{option} '{key}' matches no symbolic input dimension of the model "
                            f"(dimension names and INPUT[AXIS] it accepts: {known})")


def _random_array(name: str, dtype: np.dtype, shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """One input array (rules A-F of :func:`make_inputs`)."""
    lowered = name.lower()
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        if "mask" in lowered:
            return np.ones(shape, dtype=dtype)
        if "token_type" in lowered or "segment" in lowered:
            return np.zeros(shape, dtype=dtype)
        if "position" in lowered and len(shape) >= 1:
            return np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
        high = ID_HIGH if "ids" in lowered else OTHER_INT_HIGH
        if np.iinfo(dtype).max < high:
            high = int(np.iinfo(dtype).max) + 1
        return rng.integers(0, high, size=shape).astype(dtype)
    if np.issubdtype(dtype, np.complexfloating):
        real = rng.uniform(-1.0, 1.0, size=shape)
        imag = rng.uniform(-1.0, 1.0, size=shape)
        return (real + 1j * imag).astype(dtype)
    # Floating point, including ml_dtypes' bfloat16 and float8 types.
    return rng.uniform(-1.0, 1.0, size=shape).astype(np.float32).astype(dtype)


def make_inputs(model: Union[onnx.ModelProto, str], seed: int = 0,
                dim_values: Optional[Mapping[str, int]] = None,
                overrides: Optional[Mapping[str, np.ndarray]] = None) -> Dict[str, np.ndarray]:
    """Seeded random arrays for every declared graph input of ``model`` (initializers excluded).

    Shapes. A dimension with a positive ``dim_value`` is used as declared. Any other dimension (a
    symbolic ``dim_param``, an empty name, or a value <= 0) is resolved by the first rule that applies:

    1. ``dim_values["<input>[<axis>]"]``, e.g. ``{"x[2]": 48}`` (for unnamed dimensions);
    2. ``dim_values["<dim_param>"]``, e.g. ``{"batch": 2, "sequence": 128}`` (the placeholder names
       ``?``, ``-1``, ``None``, ``unk`` count as unnamed and never bind);
    3. the size already bound to the same ``dim_param`` by an earlier input or an override, so inputs
       that share a symbolic dimension agree;
    4. a name like ``batch``, ``N``, ``bs`` -> 1; a name with ``seq``, ``len``, ``time``, ``token`` -> 16;
    5. axis 0 of an input of rank >= 2 -> 1 (batch);
    6. axes 2 and 3 of a rank-4 input (NCHW spatial dims) -> 32;
    7. anything else -> 16.

    Values, with ``rng = numpy.random.default_rng(seed)`` drawn in graph-input order:

    A. ``overrides[name]`` wins (converted with ``numpy.asarray``); its shape also binds the input's
       symbolic dimensions for the other inputs (rule 3).
    B. bool -> uniform random ``True`` / ``False``.
    C. integer inputs whose name contains ``mask`` -> ones; ``token_type`` or ``segment`` -> zeros;
       ``position`` -> ``arange`` along the last axis.
    D. other integer inputs whose name contains ``ids`` -> uniform in ``[0, 1000)``.
    E. all other integer inputs -> uniform in ``[0, 10)``.
    F. floating point (float16/32/64, bfloat16, float8) -> uniform in ``[-1, 1)``, drawn in float32
       and cast; complex -> real and imaginary parts uniform in ``[-1, 1)``.

    Args:
        model: An ``onnx.ModelProto`` or the path of an ``.onnx`` file (external data is not read).
        seed: Seed of ``numpy.random.default_rng``; the same seed gives the same arrays.
        dim_values: Sizes of unknown dimensions, by ``dim_param`` name or ``"<input>[<axis>]"``.
        overrides: Arrays to use as given, by input name.

    Returns:
        ``{input name: array}`` for every graph input, in graph order; dtypes follow the declared
        element types (e.g. ``float32``, ``int64``, ``bool``).

    Raises:
        UserError: ``seed`` is negative, the file cannot be read, an override names no graph input,
            an input without an override is a string, a non-tensor, or has no declared shape, or
            the inputs do not fit in memory (see :func:`plan_inputs`).
    """
    _check_seed(seed)
    return draw_inputs(plan_inputs(model, dim_values, overrides), seed)


def _check_seed(seed: int) -> None:
    """Refuse a negative seed (``numpy.random.default_rng`` would), as a UserError."""
    if int(seed) < 0:
        raise UserError(f"seed {seed}: a seed must be >= 0 (numpy.random.default_rng refuses "
                        "negative seeds); give --seed 0 or another integer >= 0")


def draw_inputs(plan: "InputPlan", seed: int = 0) -> Dict[str, np.ndarray]:
    """The arrays :func:`make_inputs` returns, drawn from an already resolved :func:`plan_inputs`
    (so a caller that reports the plan does not resolve it twice).

    Args:
        plan: The :class:`InputPlan` of the model's graph inputs.
        seed: Seed of ``numpy.random.default_rng`` (values drawn in graph-input order).

    Returns:
        ``{input name: array}`` for every graph input, in graph order (override arrays as given).

    Raises:
        UserError: ``seed`` is negative, or an array does not fit in memory.
    """
    _check_seed(seed)
    rng = np.random.default_rng(seed)
    result: Dict[str, np.ndarray] = {}
    for name, value in plan.arrays.items():
        if isinstance(value, np.ndarray):
            result[name] = value
            continue
        dtype, shape = value
        try:
            result[name] = _random_array(name, dtype, shape, rng)
        except MemoryError as e:
            raise UserError(f"input '{name}' ({dtype} {list(shape)}) does not fit in memory; give "
                            "smaller sizes with --dim NAME=SIZE") from e
        logger.debug("input %s: %s %s", name, dtype, shape)
    return result


@dataclass
class InputPlan:
    """What :func:`make_inputs` will feed, before any random array is drawn.

    Attributes:
        arrays: ``{input name: override array}`` for given inputs, ``(dtype, shape)`` for the
            others, in graph-input order.
        dims: ``{dimension: size}`` for every unknown dimension of the graph inputs (a symbolic
            ``dim_param`` by name, an unnamed one as ``"<input>[<axis>]"``).
        dim_sources: ``{dimension: "given" | "inputs" | "default"}``: from ``dim_values``, from the
            shape of an override array, or one of the default rules 4-7 of :func:`make_inputs`.
        nbytes: bytes of all input arrays.
    """

    arrays: Dict[str, Union[np.ndarray, Tuple[np.dtype, tuple]]] = field(default_factory=dict)
    dims: Dict[str, int] = field(default_factory=dict)
    dim_sources: Dict[str, str] = field(default_factory=dict)
    nbytes: int = 0


def _memory_bytes() -> Optional[int]:
    """Physical memory of this machine in bytes (``None`` where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def _size_text(nbytes: float) -> str:
    """``4e13`` -> ``"36.4 TiB"`` (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1024
    return f"{nbytes:.1f} PiB"


def plan_inputs(model: Union[onnx.ModelProto, str], dim_values: Optional[Mapping[str, int]] = None,
                overrides: Optional[Mapping[str, np.ndarray]] = None) -> InputPlan:
    """Resolve the dtype and shape of every graph input (the shape rules of :func:`make_inputs`)
    without drawing random values, so sizes can be reported and checked first.

    Args:
        model: An ``onnx.ModelProto`` or the path of an ``.onnx`` file (external data is not read).
        dim_values: Sizes of unknown dimensions, by ``dim_param`` name or ``"<input>[<axis>]"``.
        overrides: Arrays to use as given, by input name.

    Returns:
        The :class:`InputPlan`.

    Raises:
        UserError: as :func:`make_inputs`, and when the inputs need more bytes than this machine's
            physical memory (too large ``--dim`` sizes); names the largest input.
    """
    proto = _load_header(model)
    dim_values = dict(dim_values or {})
    overrides = dict(overrides or {})
    inputs = graph_inputs(proto)
    by_name = {value.name: value for value in inputs}
    unknown = sorted(set(overrides) - set(by_name))
    if unknown:
        raise UserError(f"input arrays {unknown} name no graph input of the model (its inputs: "
                        f"{[v.name for v in inputs]}); name each array after a graph input, "
                        "e.g. numpy.savez(path, **{'input name': array})")
    bound: Dict[str, int] = {}
    used: Dict[str, Tuple[int, str]] = {}
    converted = {name: np.asarray(array) for name, array in overrides.items()}
    for name, array in converted.items():
        check_override(by_name[name], array)
        _bind_override(by_name[name], array, bound, used)
    plan = InputPlan()
    largest = ("", 0, "")
    for value in inputs:
        if value.name in converted:
            plan.arrays[value.name] = converted[value.name]
            plan.nbytes += converted[value.name].nbytes
            continue
        dtype = _elem_dtype(value)
        shape = _resolve_shape(value, dim_values, bound, used)
        plan.arrays[value.name] = (dtype, shape)
        nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
        plan.nbytes += nbytes
        if nbytes > largest[1]:
            largest = (value.name, nbytes, f"{dtype} {list(shape)}")
    plan.dims = {k: size for k, (size, _) in used.items()}
    plan.dim_sources = {k: source for k, (_, source) in used.items()}
    memory = _memory_bytes()
    if memory is not None and plan.nbytes > memory:
        raise UserError(f"the input sizes need {_size_text(plan.nbytes)} of input arrays (largest: "
                        f"{largest[0]} {largest[2]}) but this machine has {_size_text(memory)} of "
                        "memory; give smaller sizes with --dim NAME=SIZE")
    return plan
