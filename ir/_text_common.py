"""Lexical pieces shared by the IR printer and parser: quoting, string escapes, scalar literals."""

from __future__ import annotations

import re
from typing import List, Optional, Sequence, Union

import numpy as np

from passctl.ir._types import DataType

# A value name prints bare after '%' when it matches this; otherwise it is quoted: %"onnx::Add_1".
BARE_VALUE = re.compile(r"[A-Za-z0-9_./\-]+\Z")
# An identifier (op type, attribute name, symbolic dim, graph/function name) prints bare when it
# matches this and is no keyword; otherwise quoted.
BARE_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")

# Words with a meaning in some position; a name equal to one of them is printed quoted.
KEYWORDS = frozenset({
    "model", "graph", "func", "return", "init", "none", "doc", "meta", "extra", "name", "loc",
    "opset", "ir_version", "producer", "domain", "model_version", "attrs", "defaults", "denote",
    "dense", "hex", "sparse", "seq", "opt", "map", "type", "true", "false", "nan", "inf", "node",
})

# Attribute kinds as written after ':' (lower-case AttrType names).
ATTR_KIND_NAMES = ("float", "int", "string", "tensor", "graph", "sparse_tensor", "type_proto",
                   "floats", "ints", "strings", "tensors", "graphs", "sparse_tensors",
                   "type_protos")

_ESCAPES = {ord("\\"): "\\\\", ord('"'): '\\"', ord("\n"): "\\n", ord("\t"): "\\t",
            ord("\r"): "\\r"}


def quote(s: Union[str, bytes]) -> str:
    """A double-quoted string literal for ``s``.

    ``str`` is written as UTF-8 text; ``bytes`` that are not valid UTF-8 keep every byte >= 0x80 as
    ``\\xNN``. Control characters, ``"`` and ``\\`` are escaped, so the literal is one line.
    """
    out = ['"']
    if isinstance(s, bytes):
        try:
            s = s.decode("utf-8")
        except UnicodeDecodeError:
            for b in s:
                if b in _ESCAPES:
                    out.append(_ESCAPES[b])
                elif 0x20 <= b < 0x7F:
                    out.append(chr(b))
                else:
                    out.append(f"\\x{b:02x}")
            out.append('"')
            return "".join(out)
    for ch in s:
        o = ord(ch)
        if o in _ESCAPES:
            out.append(_ESCAPES[o])
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\x{o:02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def ident(name: str) -> str:
    """``name`` bare when it is a plain identifier and no keyword, else quoted."""
    return name if BARE_IDENT.match(name) and name not in KEYWORDS else quote(name)


def value_ref(name: str) -> str:
    """``%name``, quoted after the ``%`` when the name has other characters: ``%"a b"``."""
    return "%" + (name if BARE_VALUE.match(name) else quote(name))


def as_text(b: bytes) -> Union[str, bytes]:
    """Bytes of a string literal -> ``str`` when valid UTF-8, else the bytes themselves."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b


# ----------------------------------------------------------------------------------------------
# Scalars


def format_float(x: float, dtype: DataType = DataType.FLOAT) -> str:
    """Shortest decimal text that reads back to the same ``dtype`` value (or nan, inf, -inf).

    f16/f32/f64 use numpy's shortest round-trip repr (Dragon4, "unique"); the narrower float types
    (bf16, fp8, fp4, e8m0) are exactly representable in f32 and print as their f32 value. The
    text always has a '.', an exponent, or is nan/inf, so it never reads as an integer.
    """
    if dtype == DataType.DOUBLE:
        s = repr(float(x))
    elif dtype == DataType.FLOAT16:
        s = str(np.float16(x))
    else:
        s = str(np.float32(x))
    if s in ("nan", "-nan"):
        return "nan"
    if not any(c in s for c in ".eni"):
        s += ".0"
    return s


def format_scalars(arr: np.ndarray, dtype: DataType) -> Optional[List[str]]:
    """The ``dense<...>`` element texts of a flat array, or None when they would not read back
    bit-exactly (NaN payloads, negative NaN, complex numbers): the caller then writes hex."""
    if dtype in (DataType.COMPLEX64, DataType.COMPLEX128, DataType.UNDEFINED):
        return None
    flat = np.asarray(arr).reshape(-1)
    if dtype == DataType.STRING:
        return [quote(x if isinstance(x, (bytes, str)) else str(x)) for x in flat]
    if dtype == DataType.BOOL:
        texts = ["true" if bool(x) else "false" for x in flat]
    elif dtype.is_floating:
        with np.errstate(invalid="ignore", over="ignore"):  # NaN payloads: checked below
            wide = flat.astype(np.float64)
        texts = [format_float(x, dtype) for x in wide]
    else:
        wide_int = np.uint64 if dtype == DataType.UINT64 else np.int64
        texts = [str(int(x)) for x in flat.astype(wide_int)]
    back = scalars_to_array([_read_scalar(t) for t in texts], dtype, flat.shape)
    if back.tobytes() != np.ascontiguousarray(flat.astype(dtype.numpy())).tobytes():
        return None
    return texts


def _read_scalar(text: str):
    if text in ("true", "false"):
        return text == "true"
    if any(c in text for c in ".eni"):
        return float(text)
    return int(text)


def scalars_to_array(values: Sequence, dtype: DataType, dims: Sequence[int]) -> np.ndarray:
    """Build the array of a ``dense<...>`` literal: Python scalars (float, int, bool, bytes) ->
    ``dtype.numpy()`` array of shape ``dims``.

    Raises:
        ValueError: a value does not fit the element type (e.g. a float for an int type).
    """
    np_dtype = dtype.numpy()
    if dtype == DataType.STRING:
        arr = np.empty(len(values), dtype=object)
        for i, v in enumerate(values):
            if not isinstance(v, bytes):
                raise ValueError(f"a string tensor needs string elements, found {v!r}")
            arr[i] = v
        return arr.reshape(tuple(dims))
    if dtype == DataType.BOOL:
        if not all(isinstance(v, bool) for v in values):
            raise ValueError("a bool tensor needs true/false elements")
        return np.array(values, dtype=np.bool_).reshape(tuple(dims))
    if any(isinstance(v, (bytes, bool)) for v in values):
        raise ValueError(f"a {dtype.short_name} tensor needs numeric elements")
    if dtype.is_floating:
        wide = np.array([float(v) for v in values], dtype=np.float64)
        if dtype in (DataType.FLOAT, DataType.FLOAT16, DataType.DOUBLE):
            out = wide.astype(np_dtype)
        else:  # bf16 / fp8 / fp4 / e8m0: every value is exact in f32
            out = wide.astype(np.float32).astype(np_dtype)
        return out.reshape(tuple(dims))
    if any(isinstance(v, float) for v in values):
        raise ValueError(f"a {dtype.short_name} tensor needs integer elements, found a float")
    info_dtype = np.int64 if dtype.bitwidth < 8 else np_dtype
    lo, hi = _int_range(dtype, info_dtype)
    for v in values:
        if not lo <= v <= hi:
            raise ValueError(f"{v} does not fit in {dtype.short_name}")
    return np.array(values, dtype=np.int64 if dtype != DataType.UINT64 else np.uint64
                    ).astype(np_dtype).reshape(tuple(dims))


def _int_range(dtype: DataType, np_dtype) -> tuple:
    bits = dtype.bitwidth
    if bits < 8:
        signed = dtype in (DataType.INT4, DataType.INT2)
        return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    info = np.iinfo(np_dtype)
    return int(info.min), int(info.max)
