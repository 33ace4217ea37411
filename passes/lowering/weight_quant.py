"""Forms of quantized MatMuls: ONNX Runtime's ``com.microsoft.MatMulNBits`` (weight-only int4/int8),
``com.microsoft.DynamicQuantizeMatMul`` / ``MatMulInteger`` (dynamic int8 activations), and the
standard-ONNX weight-only form TensorRT's ONNX parser takes, ``DequantizeLinear -> MatMul``
(:func:`dq_matmul_per_channel`, :func:`dq_matmul_blocked`; sources in their docstrings).

These are lowering functions called by the quantization passes (``quantize-weights``,
``quantize-dynamic``) for the onnxruntime emitter; they take the codes the pass computed and
write them in the layout the kernel reads.

Sources (ONNX Runtime ContribOperators.md, ``com.microsoft.MatMulNBits``, ORT 1.32):

* ``Y = A @ dequant(B)^T (+ bias)``, ``A`` float ``[..., K]``, attributes ``K``, ``N``, ``bits``
  (4 or 8), ``block_size`` (a power of 2, >= 16) and ``accuracy_level`` (0 unset, 1 fp32, 2 fp16,
  3 bf16, 4 int8: ``A`` is quantized to int8 per block at run time and the dot products are
  integer; its x86 kernels need it for int8 compute).
* ``B`` uint8 ``[N, k_blocks, blob_size]``, ``k_blocks = ceil(K / block_size)``, ``blob_size =
  block_size * bits / 8``; codes of one column ``n`` along K, packed low nibble first for 4 bits.
* ``scales`` float ``[N * k_blocks]``; ``zero_points`` uint8 ``[N * ceil(k_blocks * bits / 8)]``
  (4 bits: two per byte, low nibble first, each column's row padded to whole bytes); absent means
  ``2^(bits-1)``. ``dequant(B)[n, k] = (code - zero_point) * scale`` of ``k``'s block.
* inputs 4 ``g_idx`` (left empty) and 5 ``bias`` float ``[N]``.

``DynamicQuantizeMatMul(A, B, b_scale, b_zero_point, bias)``: ``A`` float quantized to uint8 at
run time (asymmetric, per tensor: ``DynamicQuantizeLinear``'s formula), ``B`` int8 ``[K, N]``,
``b_scale`` float ``[N]`` (per column) or scalar, ``b_zero_point`` int8 like it, bias float ``[N]``.
The same math as ``DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul`` (ONNX opset 11 ops),
which ONNX Runtime's ``MatMulIntegerToFloatFusion`` (ORT_ENABLE_EXTENDED and above) turns into
``DynamicQuantizeMatMul`` again.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from passctl.dialect.canonical import MS_DOMAIN, ensure_opset
from passctl.ir import Builder, DataType, Model, Shape, TensorType, Value

NBITS_MIN_BLOCK = 16
DQ_PER_AXIS_OPSET = 13
"""DequantizeLinear's ``axis`` (per-channel scales) exists from opset 13."""
DQ_BLOCKED_OPSET = 21
"""DequantizeLinear's ``block_size`` and the INT4 / UINT4 types exist from opset 21."""


def pack_nbits(codes: np.ndarray, bits: int) -> np.ndarray:
    """``B`` of MatMulNBits from codes ``[N, k_blocks, block]`` (uint8 in ``[0, 2^bits)``, K
    padded to whole blocks): ``[N, k_blocks, block * bits / 8]`` uint8, 4-bit codes two per byte,
    the even index in the low nibble."""
    codes = np.asarray(codes, np.uint8)
    if bits == 8:
        return np.ascontiguousarray(codes)
    if bits != 4:
        raise ValueError(f"MatMulNBits: bits={bits} is not 4 or 8")
    return np.ascontiguousarray(codes[..., 0::2] | (codes[..., 1::2] << 4))


def pack_zero_points(zp: np.ndarray, bits: int) -> np.ndarray:
    """MatMulNBits' ``zero_points`` from ``[N, k_blocks]`` uint8 (or float32: passed flat, the
    kernel's T1 form, ``(code - zp) * scale`` with a fractional zp): flat ``[N * ceil(k_blocks *
    bits / 8)]``, 4 bits two per byte (low nibble first), each column padded to whole bytes."""
    if np.asarray(zp).dtype == np.float32:  # float zero points: T1 like scales, unpacked
        return np.ascontiguousarray(zp, np.float32).reshape(-1)
    zp = np.asarray(zp, np.uint8)
    if bits == 8:
        return zp.reshape(-1).copy()
    n, kb = zp.shape
    if kb % 2:
        zp = np.concatenate([zp, np.zeros((n, 1), np.uint8)], axis=1)
    return (zp[:, 0::2] | (zp[:, 1::2] << 4)).reshape(-1).copy()


def matmul_nbits(b: Builder, model: Model, a: Value, codes: np.ndarray, scales: np.ndarray,
                 zero_points: Optional[np.ndarray], k: int, bits: int, block: int,
                 accuracy_level: int, bias: Optional[Value] = None, base: str = "w",
                 output_names=(), spill: bool = False) -> Value:
    """Build ``com.microsoft.MatMulNBits(A, B, scales, zero_points, , bias)`` with ``b``.

    Args:
        a: the activation ``[..., K]``, float32 or float16 (the kernel's ``T1``; scales, float
            zero points and the output take its type; an untyped ``a`` counts as float32).
        codes: uint8 ``[N, k_blocks, block]`` (K padded with codes equal to the zero point).
        scales: float ``[N, k_blocks]``; ``zero_points``: uint8 ``[N, k_blocks]`` or None
            (the kernel's default ``2^(bits-1)``, symmetric).
        k: the unpadded K; ``bits``: 4 or 8; ``block``: block size (power of 2, >= 16).
        accuracy_level: the attribute (4: int8 compute).
        bias: ``[N]`` value of ``a``'s type, or None.
        spill: write the packed codes and scales to the spill file (:func:`passctl.ir.spill`)
            instead of holding them in memory (for weights that came from external data).

    Returns:
        the output ``[..., N]`` of ``a``'s type (its shape set when ``a``'s is known).
    """
    n = codes.shape[0]
    ensure_opset(model, MS_DOMAIN, 1)
    graph = b.graph
    t1 = DataType.FLOAT16 if a.dtype == DataType.FLOAT16 else DataType.FLOAT
    f = t1.numpy()

    def const(arr, name):
        if spill:
            from passctl.ir import spill as spill_array

            return graph.add_constant(spill_array(arr), name)
        return graph.add_constant(arr, name)

    packed_zp = None if zero_points is None else pack_zero_points(zero_points, bits)
    if packed_zp is not None and packed_zp.dtype == np.float32:
        packed_zp = packed_zp.astype(f)
    ins = [a, const(pack_nbits(codes, bits), f"{base}_q{bits}"),
           const(np.ascontiguousarray(scales, f).reshape(-1), f"{base}_scales")]
    ins.append(graph.add_constant(packed_zp, f"{base}_zero_points")
               if packed_zp is not None else None)
    if bias is not None:
        ins += [None, bias]
    while ins[-1] is None:
        ins.pop()
    y = b.op("MatMulNBits", *ins, domain=MS_DOMAIN, K=int(k), N=int(n), bits=int(bits),
             block_size=int(block), accuracy_level=int(accuracy_level),
             output_names=output_names or (f"{base}_out",))
    if a.shape is not None:
        y.type = TensorType(t1, Shape(tuple(a.shape)[:-1] + (int(n),)))
    return y


def dynamic_quantize_matmul(b: Builder, model: Model, a: Value, codes: np.ndarray,
                            scales: np.ndarray, bias: Optional[Value] = None, base: str = "w",
                            output_names=()) -> Value:
    """``com.microsoft.DynamicQuantizeMatMul(A, B int8 [K, N], b_scale [N], b_zero_point 0,
    bias)``: per-column symmetric int8 weights, activations quantized at run time."""
    ensure_opset(model, MS_DOMAIN, 1)
    graph = b.graph
    n = codes.shape[1]
    ins = [a, graph.add_constant(np.ascontiguousarray(codes, np.int8), f"{base}_int8"),
           graph.add_constant(np.ascontiguousarray(scales, np.float32).reshape(n),
                              f"{base}_scale"),
           graph.add_constant(np.zeros(n, np.int8), f"{base}_zero_point"), bias]
    while ins[-1] is None:
        ins.pop()
    y = b.op("DynamicQuantizeMatMul", *ins, domain=MS_DOMAIN,
             output_names=output_names or (f"{base}_out",))
    if a.shape is not None:
        y.type = TensorType(DataType.FLOAT, Shape(tuple(a.shape)[:-1] + (int(n),)))
    return y


def matmul_integer(b: Builder, model: Model, a: Value, codes: np.ndarray, scales: np.ndarray,
                   bias: Optional[Value] = None, base: str = "w", output_names=()) -> Value:
    """The standard-ONNX spelling: ``DynamicQuantizeLinear(A) -> MatMulInteger(a_q, B, a_zp) ->
    Cast(float) -> Mul(a_scale * b_scale [N]) (-> Add bias)``."""
    graph = b.graph
    n = codes.shape[1]
    q, s, zp = b.op("DynamicQuantizeLinear", a, outputs=3,
                    output_names=(f"{base}_a_u8", f"{base}_a_scale", f"{base}_a_zp"))
    w = graph.add_constant(np.ascontiguousarray(codes, np.int8), f"{base}_int8")
    acc = b.op("MatMulInteger", q, w, zp, output_names=(f"{base}_i32",))
    f = b.op("Cast", acc, to=int(DataType.FLOAT), output_names=(f"{base}_f32",))
    scale = b.op("Mul", s, graph.add_constant(np.ascontiguousarray(scales, np.float32).reshape(n),
                                              f"{base}_scale"), output_names=(f"{base}_scales",))
    last = output_names if bias is None else ()
    y = b.op("Mul", f, scale, output_names=last or (f"{base}_out",))
    if bias is not None:
        y = b.op("Add", y, bias, output_names=output_names or (f"{base}_biased",))
    if a.shape is not None:
        y.type = TensorType(DataType.FLOAT, Shape(tuple(a.shape)[:-1] + (int(n),)))
    return y


def signed_codes(codes: np.ndarray, k: int, bits: int) -> np.ndarray:
    """int8 ``[K, N]`` signed codes ``code - 2^(bits-1)`` from codes ``[N, k_blocks, block]``
    (uint8 in ``[0, 2^bits)`` on the symmetric grid, zero point ``2^(bits-1)``, K padded to whole
    blocks): the padding dropped, K first (MatMul's B layout)."""
    n = codes.shape[0]
    flat = np.asarray(codes).reshape(n, -1)[:, :k]
    return np.ascontiguousarray((flat.astype(np.int16) - (1 << (bits - 1))).astype(np.int8).T)


def _dq_matmul(b: Builder, a: Value, q: np.ndarray, scales: np.ndarray, bits: int, attrs,
               bias: Optional[Value], base: str, output_names, spill: bool) -> Value:
    """``MatMul(a, DequantizeLinear(q, scales, **attrs)) (+ bias)`` with types set (the
    DequantizeLinear's output takes the scales' type, ``a``'s)."""
    graph = b.graph
    t1 = DataType.FLOAT16 if a.dtype == DataType.FLOAT16 else DataType.FLOAT

    def const(arr, name):
        if spill:
            from passctl.ir import spill as spill_array

            return graph.add_constant(spill_array(arr), name)
        return graph.add_constant(arr, name)

    n = q.shape[1]
    w = const(q, f"{base}_q{bits}")
    s = const(np.ascontiguousarray(scales, t1.numpy()), f"{base}_scales")
    wd = b.op("DequantizeLinear", w, s, name=f"{base}_dequantize", output_names=(f"{base}_dq",),
              **attrs)
    wd.type = TensorType(t1, Shape(tuple(int(d) for d in q.shape)))
    last = output_names if bias is None else ()
    y = b.op("MatMul", a, wd, name=f"{base}_matmul", output_names=last or (f"{base}_out",))
    if bias is not None:
        y.type = TensorType(t1, None if a.shape is None
                            else Shape(tuple(a.shape)[:-1] + (int(n),)))
        y = b.op("Add", y, bias, name=f"{base}_bias",
                 output_names=output_names or (f"{base}_biased",))
    if a.shape is not None:
        y.type = TensorType(t1, Shape(tuple(a.shape)[:-1] + (int(n),)))
    return y


def dq_matmul_per_channel(b: Builder, model: Model, a: Value, codes: np.ndarray,
                          scales: np.ndarray, k: int, bias: Optional[Value] = None,
                          base: str = "w", output_names=(), spill: bool = False) -> Value:
    """Build ``MatMul(A, DequantizeLinear(B int8 [K, N], scale [N], axis=1)) (+ bias)``: int8
    weights with one scale per output column, the form TensorRT's ONNX parser reads as a
    weight-only int8 GEMM.

    Sources: ONNX ``DequantizeLinear`` (opset 13+: ``y = (x - x_zero_point) * x_scale``, a 1-D
    scale along ``axis``; ``y`` takes the scale's type); TensorRT's Dequantize operator
    (docs.nvidia.com/deeplearning/tensorrt/operators/docs/Dequantize.html: input int8 / fp8 /
    int4, the scale a build-time constant, "a 1-D tensor for per-channel quantization", a zero
    point "must only contain zero-valued coefficients", so none is written); onnx-tensorrt's
    ``QuantDequantLinearHelper`` (onnxOpImporters.cpp) also requires every scale > 0 ("Scale
    coefficients must all be positive") and a 1-D scale of ``dims[axis]`` entries.

    Args:
        a: the activation ``[..., K]``, float32 or float16 (the scales and the output take its
            type; an untyped ``a`` counts as float32).
        codes: uint8 ``[N, 1, block]`` codes of the symmetric grid (zero point 128, K padded);
            written as int8 ``code - 128``.
        scales: float ``[N, 1]`` (or ``[N]``), every one > 0.
        k: the unpadded K.
        bias: ``[N]`` value of ``a``'s type, or None (then an ``Add`` follows the MatMul).
        spill: write the codes and scales to the spill file (:func:`passctl.ir.spill`).

    Returns:
        the output ``[..., N]`` of ``a``'s type (its shape set when ``a``'s is known).

    Raises:
        ValueError: the model's opset is below 13, or codes hold more than one block per column.
    """
    if model.opset < DQ_PER_AXIS_OPSET:
        raise ValueError(f"DequantizeLinear per channel needs opset >= {DQ_PER_AXIS_OPSET}, "
                         f"the model has {model.opset}")
    if codes.shape[1] != 1:
        raise ValueError("per-channel codes have one block per column")
    n = codes.shape[0]
    q = signed_codes(codes, k, 8)
    return _dq_matmul(b, a, q, np.asarray(scales).reshape(n), 8, {"axis": 1}, bias, base,
                      output_names, spill)


def dq_matmul_blocked(b: Builder, model: Model, a: Value, codes: np.ndarray, scales: np.ndarray,
                      k: int, block: int, bias: Optional[Value] = None, base: str = "w",
                      output_names=(), spill: bool = False) -> Value:
    """Build ``MatMul(A, DequantizeLinear(B int4 [K, N], scale [K / block, N], axis=0,
    block_size=block)) (+ bias)``: weight-only int4 with one scale per output column and block of
    K, the form TensorRT 10 documents for INT4 weight-only quantization.

    Sources: ONNX ``DequantizeLinear`` opset 21 (blocked quantization: a scale of the input's
    rank, ``x_scale.shape[axis] = ceil(x.shape[axis] / block_size)``; INT4 input); TensorRT's
    Dequantize operator (docs.nvidia.com/deeplearning/tensorrt/operators/docs/Dequantize.html:
    "a 2-D tensor for block quantization (supported for DataType::kINT4 only)", zero points only
    zero-valued) and quantization schemes page (docs.nvidia.com/deeplearning/tensorrt/latest/
    inference-library/quantized-types-schemes.html: INT4 ``x = x_q * s``, ``x_q`` in [-8, 7],
    "INT4 quantization requires per-block scales. The supported block sizes are {64, 128}. The
    block dimension should be one of the last two dimensions", INT4 for weights only);
    onnx-tensorrt's ``QuantDequantLinearHelper`` (onnxOpImporters.cpp: every scale > 0, exactly
    one blocked dimension, the block inferred as ``dims / scale dims``, so K must be a multiple
    of ``block``; an even number of 4-bit elements; UINT8 / UINT4 data refused: no zero points).

    Args:
        a: the activation ``[..., K]``, float32 or float16 (scales and output take its type).
        codes: uint8 ``[N, K / block, block]`` codes of the symmetric grid (zero point 8),
            written as INT4 ``code - 8``.
        scales: float ``[N, K / block]``, every one > 0 (written transposed, ``[K / block, N]``).
        k: K, a multiple of ``block``; ``block``: 64 or 128 for TensorRT (any >= 2 for ONNX).
        bias, spill: as :func:`dq_matmul_per_channel`.

    Returns:
        the output ``[..., N]`` of ``a``'s type.

    Raises:
        ValueError: the model's opset is below 21, or K is not ``codes``' whole blocks.
    """
    import ml_dtypes

    if model.opset < DQ_BLOCKED_OPSET:
        raise ValueError(f"DequantizeLinear with block_size needs opset >= {DQ_BLOCKED_OPSET}, "
                         f"the model has {model.opset}")
    n, kb, size = codes.shape
    if size != block or kb * block != k:
        raise ValueError(f"K={k} is not {kb} whole blocks of {block}")
    q = signed_codes(codes, k, 4).astype(ml_dtypes.int4)
    return _dq_matmul(b, a, q, np.asarray(scales).T, 4, {"axis": 0, "block_size": int(block)},
                      bias, base, output_names, spill)


__all__ = ["DQ_BLOCKED_OPSET", "DQ_PER_AXIS_OPSET", "NBITS_MIN_BLOCK", "dq_matmul_blocked",
           "dq_matmul_per_channel", "dynamic_quantize_matmul", "matmul_integer", "matmul_nbits",
           "pack_nbits", "pack_zero_points", "signed_codes"]
