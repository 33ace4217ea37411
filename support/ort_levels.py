"""ONNX Runtime's graph optimization levels and the test "which levels run this model right",
shared by the emitter (``--emit 'onnxruntime{optimization_level=...}'``), the compile driver's
refusal messages and the budgeted passes' measurement.

ONNX Runtime's own graph optimizer has bugs that break valid models at its higher levels (its
(Simplified)LayerNormFusion dropping the rank a broadcast constant adds, a ReduceMean axis its
rewrite mishandles, "Failed to find node output or a constant initializer producing output" at
load); the same model at ``ORT_DISABLE_ALL`` runs as written. :func:`level_problem` tells such a
breakage from a run that is right, with the model's own ``ORT_DISABLE_ALL`` run as the reference.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from passctl.support.check import quiet_stdout

#: ONNX Runtime's graph optimization levels, highest first (``ORT_ENABLE_LAYOUT`` only where the
#: installed ONNX Runtime has it).
OPTIMIZATION_LEVELS = ("ORT_ENABLE_ALL", "ORT_ENABLE_LAYOUT", "ORT_ENABLE_EXTENDED",
                       "ORT_ENABLE_BASIC", "ORT_DISABLE_ALL")
#: The short names ``--emit 'onnxruntime{optimization_level=...}'`` takes (first: the canonical one).
SHORT_LEVELS = {"all": "ORT_ENABLE_ALL", "layout": "ORT_ENABLE_LAYOUT",
                "extended": "ORT_ENABLE_EXTENDED", "basic": "ORT_ENABLE_BASIC",
                "disable": "ORT_DISABLE_ALL", "disable_all": "ORT_DISABLE_ALL",
                "off": "ORT_DISABLE_ALL"}


def available_levels() -> Tuple[str, ...]:
    """:data:`OPTIMIZATION_LEVELS` that the installed ONNX Runtime has, highest first."""
    import onnxruntime as ort

    return tuple(n for n in OPTIMIZATION_LEVELS if hasattr(ort.GraphOptimizationLevel, n))


def short_level(level: str) -> str:
    """The short ``optimization_level`` name of an ``ORT_*`` level (``ORT_ENABLE_EXTENDED`` ->
    ``extended``)."""
    return next(k for k, v in SHORT_LEVELS.items() if v == level)


def emit_option(level: str) -> str:
    """``--emit 'onnxruntime{optimization_level=SHORT}'``: the option that ships at ``level``."""
    return f"--emit 'onnxruntime{{optimization_level={short_level(level)}}}'"


def lower_levels(level: str) -> Tuple[str, ...]:
    """The installed levels below ``level``, highest first (ending with ``ORT_DISABLE_ALL``)."""
    levels = available_levels()
    return levels[levels.index(level) + 1:] if level in levels else levels


def first_line(error: BaseException, limit: int = 200) -> str:
    """ONNX Runtime's error text as one short line (status prefix and C++ location dropped)."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", str(error)).strip()
    line = next((p.strip() for p in text.splitlines() if p.strip()), type(error).__name__)
    line = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", line)
    line = re.sub(r"^Load model from .*? failed:", "", line).strip()
    line = re.sub(r"Status Message: /?\S+\.(?:cc|h):\d+ [^(]*\([^)]*\)(?: const)? ", "Status "
                  "Message: ", line)
    return line if len(line) <= limit else line[:limit - 3] + "..."


def outputs_problem(got: Mapping[str, Any], want: Mapping[str, Any]) -> Optional[str]:
    """How the outputs ``got`` differ from ``want`` in what a runtime must not change: the set
    of outputs, each array's dtype and shape, and NaN/inf where ``want`` is finite; None when they
    agree (values are not compared: two optimization levels round differently)."""
    for name, ref in want.items():
        arr = got.get(name)
        if arr is None:
            return f"output '{name}' is missing"
        if not isinstance(ref, np.ndarray) or not isinstance(arr, np.ndarray):
            continue
        if arr.dtype != ref.dtype:
            return f"output '{name}' has dtype {arr.dtype.name} where {ref.dtype.name} is right"
        if arr.shape != ref.shape:
            return f"output '{name}' has shape {list(arr.shape)} where {list(ref.shape)} is right"
        if arr.dtype.kind in "fc":
            bad = np.isfinite(ref) & ~np.isfinite(arr)
            if bad.any():
                return (f"output '{name}' is NaN or infinite at {int(bad.sum())} of {arr.size} "
                        "positions where it is finite unoptimized")
    return None


LEVEL_RTOL = 1e-3
"""How far (relative to an output's max magnitude) a float32 output of a model at a higher ONNX
Runtime level may be from the same model's ``ORT_DISABLE_ALL`` run, beyond what the unoptimized
run itself is off the float64 evaluation, before :func:`values_problem` calls it broken: 100
times the 1e-5 of a float32 rewrite, above what fused kernels and other summation orders change
(about 1e-6), far below the breakages seen (ONNX Runtime 1.2x's LayerNorm fusion of a
rank-raising, keepdims=0 spelling: 0.23 to 0.55, fuzz seed cleanup:7016)."""


def values_problem(got: Mapping[str, Any], want: Mapping[str, Any],
                   exact: Optional[Mapping[str, Any]] = None,
                   rtol: float = LEVEL_RTOL) -> Optional[str]:
    """Which float32 output of ``got`` (a model at some optimization level) is off its
    unoptimized run ``want`` by more than ``rtol`` of ``max |want|`` (over the positions finite
    in both), or None. With ``exact`` (the model's float64 evaluation on the same inputs,
    :func:`passctl.support.exact.float64_outputs`), only where it is also more than ``rtol``
    further from the float64 answer than ``want`` is
    (:func:`passctl.support.exact.rounding_excess`):
    an ill-conditioned output whose float32 rounding alone spreads that far is not broken.
    Outputs of other dtypes or shapes are left to :func:`outputs_problem`."""
    for name, ref in want.items():
        arr = got.get(name)
        if not (isinstance(ref, np.ndarray) and isinstance(arr, np.ndarray)
                and ref.dtype == np.float32 and arr.dtype == np.float32
                and ref.shape == arr.shape):
            continue
        fin = np.isfinite(ref) & np.isfinite(arr)
        if not fin.any():
            continue
        r, a = ref[fin].astype(np.float64), arr[fin].astype(np.float64)
        scale = max(float(np.abs(r).max()), 1e-30)
        err = float(np.abs(a - r).max())
        if err <= rtol * scale or err <= 2.4e-7:
            continue
        e = None if exact is None else exact.get(name)
        if isinstance(e, np.ndarray) and e.shape == ref.shape:
            from passctl.support.exact import rounding_excess

            if rounding_excess(ref, arr, e) <= rtol:
                continue
        return (f"output '{name}' is off its unoptimized run by max-rel {err / scale:.3g} "
                f"(more than the {rtol:g} that other kernels and summation orders explain"
                + ("; the float64 evaluation agrees with the unoptimized run" if e is not None
                   else "") + ")")
    return None


def level_problem(run: Callable[[str], Mapping[str, Any]], level: str,
                  want: Mapping[str, Any],
                  exact: Optional[Mapping[str, Any]] = None) -> Optional[str]:
    """Why ``run(level)`` (a model run at ONNX Runtime optimization ``level``) is not right
    against ``want`` (its ``ORT_DISABLE_ALL`` outputs on the same inputs): it fails to load or
    run (ONNX Runtime's message), or :func:`outputs_problem`; with ``exact`` (the model's float64
    evaluation on the same inputs), also :func:`values_problem`; None when it is right."""
    try:
        got = run(level)
    except Exception as e:  # noqa: BLE001  (ORT's Fail, InvalidGraph, RuntimeException, ...)
        return f"fails ({first_line(e)})"
    return outputs_problem(got, want) or (values_problem(got, want, exact)
                                          if exact is not None else None)


def highest_right_level(run: Callable[[str], Mapping[str, Any]], below: str,
                        want: Mapping[str, Any],
                        judge: Optional[Callable[[str], bool]] = None,
                        exact: Optional[Mapping[str, Any]] = None) -> Optional[str]:
    """The highest installed level below ``below`` at which ``run`` is right against ``want``
    (:func:`level_problem`, with ``exact`` when given) and ``judge(level)`` (when given) holds;
    None when none is."""
    for level in lower_levels(below):
        if level_problem(run, level, want, exact) is None and (judge is None or judge(level)):
            return level
    return None




def runs_with(model: Any, inputs: Dict[str, Any]) -> Callable[[str], Dict[str, Any]]:
    """``run(level)`` for :func:`level_problem`: ``model`` (a path, bytes or ModelProto) run once
    on ``inputs`` in ONNX Runtime's CPU provider at ``level`` (:func:`quiet_stdout`)."""
    from passctl.support.check import run_onnxruntime

    def run(level: str) -> Dict[str, Any]:
        with quiet_stdout():
            return run_onnxruntime(model, inputs, optimize=level)

    return run


__all__: Sequence[str] = ("LEVEL_RTOL", "OPTIMIZATION_LEVELS", "SHORT_LEVELS", "available_levels",
                          "emit_option", "first_line", "highest_right_level", "level_problem",
                          "lower_levels", "outputs_problem", "runs_with",
                          "short_level", "values_problem")
