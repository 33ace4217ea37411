"""Printing float constants with any bit pattern (NaN payloads) warns nothing (H17)."""

from __future__ import annotations

import warnings

import numpy as np

from passctl.ir import DataType
from passctl.ir._text_common import format_scalars


def test_any_float_bit_pattern_formats_without_runtime_warnings():
    rng = np.random.default_rng(0)
    checked = 0
    for dtype in DataType:
        if not dtype.is_floating:
            continue
        try:
            np_dtype = np.dtype(dtype.numpy())
        except Exception:  # a dtype numpy cannot hold (no ml_dtypes counterpart)
            continue
        if np_dtype.itemsize == 0 or np_dtype.kind == "V" and np_dtype.itemsize > 8:
            continue
        if np_dtype.itemsize == 1:
            raw = np.arange(256, dtype=np.uint8).tobytes()
        else:
            raw = rng.integers(0, 256, 512 * np_dtype.itemsize, dtype=np.uint8).tobytes()
        flat = np.frombuffer(raw, dtype=np_dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            texts = format_scalars(flat, dtype)
        if dtype == DataType.BFLOAT16:  # NaN payloads are not dense text: hex instead
            assert texts is None
        checked += 1
    assert checked >= 4
