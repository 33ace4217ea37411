"""Element types, shapes and value types of the IR (every ONNX element type, symbolic dimensions)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import ml_dtypes
import numpy as np
import onnx


class DataType(enum.IntEnum):
    """ONNX tensor element types; the integer values are ``onnx.TensorProto.DataType``'s."""

    UNDEFINED = 0
    FLOAT = 1
    UINT8 = 2
    INT8 = 3
    UINT16 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    STRING = 8
    BOOL = 9
    FLOAT16 = 10
    DOUBLE = 11
    UINT32 = 12
    UINT64 = 13
    COMPLEX64 = 14
    COMPLEX128 = 15
    BFLOAT16 = 16
    FLOAT8E4M3FN = 17
    FLOAT8E4M3FNUZ = 18
    FLOAT8E5M2 = 19
    FLOAT8E5M2FNUZ = 20
    UINT4 = 21
    INT4 = 22
    FLOAT4E2M1 = 23
    FLOAT8E8M0 = 24
    UINT2 = 25
    INT2 = 26
    FLOAT6E2M3 = 27
    FLOAT6E3M2 = 28

    @property
    def short_name(self) -> str:
        """The name used in the text form, e.g. ``f32``, ``bf16``, ``f8e4m3fn``, ``i4``."""
        return _SHORT_NAMES[self]

    @classmethod
    def from_short_name(cls, name: str) -> "DataType":
        """Inverse of :attr:`short_name`. Raises ``KeyError`` for an unknown name."""
        return _FROM_SHORT[name]

    @property
    def bitwidth(self) -> int:
        """Bits per element (4 for int4/uint4/fp4, 6 for fp6, 2 for int2/uint2, 0 for string/undefined)."""
        return _BITWIDTH.get(self, 0)

    @property
    def is_floating(self) -> bool:
        return self in _FLOATING

    @property
    def is_packed(self) -> bool:
        """True for the sub-byte types that ONNX packs as a little-endian bit stream (2, 4, 6 bits)."""
        return self.bitwidth in (2, 4, 6)

    def numpy(self) -> np.dtype:
        """The numpy dtype that holds one element (ml_dtypes for bf16, fp8, int4, ...).

        Raises:
            TypeError: for UNDEFINED.
        """
        if self == DataType.UNDEFINED:
            raise TypeError("DataType.UNDEFINED has no numpy dtype")
        return _NUMPY[self]

    @classmethod
    def from_numpy(cls, dtype: np.dtype) -> "DataType":
        """The element type of a numpy dtype. Raises ``TypeError`` when there is none."""
        dtype = np.dtype(dtype)
        if dtype.kind in "OUS":
            return DataType.STRING
        for dt, np_dt in _NUMPY.items():
            if np_dt == dtype:
                return dt
        raise TypeError(f"numpy dtype {dtype} has no ONNX element type")


_SHORT_NAMES = {
    DataType.UNDEFINED: "undef", DataType.FLOAT: "f32", DataType.UINT8: "u8", DataType.INT8: "i8",
    DataType.UINT16: "u16", DataType.INT16: "i16", DataType.INT32: "i32", DataType.INT64: "i64",
    DataType.STRING: "str", DataType.BOOL: "bool", DataType.FLOAT16: "f16", DataType.DOUBLE: "f64",
    DataType.UINT32: "u32", DataType.UINT64: "u64", DataType.COMPLEX64: "c64",
    DataType.COMPLEX128: "c128", DataType.BFLOAT16: "bf16", DataType.FLOAT8E4M3FN: "f8e4m3fn",
    DataType.FLOAT8E4M3FNUZ: "f8e4m3fnuz", DataType.FLOAT8E5M2: "f8e5m2",
    DataType.FLOAT8E5M2FNUZ: "f8e5m2fnuz", DataType.UINT4: "u4", DataType.INT4: "i4",
    DataType.FLOAT4E2M1: "f4e2m1", DataType.FLOAT8E8M0: "f8e8m0", DataType.UINT2: "u2",
    DataType.INT2: "i2", DataType.FLOAT6E2M3: "f6e2m3", DataType.FLOAT6E3M2: "f6e3m2",
}
_FROM_SHORT = {v: k for k, v in _SHORT_NAMES.items()}
_BITWIDTH = {
    DataType.FLOAT: 32, DataType.UINT8: 8, DataType.INT8: 8, DataType.UINT16: 16, DataType.INT16: 16,
    DataType.INT32: 32, DataType.INT64: 64, DataType.BOOL: 8, DataType.FLOAT16: 16, DataType.DOUBLE: 64,
    DataType.UINT32: 32, DataType.UINT64: 64, DataType.COMPLEX64: 64, DataType.COMPLEX128: 128,
    DataType.BFLOAT16: 16, DataType.FLOAT8E4M3FN: 8, DataType.FLOAT8E4M3FNUZ: 8,
    DataType.FLOAT8E5M2: 8, DataType.FLOAT8E5M2FNUZ: 8, DataType.UINT4: 4, DataType.INT4: 4,
    DataType.FLOAT4E2M1: 4, DataType.FLOAT8E8M0: 8, DataType.UINT2: 2, DataType.INT2: 2,
    DataType.FLOAT6E2M3: 6, DataType.FLOAT6E3M2: 6,
}
_FLOATING = {
    DataType.FLOAT, DataType.FLOAT16, DataType.DOUBLE, DataType.BFLOAT16, DataType.FLOAT8E4M3FN,
    DataType.FLOAT8E4M3FNUZ, DataType.FLOAT8E5M2, DataType.FLOAT8E5M2FNUZ, DataType.FLOAT4E2M1,
    DataType.FLOAT8E8M0, DataType.FLOAT6E2M3, DataType.FLOAT6E3M2,
}
_NUMPY = {
    DataType.FLOAT: np.dtype(np.float32), DataType.UINT8: np.dtype(np.uint8),
    DataType.INT8: np.dtype(np.int8), DataType.UINT16: np.dtype(np.uint16),
    DataType.INT16: np.dtype(np.int16), DataType.INT32: np.dtype(np.int32),
    DataType.INT64: np.dtype(np.int64), DataType.STRING: np.dtype(object),
    DataType.BOOL: np.dtype(np.bool_), DataType.FLOAT16: np.dtype(np.float16),
    DataType.DOUBLE: np.dtype(np.float64), DataType.UINT32: np.dtype(np.uint32),
    DataType.UINT64: np.dtype(np.uint64), DataType.COMPLEX64: np.dtype(np.complex64),
    DataType.COMPLEX128: np.dtype(np.complex128), DataType.BFLOAT16: np.dtype(ml_dtypes.bfloat16),
    DataType.FLOAT8E4M3FN: np.dtype(ml_dtypes.float8_e4m3fn),
    DataType.FLOAT8E4M3FNUZ: np.dtype(ml_dtypes.float8_e4m3fnuz),
    DataType.FLOAT8E5M2: np.dtype(ml_dtypes.float8_e5m2),
    DataType.FLOAT8E5M2FNUZ: np.dtype(ml_dtypes.float8_e5m2fnuz),
    DataType.UINT4: np.dtype(ml_dtypes.uint4), DataType.INT4: np.dtype(ml_dtypes.int4),
    DataType.FLOAT4E2M1: np.dtype(ml_dtypes.float4_e2m1fn),
    DataType.FLOAT8E8M0: np.dtype(ml_dtypes.float8_e8m0fnu),
    DataType.UINT2: np.dtype(getattr(ml_dtypes, "uint2", np.uint8)),
    DataType.INT2: np.dtype(getattr(ml_dtypes, "int2", np.int8)),
    DataType.FLOAT6E2M3: np.dtype(getattr(ml_dtypes, "float6_e2m3fn", np.uint8)),
    DataType.FLOAT6E3M2: np.dtype(getattr(ml_dtypes, "float6_e3m2fn", np.uint8)),
}

# A dimension is a non-negative int, a symbolic name (str), or None (unknown).
Dim = Union[int, str, None]

#: ``dim_param`` strings that exporters write for a dim they leave unnamed (Paddle2ONNX writes
#: ``"?"``); such a dim is anonymous: two axes carrying it are not known to be equal.
UNNAMED_DIM_PARAMS = frozenset({"", "?", "-1", "None", "unk"})


def is_anonymous_dim(d: Dim) -> bool:
    """True for an unknown dim: None, or a str in :data:`UNNAMED_DIM_PARAMS`."""
    return d is None or (isinstance(d, str) and d in UNNAMED_DIM_PARAMS)


@dataclass(frozen=True)
class Shape:
    """A tensor shape: a tuple of dims, each an ``int``, a symbolic ``str`` or ``None`` (unknown).

    ``denotations`` keeps ONNX's optional per-dimension denotation strings (``""`` when absent).
    """

    dims: Tuple[Dim, ...]
    denotations: Tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "dims", tuple(self.dims))
        object.__setattr__(self, "denotations", tuple(self.denotations))

    @property
    def rank(self) -> int:
        return len(self.dims)

    def is_static(self) -> bool:
        """True when every dim is a known int."""
        return all(isinstance(d, int) for d in self.dims)

    def numel(self) -> Optional[int]:
        """Number of elements, or None when a dim is not a known int."""
        if not self.is_static():
            return None
        return int(np.prod(self.dims, dtype=np.int64))

    def __iter__(self):
        return iter(self.dims)

    def __len__(self):
        return len(self.dims)

    def __getitem__(self, i):
        return self.dims[i]

    def __str__(self):
        return "x".join("?" if d is None else str(d) for d in self.dims)


class Type:
    """Base of value types: :class:`TensorType`, :class:`SparseTensorType`, :class:`SequenceType`,
    :class:`OptionalType`, :class:`MapType`, and :class:`OpaqueType` for anything else."""

    denotation: str = ""


@dataclass(frozen=True, eq=True)
class TensorType(Type):
    """A dense tensor of ``dtype`` with an optional ``shape`` (None: rank unknown)."""

    dtype: DataType
    shape: Optional[Shape] = None
    denotation: str = ""


@dataclass(frozen=True, eq=True)
class SparseTensorType(Type):
    dtype: DataType
    shape: Optional[Shape] = None
    denotation: str = ""


@dataclass(frozen=True, eq=True)
class SequenceType(Type):
    elem: Optional[Type]
    denotation: str = ""


@dataclass(frozen=True, eq=True)
class OptionalType(Type):
    elem: Optional[Type]
    denotation: str = ""


@dataclass(frozen=True, eq=True)
class MapType(Type):
    key: DataType
    value: Optional[Type]
    denotation: str = ""


# ----------------------------------------------------------------------------------------------
# TypeProto <-> Type


def type_from_proto(tp: onnx.TypeProto) -> Optional[Type]:
    """Convert an ``onnx.TypeProto`` (None for an empty one)."""
    which = tp.WhichOneof("value")
    den = tp.denotation
    if which == "tensor_type":
        t = tp.tensor_type
        return TensorType(DataType(t.elem_type), _shape_from_proto(t) , den)
    if which == "sparse_tensor_type":
        t = tp.sparse_tensor_type
        return SparseTensorType(DataType(t.elem_type), _shape_from_proto(t), den)
    if which == "sequence_type":
        return SequenceType(type_from_proto(tp.sequence_type.elem_type)
                            if tp.sequence_type.HasField("elem_type") else None, den)
    if which == "optional_type":
        return OptionalType(type_from_proto(tp.optional_type.elem_type)
                            if tp.optional_type.HasField("elem_type") else None, den)
    if which == "map_type":
        return MapType(DataType(tp.map_type.key_type), type_from_proto(tp.map_type.value_type)
                       if tp.map_type.HasField("value_type") else None, den)
    return None


def _shape_from_proto(t) -> Optional[Shape]:
    if not t.HasField("shape"):
        return None
    dims = []
    dens = []
    for d in t.shape.dim:
        w = d.WhichOneof("value")
        # A negative dim_value (Paddle2ONNX writes -1) means unknown, as in ONNX Runtime: None.
        if w == "dim_value" and d.dim_value >= 0:
            dims.append(d.dim_value)
        else:
            dims.append(d.dim_param if w == "dim_param" else None)
        dens.append(d.denotation)
    if not any(dens):
        dens = []
    return Shape(tuple(dims), tuple(dens))


def type_to_proto(t: Optional[Type], tp: Optional[onnx.TypeProto] = None) -> onnx.TypeProto:
    """Fill (or create) an ``onnx.TypeProto`` from a :class:`Type`."""
    tp = onnx.TypeProto() if tp is None else tp
    if t is None:
        return tp
    if t.denotation:
        tp.denotation = t.denotation
    if isinstance(t, (TensorType, SparseTensorType)):
        sub = tp.tensor_type if isinstance(t, TensorType) else tp.sparse_tensor_type
        sub.elem_type = int(t.dtype)
        if t.shape is not None:
            shape = sub.shape
            shape.SetInParent()
            for i, d in enumerate(t.shape.dims):
                dim = shape.dim.add()
                if isinstance(d, int):
                    dim.dim_value = d
                elif isinstance(d, str):
                    dim.dim_param = d
                if t.shape.denotations and t.shape.denotations[i]:
                    dim.denotation = t.shape.denotations[i]
    elif isinstance(t, SequenceType):
        tp.sequence_type.SetInParent()
        if t.elem is not None:
            type_to_proto(t.elem, tp.sequence_type.elem_type)
    elif isinstance(t, OptionalType):
        tp.optional_type.SetInParent()
        if t.elem is not None:
            type_to_proto(t.elem, tp.optional_type.elem_type)
    elif isinstance(t, MapType):
        tp.map_type.key_type = int(t.key)
        if t.value is not None:
            type_to_proto(t.value, tp.map_type.value_type)
    return tp
