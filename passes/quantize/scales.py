"""Symmetric int8 scales of weights (per output channel) and activations (per tensor)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

QMAX = 127
"""Largest int8 magnitude used by symmetric quantization: codes in [-127, 127], zero point 0
(TensorRT's int8 convention; -128 is left unused so the range is symmetric)."""
MIN_SCALE = np.float32(1e-12)
"""Scale given to an all-zero channel or tensor (a scale must be positive: ONNX QuantizeLinear
divides by it; the channel's codes are 0 whatever the scale)."""


def weight_scales(w: np.ndarray, axis: int, qmax: int = QMAX) -> np.ndarray:
    """Per-channel symmetric scales ``max |w| / qmax`` along ``axis``.

    Source: symmetric per-channel weight quantization as in NVIDIA's "Integer Quantization for Deep
    Learning Inference" (Wu et al. 2020, section 3: max calibration of weights, scale =
    amax / (2^(b-1) - 1)).

    Args:
        w: float32 weight of any rank, e.g. Conv ``[C_out, C_in/group, kH, kW]`` or MatMul
            ``[K, N]``.
        axis: the channel axis (Conv: 0, MatMul B ``[K, N]``: 1, Gemm with transB=1: 0).
        qmax: the largest code: 127 (8 bits), or 63 (7 bits) for CPUs whose int8 kernels
            saturate (:attr:`passctl.support.cpu_isa.CpuIsa.int8_weight_qmax`).

    Returns:
        float32 ``[w.shape[axis]]``: positive scales (:data:`MIN_SCALE` for all-zero channels).
    """
    w = np.asarray(w, np.float32)
    reduce = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.max(np.abs(w), axis=reduce) if reduce else np.abs(w)
    return np.maximum(amax / np.float32(qmax), MIN_SCALE).astype(np.float32)


def quantize_weight(w: np.ndarray, scales: np.ndarray, axis: int, qmax: int = QMAX) -> np.ndarray:
    """int8 codes of ``w``: ``clip(round_half_even(w / scale), -qmax, qmax)`` per channel.

    This is ONNX ``QuantizeLinear``'s formula (opset 13 spec: ``saturate(round(x / y_scale) +
    y_zero_point)``, rounding half to even) with zero point 0, computed in float32 as ONNX does.

    Args:
        w: float32 weight; ``scales``: float32 ``[w.shape[axis]]``; ``axis``: the channel axis;
            ``qmax``: the largest code (as :func:`weight_scales`).

    Returns:
        int8 array of ``w``'s shape.
    """
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.rint(np.asarray(w, np.float32) / scales.reshape(shape).astype(np.float32))
    return np.clip(q, -qmax, qmax).astype(np.int8)


def activation_scale(samples: Sequence[np.ndarray], method: str,
                     percentile: float = 99.99) -> float:
    """Per-tensor symmetric scale of an activation from its calibration values.

    ``minmax``: ``max |x| / 127`` over all samples. ``percentile``: the ``percentile``-th percentile
    of ``|x|`` over all samples together, ``/ 127`` (clipping outliers; Wu et al. 2020, section 4.1,
    "percentile calibration", and ONNX Runtime's ``CalibrationMethod.Percentile``, which also uses
    ``|x|`` for symmetric ranges).

    Args:
        samples: the tensor's float values on each calibration feed (any shapes).
        method: ``minmax`` or ``percentile``.
        percentile: in (0, 100], for ``percentile``.

    Returns:
        The float32 scale as a Python float (:data:`MIN_SCALE` when every value is 0 or none is
        finite).
    """
    flat = [np.abs(np.asarray(s, np.float32)).ravel() for s in samples]
    flat = [f[np.isfinite(f)] for f in flat]
    values = np.concatenate(flat) if flat else np.zeros(0, np.float32)
    if values.size == 0:
        return float(MIN_SCALE)
    if method == "minmax":
        amax = float(values.max())
    elif method == "percentile":
        amax = float(np.percentile(values, percentile))
    else:
        raise ValueError(f"unknown calibration method {method!r}")
    return float(max(np.float32(amax) / np.float32(QMAX), MIN_SCALE))
