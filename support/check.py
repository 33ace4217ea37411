"""The one numeric check: run reference and candidate in ONNX Runtime, compare every output."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
import onnx

from passctl.ir.errors import UserError
from passctl.support.inputs import make_inputs

logger = logging.getLogger(__name__)

__all__ = ["CheckResult", "OutputDiff", "ARTIFACT_OPTIMIZATION", "DEFAULT_RTOL", "METRICS", "REL_FLOOR",
           "RUN_MAX_WEIGHT_BYTES", "run_weight_limit",
           "check_models", "check_optimization", "compare", "make_inputs", "outputs_error",
           "quiet_stdout", "run_onnxruntime", "uninformative_outputs"]

DEFAULT_RTOL = 1e-4
"""Default bound on :attr:`OutputDiff.max_rel` for float32 graph rewrites."""

REL_FLOOR = 1e-12
"""Smallest denominator of :attr:`OutputDiff.max_rel` (for all-zero reference outputs)."""

METRICS = ("max-rel", "mean-rel", "cosine")
"""Error metrics a check can bound (:meth:`OutputDiff.error`); the amp and quantize passes' ``metric``
option names the same ones."""

ARTIFACT_OPTIMIZATION = "ORT_ENABLE_ALL"
"""The ``graph_optimization_level`` an ONNX Runtime artifact's ``session.json`` ships with (written
by the ``onnxruntime`` emitter), the level the numeric check runs that artifact at."""

_PROTOBUF_LIMIT = 2**31 - 1

RUN_MAX_WEIGHT_BYTES = 2 << 30
"""Default of :func:`run_weight_limit`: above 2 GiB of weights, ``passctl compile`` runs neither its
load check nor its verify run in ONNX Runtime (a CPU session holds about twice a model's weights:
2.65 GB RSS for a 1.33 GB fp16 Llama, and verify opens the original and the artifact; a 7B
decoder's 13.5 GB would need ~30 GB)."""

RUN_LIMIT_ENV = "PASSCTL_RUN_MAX_WEIGHT_BYTES"


def run_weight_limit() -> int:
    """Largest model (bytes of weights) that compile's own ONNX Runtime runs (the emitter's load
    check, the verify run) open: ``$PASSCTL_RUN_MAX_WEIGHT_BYTES`` if set, else
    :data:`RUN_MAX_WEIGHT_BYTES`.

    Raises:
        UserError: the variable is not a non-negative integer.
    """
    text = os.environ.get(RUN_LIMIT_ENV, "").strip()
    if not text:
        return RUN_MAX_WEIGHT_BYTES
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise UserError(f"{RUN_LIMIT_ENV}={text!r}: give a number of bytes (e.g. 2147483648)")
    return value
ModelLike = Union[str, "os.PathLike[str]", bytes, onnx.ModelProto]


def check_optimization(emitter: str) -> str:
    """The ONNX Runtime graph optimization level at which the numeric check (``--check``) runs the
    artifact of ``emitter``, so that a pass measuring an error budget can measure what is checked:
    :data:`ARTIFACT_OPTIMIZATION` for ``onnxruntime`` (``session.json``) and ``""`` (no emitter
    given: every target profile's default emitter is ``onnxruntime``); ``ORT_DISABLE_ALL`` for
    the others (a TensorRT artifact's ``model.onnx`` is checked as written, TensorRT parses it
    so; a TVM library does not run in ONNX Runtime, the graph as written is the nearest)."""
    return ARTIFACT_OPTIMIZATION if emitter in ("", "onnxruntime") else "ORT_DISABLE_ALL"


def cpu_session(model: Union[str, bytes], optimize: Union[bool, str] = False,
                threads: Optional[int] = None,
                sequential: bool = False, profile_prefix: Optional[str] = None,
                external_initializers: Optional[Mapping[str, Any]] = None,
                spinning: Optional[bool] = None):
    """An ``onnxruntime.InferenceSession`` on the CPU execution provider, the one place passctl's
    checks and benchmarks set session options.

    Args:
        model: path of an ``.onnx`` file or serialized model bytes.
        optimize: ``ORT_ENABLE_ALL`` when true, else ``ORT_DISABLE_ALL``; or an
            ``onnxruntime.GraphOptimizationLevel`` name such as ``"ORT_ENABLE_EXTENDED"`` (an
            artifact's ``session.json`` ``graph_optimization_level``).
        threads: ``intra_op_num_threads`` (``None``: ONNX Runtime's default).
        sequential: one inter-op thread and ``ORT_SEQUENTIAL`` execution (for latency benchmarks).
        profile_prefix: turn on ONNX Runtime's profiler, writing ``<prefix>_<date>.json``.
        external_initializers: ``{initializer name: onnxruntime.OrtValue}`` for initializers that
            ``model`` marks as external data (``data_location = EXTERNAL``): ONNX Runtime takes their
            data from these values instead of a file (``SessionOptions.add_external_initializers``),
            so large weights need not be serialized into ``model``.
        spinning: ``session.intra_op.allow_spinning``: ``False`` lets the intra-op worker threads
            sleep between kernels instead of spin-waiting (faster on a loaded machine, see
            benchmarks/results/quantize_dynamic-2026-12-07.md); ``None``: ONNX Runtime's default
            (spinning).

    Raises:
        onnxruntime.capi.onnxruntime_pybind11_state.Fail (and its siblings): the model does not load.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    if isinstance(optimize, str):
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, optimize)
    else:
        options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                            else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    options.log_severity_level = 4  # fatal only: a failed run raises with the same message
    if threads is not None:
        options.intra_op_num_threads = threads
    if sequential:
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if spinning is not None:
        options.add_session_config_entry("session.intra_op.allow_spinning",
                                         "1" if spinning else "0")
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    if external_initializers:
        options.add_external_initializers(list(external_initializers),
                                          list(external_initializers.values()))
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def run_onnxruntime(model: ModelLike, inputs: Mapping[str, np.ndarray],
                    optimize: Union[bool, str] = False,
                    threads: Optional[int] = None) -> Dict[str, Any]:
    """Run ``model`` once on ONNX Runtime's CPU execution provider.

    Reference runs keep ``optimize=False`` (``ORT_DISABLE_ALL``), so ONNX Runtime's own graph rewrites
    cannot hide or cause a difference.

    Args:
        model: Path of an ``.onnx`` file (``str`` or ``os.PathLike``; external data next to it is
            found), serialized bytes, or an ``onnx.ModelProto`` (serialized here; must be under 2 GB
            with its weights in memory).
        inputs: ``{input name: array}``; every graph input must be present, no other names.
        optimize: ``True`` uses ``ORT_ENABLE_ALL`` instead of ``ORT_DISABLE_ALL``; a string names
            the ``onnxruntime.GraphOptimizationLevel`` (as :func:`cpu_session`).
        threads: ``intra_op_num_threads`` (``None``: ONNX Runtime's default).

    Returns:
        ``{output name: value}`` in graph-output order; tensors are numpy arrays.

    Raises:
        UserError: A ``ModelProto`` over 2 GB, or input names that do not match the graph inputs.
        onnxruntime.capi.onnxruntime_pybind11_state.Fail (and its siblings): the model does not load
            or run in ONNX Runtime.
    """
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if isinstance(model, onnx.ModelProto):
        if model.ByteSize() > _PROTOBUF_LIMIT:
            raise UserError(f"model graph '{model.graph.name}' is over 2 GB in memory; save it with "
                            "external data and pass the path instead")
        model = model.SerializeToString()
    session = cpu_session(model, optimize=optimize, threads=threads)
    expected = {arg.name for arg in session.get_inputs()}
    missing, extra = sorted(expected - set(inputs)), sorted(set(inputs) - expected)
    if missing or extra:
        where = model if isinstance(model, str) else "model"
        raise UserError(f"{where}: inputs do not match the graph inputs (missing {missing}, "
                        f"unknown {extra}); build them with make_inputs(model)")
    names = [arg.name for arg in session.get_outputs()]
    values = session.run(names, {name: inputs[name] for name in expected})
    return dict(zip(names, values))


@dataclass
class OutputDiff:
    """How one candidate output differs from the reference output of the same name.

    Both arrays are compared in float64. Positions where both values are the same non-finite value
    (NaN and NaN, or the same infinity) count as equal; positions where only one is NaN or the
    infinities differ are counted in ``nonfinite_mismatch``; the finite pairs give:

    - ``max_abs = max |ref - cand|``
    - ``max_rel = max_abs / max(max |ref|, REL_FLOOR)``: the largest error relative to the output's
      largest reference magnitude (not element by element), so near-zero elements do not blow it up and
      outputs of magnitude 1e15 are judged by their scale.
    - ``cosine = <ref, cand> / (|ref| |cand|)`` (1.0 when both are all zero, 0.0 when only one is),
      computed after dividing both by their largest magnitude so it cannot overflow.
    - ``mean_rel = sum |ref - cand| / max(sum |ref|, REL_FLOOR)``: the error relative to the output's
      total magnitude (the ``mean-rel`` metric of the amp and quantize passes' budgets).

    :meth:`error` gives the value of one of :data:`METRICS` (``cosine`` as ``1 - cosine``).

    ``problem`` names a mismatch that fails the check whatever the tolerance: a missing output, a
    different shape or dtype.
    """

    name: str
    max_abs: float
    max_rel: float
    cosine: float
    nonfinite_mismatch: int = 0
    shape: tuple = ()
    dtype: str = ""
    problem: Optional[str] = None
    mean_rel: float = 0.0

    def error(self, metric: str = "max-rel") -> float:
        """The error under ``metric`` (one of :data:`METRICS`): ``max_rel``, ``mean_rel`` or
        ``1 - cosine``."""
        return {"max-rel": self.max_rel, "mean-rel": self.mean_rel,
                "cosine": 1.0 - self.cosine}[metric]

    def ok(self, rtol: float = DEFAULT_RTOL, atol: float = 0.0, metric: str = "max-rel") -> bool:
        """``True`` when there is no ``problem``, no non-finite mismatch and the ``metric`` error
        is at most ``rtol`` or ``max_abs <= atol`` (a floor for outputs whose values are all near
        zero)."""
        return (self.problem is None and self.nonfinite_mismatch == 0
                and (self.error(metric) <= rtol or self.max_abs <= atol))

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready fields (for ``report.json``); infinities and NaN become strings."""
        def number(x: float) -> Any:
            return x if math.isfinite(x) else str(x)
        return {"name": self.name, "max_abs": number(self.max_abs), "max_rel": number(self.max_rel),
                "mean_rel": number(self.mean_rel),
                "cosine": number(self.cosine), "nonfinite_mismatch": self.nonfinite_mismatch,
                "shape": list(self.shape), "dtype": self.dtype, "problem": self.problem}


@dataclass
class CheckResult:
    """Per-output differences of a candidate against a reference; ``extra`` lists candidate outputs
    the reference does not have (a changed interface, which fails the check)."""

    outputs: Dict[str, OutputDiff] = field(default_factory=dict)
    extra: List[str] = field(default_factory=list)

    def ok(self, rtol: float = DEFAULT_RTOL, atol: float = 0.0, metric: str = "max-rel") -> bool:
        """``True`` when every output is :meth:`OutputDiff.ok` and there are no extra outputs."""
        return not self.extra and all(diff.ok(rtol, atol, metric) for diff in self.outputs.values())

    @property
    def max_rel(self) -> float:
        """The worst ``max_rel`` over all outputs (``inf`` when an output has a problem)."""
        worst = 0.0
        for diff in self.outputs.values():
            bad = diff.problem is not None or diff.nonfinite_mismatch
            worst = max(worst, math.inf if bad else diff.max_rel)
        return worst

    def failures(self, rtol: float = DEFAULT_RTOL, atol: float = 0.0,
                 metric: str = "max-rel") -> List[str]:
        """One line per failing output, e.g. ``"logits: max_rel 3.1e-02 > 1e-04"``."""
        lines = [f"{name}: extra output not in the reference" for name in self.extra]
        for diff in self.outputs.values():
            if diff.problem is not None:
                lines.append(f"{diff.name}: {diff.problem}")
            elif diff.nonfinite_mismatch:
                lines.append(f"{diff.name}: {diff.nonfinite_mismatch} NaN/inf positions differ")
            elif not diff.ok(rtol, atol, metric):
                lines.append(f"{diff.name}: {metric.replace('-', '_')} {diff.error(metric):.3g} > "
                             f"{rtol:g} (max_abs {diff.max_abs:.3g}, cosine {diff.cosine:.6f})")
        return lines

    def to_dict(self, rtol: float = DEFAULT_RTOL, metric: str = "max-rel") -> Dict[str, Any]:
        """JSON-ready summary: ``ok``, ``rtol``, ``metric``, ``extra`` and one entry per output."""
        return {"ok": self.ok(rtol, metric=metric), "rtol": rtol, "metric": metric,
                "extra": list(self.extra),
                "outputs": [diff.to_dict() for diff in self.outputs.values()]}


def _diff_one(name: str, ref: Any, cand: Any) -> OutputDiff:
    ref, cand = np.asarray(ref), np.asarray(cand)
    shape, dtype = tuple(ref.shape), str(ref.dtype)
    if ref.shape != cand.shape:
        return OutputDiff(name, math.inf, math.inf, math.nan, 0, shape, dtype,
                          f"shape {list(cand.shape)} differs from the reference {list(ref.shape)}",
                          math.inf)
    problem = None
    if ref.dtype != cand.dtype:
        problem = f"dtype {cand.dtype} differs from the reference {ref.dtype}"
    if np.issubdtype(ref.dtype, np.complexfloating) or np.issubdtype(cand.dtype, np.complexfloating):
        a, b = ref.astype(np.complex128).ravel(), cand.astype(np.complex128).ravel()
    else:
        a, b = ref.astype(np.float64).ravel(), cand.astype(np.float64).ravel()
    finite_a, finite_b = np.isfinite(a), np.isfinite(b)
    both_finite = finite_a & finite_b
    same_nonfinite = ~finite_a & ~finite_b & ((np.isnan(a) & np.isnan(b)) | (a == b))
    nonfinite_mismatch = int(np.count_nonzero(~both_finite & ~same_nonfinite))
    a, b = a[both_finite], b[both_finite]
    if a.size == 0:
        return OutputDiff(name, 0.0, 0.0, 1.0, nonfinite_mismatch, shape, dtype, problem)
    mean_rel = float(np.sum(np.abs(a - b)) / max(float(np.sum(np.abs(a))), REL_FLOOR))
    max_abs = float(np.max(np.abs(a - b)))
    scale_ref = float(np.max(np.abs(a)))
    max_rel = max_abs / max(scale_ref, REL_FLOOR)
    scale = max(scale_ref, float(np.max(np.abs(b))))
    if scale == 0.0:
        cosine = 1.0
    else:
        a_n, b_n = a / scale, b / scale
        norm = float(np.linalg.norm(a_n)) * float(np.linalg.norm(b_n))
        cosine = float(np.real(np.vdot(a_n, b_n)) / norm) if norm > 0.0 else 0.0
    return OutputDiff(name, max_abs, max_rel, cosine, nonfinite_mismatch, shape, dtype, problem,
                      mean_rel)


def compare(reference: Mapping[str, Any], candidate: Mapping[str, Any]) -> CheckResult:
    """Compare candidate outputs with reference outputs, name by name (formulas in :class:`OutputDiff`).

    Args:
        reference: ``{output name: array}`` of the reference run.
        candidate: ``{output name: array}`` of the candidate run.

    Returns:
        A :class:`CheckResult` with one :class:`OutputDiff` per reference output, in reference order;
        outputs missing from ``candidate`` get ``problem="missing in the candidate"``.
    """
    result = CheckResult()
    for name, ref in reference.items():
        if name not in candidate:
            result.outputs[name] = OutputDiff(name, math.inf, math.inf, math.nan,
                                              problem="missing in the candidate")
            continue
        result.outputs[name] = _diff_one(name, ref, candidate[name])
    result.extra = [name for name in candidate if name not in reference]
    return result


def outputs_error(reference: Sequence[Mapping[str, Any]], candidate: Sequence[Mapping[str, Any]],
                  metric: str) -> float:
    """The check's verdict as one number: the worst :meth:`OutputDiff.error` under ``metric`` (one
    of :data:`METRICS`) over the outputs of every run (``reference[k]`` against ``candidate[k]``,
    compared by :func:`compare`), and ``inf`` wherever the check would fail whatever the bound: a
    NaN/inf position that differs (in either direction: a NaN of the reference that became
    finite counts), a missing output, a different shape or dtype. The amp and quantize passes
    measure their budgets with it, so a budget they meet is one ``--check`` accepts on the same
    inputs. Non-numeric outputs (strings) are not compared.

    Returns:
        0.0 for no runs or no numeric outputs.
    """
    worst = 0.0
    for ref_run, cand_run in zip(reference, candidate):
        numeric = {k: v for k, v in ref_run.items() if np.asarray(v).dtype.kind in "biufc"}
        result = compare(numeric, {k: v for k, v in cand_run.items() if k in numeric})
        for diff in result.outputs.values():
            if diff.problem is not None or diff.nonfinite_mismatch:
                return math.inf
            err = diff.error(metric)
            if not math.isfinite(err):  # NaN (cosine of overflowing values): never within a bound
                return math.inf
            worst = max(worst, float(err))
    return worst


def uninformative_outputs(reference: Mapping[str, Any], atol: float = 0.0) -> Dict[str, str]:
    """Reference outputs on which a numeric check can hardly fail, with why.

    An output is uninformative when some of its values are NaN or infinite (those positions only
    have to be equally non-finite), when no finite value exceeds ``atol`` in magnitude (any
    candidate within ``atol`` of zero passes; all zero in particular), or when it has more than one
    value and all are equal (a constant says nothing about the computation). Non-numeric outputs
    (strings, sequences) are not judged.

    Args:
        reference: ``{output name: array}`` of the reference (original model) run.
        atol: the check's absolute tolerance.

    Returns:
        ``{output name: reason}``, e.g. ``{"prob": "has no value above atol (max |value| 6e-08 <=
        2.4e-07)"}``, in output order; empty when every output is informative.
    """
    reasons: Dict[str, str] = {}
    for name, value in reference.items():
        array = np.asarray(value)
        if array.dtype.kind not in "biufc" or array.size == 0:
            continue
        values = array.astype(np.complex128 if array.dtype.kind == "c" else np.float64).ravel()
        finite = np.isfinite(values)
        if not finite.all():
            count = int(values.size - np.count_nonzero(finite))
            reasons[name] = f"is NaN/inf at {count} of {values.size} values"
            continue
        largest = float(np.max(np.abs(values)))
        if largest == 0.0:
            reasons[name] = "is all zero"
        elif largest <= atol:
            reasons[name] = f"has no value above atol (max |value| {largest:.3g} <= {atol:g})"
        elif values.size > 1 and np.all(values == values[0]):
            first = values[0].real if array.dtype.kind != "c" else values[0]
            reasons[name] = f"is constant (every value is {first:g})"
    return reasons


def check_models(reference: ModelLike, candidate: ModelLike,
                 inputs: Optional[Mapping[str, np.ndarray]] = None, rtol: float = DEFAULT_RTOL,
                 seed: int = 0, optimize_candidate: bool = False) -> CheckResult:
    """Run ``reference`` and ``candidate`` in ONNX Runtime on the same inputs and compare the outputs.

    Args:
        reference: The original model (path, bytes or ``ModelProto``), run with ``ORT_DISABLE_ALL``.
        candidate: The rewritten model, run with ``ORT_DISABLE_ALL`` unless ``optimize_candidate``.
        inputs: ``{input name: array}``; ``None`` builds them with ``make_inputs(reference, seed)``
            (``reference`` must then be a path or a ``ModelProto``).
        rtol: Bound on ``max_rel`` used for the log line; call ``result.ok(rtol)`` to decide.
        seed: Seed for :func:`make_inputs` when ``inputs`` is ``None``.
        optimize_candidate: Run the candidate with ``ORT_ENABLE_ALL``.

    Returns:
        The :class:`CheckResult` (``result.ok(rtol)`` tells whether it passes).

    Raises:
        UserError: As :func:`run_onnxruntime` and :func:`make_inputs`.
    """
    if inputs is None:
        if isinstance(reference, bytes):
            reference = onnx.load_from_string(reference)
        inputs = make_inputs(reference, seed=seed)
    ref_outputs = run_onnxruntime(reference, inputs)
    cand_outputs = run_onnxruntime(candidate, inputs, optimize=optimize_candidate)
    result = compare(ref_outputs, cand_outputs)
    if result.ok(rtol):
        logger.info("check passed: max_rel %.3g <= %g", result.max_rel, rtol)
    else:
        logger.warning("check failed: %s", "; ".join(result.failures(rtol)))
    return result


def quiet_stdout():
    """A context that swallows what ONNX Runtime's Python wrapper prints to stdout when a session
    fails to load (``*** EP Error ***`` and "Falling back to ... and retrying", before it raises
    the same error again): passctl reports the error itself, in one line."""
    import contextlib
    import io

    return contextlib.redirect_stdout(io.StringIO())
