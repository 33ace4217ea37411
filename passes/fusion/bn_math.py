"""BatchNormalization folding arithmetic, shared by fuse-conv-bn and structural re-parameterization."""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np


def bn_scale_shift(scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray,
                   epsilon: float) -> Tuple[np.ndarray, np.ndarray]:
    """BatchNormalization (inference) as a per-channel affine map ``y = s * x + t``.

    From the ONNX BatchNormalization spec, ``y = (x - mean) / sqrt(var + epsilon) * scale + B``, so
    ``s = scale / sqrt(var + epsilon)`` and ``t = B - mean * s``.

    Args:
        scale, bias, mean, var: the BN's ``scale`` (gamma), ``B`` (beta), ``input_mean`` and
            ``input_var``, each of shape ``[C]``.
        epsilon: the BN's own ``epsilon`` attribute.

    Returns:
        ``(s, t)``, each float64 of shape ``[C]``.
    """
    s = np.asarray(scale, np.float64) / np.sqrt(np.asarray(var, np.float64) + float(epsilon))
    t = np.asarray(bias, np.float64) - np.asarray(mean, np.float64) * s
    return s, t


def fold_bn_into_conv_weights(weight: np.ndarray, conv_bias: Optional[np.ndarray],
                              scale: np.ndarray, bias: np.ndarray, mean: np.ndarray,
                              var: np.ndarray, epsilon: float, transpose: bool = False,
                              group: int = 1) -> Tuple[np.ndarray, np.ndarray]:
    """Fold an inference BatchNormalization into the Conv / ConvTranspose that feeds it.

    Standard folding derivation: the BN is ``y[o] = s[o] * z[o] + t[o]`` per output channel ``o``
    (see :func:`bn_scale_shift`) and the convolution is linear in its weight, so
    ``W'[o] = W[o] * s[o]`` and ``b'[o] = (b[o] - mean[o]) * s[o] + B[o]`` (``b = 0`` without a
    Conv bias).

    Weight layouts (ONNX Conv / ConvTranspose specs):
      - Conv: ``[C_out, C_in/group, k...]``; output channel ``o`` is ``W[o]``.
      - ConvTranspose: ``[C_in, C_out/group, k...]``; output channel ``o = g*(C_out/group) + j``
        is ``W[g*(C_in/group):(g+1)*(C_in/group), j]``.

    Args:
        weight: the convolution weight (float dtype), layout as above.
        conv_bias: the convolution bias ``[C_out]`` or None.
        scale, bias, mean, var: the BN parameters, each ``[C_out]``.
        epsilon: the BN's ``epsilon``.
        transpose: True for ConvTranspose.
        group: the convolution's ``group`` attribute.

    Returns:
        ``(new_weight, new_bias)`` in ``weight``'s dtype; new arrays (the inputs are not changed).

    Raises:
        ValueError: the channel counts of the weight, group and BN parameters do not agree.
    """
    s, t = bn_scale_shift(scale, bias, mean, var, epsilon)
    return fold_scale_shift_into_conv_weights(weight, conv_bias, s, t, transpose=transpose, group=group)


def fold_scale_shift_into_conv_weights(weight: np.ndarray, conv_bias: Optional[np.ndarray],
                                       s: np.ndarray, t: np.ndarray, transpose: bool = False,
                                       group: int = 1) -> Tuple[np.ndarray, np.ndarray]:
    """Fold a per-output-channel affine map ``y[o] = s[o] * z[o] + t[o]`` into the convolution ``z``.

    The one single-branch fold shared by ``fuse-conv-bn`` (an inference BatchNormalization is such a
    map, :func:`bn_scale_shift`) and ``reparam-branches`` (BatchNormalization and per-channel
    ``Mul`` / ``Add`` / ``Sub`` / ``Div`` constants). The convolution is linear in its weight, so
    ``W'[o] = W[o] * s[o]`` and ``b'[o] = b[o] * s[o] + t[o]`` (``b = 0`` without a bias).

    Args:
        weight: the convolution weight (float dtype); Conv ``[C_out, C_in/group, k...]`` or
            ConvTranspose ``[C_in, C_out/group, k...]`` (ONNX Conv / ConvTranspose specs).
        conv_bias: the convolution bias ``[C_out]`` or None.
        s, t: the scale and shift, each ``[C_out]`` (any float dtype; computed in float64).
        transpose: True for ConvTranspose.
        group: the convolution's ``group`` attribute.

    Returns:
        ``(new_weight, new_bias)`` in ``weight``'s dtype; new arrays (the inputs are not changed).

    Raises:
        ValueError: the channel counts of the weight, group and ``s`` / ``t`` do not agree.
    """
    w = np.asarray(weight)
    if w.ndim < 2:
        raise ValueError(f"convolution weight must have rank >= 2, got shape {w.shape}")
    c_out = w.shape[1] * group if transpose else w.shape[0]
    s = np.asarray(s, np.float64).reshape(-1)
    t = np.asarray(t, np.float64).reshape(-1)
    if s.shape != (c_out,) or t.shape != (c_out,):
        raise ValueError(f"the per-channel scale has {s.shape} and the shift {t.shape} parameters but "
                         f"the convolution has {c_out} output channels")
    w64 = w.astype(np.float64)
    if transpose:
        c_in = w.shape[0]
        if c_in % group:
            raise ValueError(f"ConvTranspose weight has {c_in} input channels, not divisible by "
                             f"group={group}")
        grouped = w64.reshape((group, c_in // group, w.shape[1]) + w.shape[2:])
        factor = s.reshape((group, 1, w.shape[1]) + (1,) * (w.ndim - 2))
        new_w = (grouped * factor).reshape(w.shape)
    else:
        new_w = w64 * s.reshape((c_out,) + (1,) * (w.ndim - 1))
    b = np.zeros(c_out) if conv_bias is None else np.asarray(conv_bias, np.float64).reshape(-1)
    new_b = b * s + t
    return new_w.astype(w.dtype), new_b.astype(w.dtype)
