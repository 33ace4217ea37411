"""The numeric check of ``passctl compile`` (``--check``): its bounds, its inputs, running the
original and the artifact, and judging the outputs for ``report.json``."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from passctl.ir.errors import UserError
from passctl.support.context import CheckBound
from passctl.support.errors import one_line


def check_bounds(rtol: Optional[float], flat) -> List[CheckBound]:
    """The bounds the numeric check (``--check``, ``--check-each``) applies, the one place the
    check's metric and tolerance are decided.

    With ``--rtol`` (``rtol``), ``[CheckBound("max-rel", rtol, "--rtol")]``; else one bound per
    metric of the pipeline's passes that declare an error budget
    (:meth:`passctl.passes.base.Pass.error_budget`: amp's ``mixed-precision``, ``quantize-int8``;
    ``flat``: the passes, fixpoint groups flattened), that metric bounded by the pass's budget
    whatever its size (the largest budget when several passes share a metric; their outputs are
    meant to differ that much, measured the way the pass measured them), in pipeline order;
    without such a pass ``[CheckBound("max-rel", DEFAULT_RTOL, "default")]``
    (:data:`passctl.support.check.DEFAULT_RTOL`).
    """
    from passctl.support.check import DEFAULT_RTOL

    if rtol is not None:
        return [CheckBound("max-rel", float(rtol), "--rtol")]
    bounds: Dict[str, CheckBound] = {}
    for p in flat:
        budget = p.error_budget()
        if budget is None:
            continue
        metric, value, label = budget
        if metric not in bounds or float(value) > bounds[metric].rtol:
            bounds[metric] = CheckBound(metric, float(value), p.name, label)
    return list(bounds.values()) or [CheckBound("max-rel", DEFAULT_RTOL, "default")]


def calibration_feed(rtol: Optional[float], flat, console, quiet: bool) -> Optional[str]:
    """Where the check should run without ``--inputs``: without ``--rtol``, the first calibration
    feed of the first budget pass (:meth:`passctl.passes.base.Pass.error_budget`) that has
    ``calib=DIR``. The check then bounds that pass's budget where it holds, on its calibration
    feeds, not on seeded random data (PP-OCRv4 det int8 with real text images: mean-rel 0.018 on
    them, 7.7 on uniform noise, whose outputs are near zero). Says so unless ``quiet``.

    Returns:
        the ``.npz`` path, or None (random inputs).
    """
    if rtol is not None:
        return None
    for p in flat:
        calib = getattr(p.options, "calib", "") if p.error_budget() is not None else ""
        feeds = sorted(f for f in os.listdir(calib) if f.endswith(".npz")) \
            if calib and os.path.isdir(calib) else []
        if feeds:  # (a folder without feeds is the pass's error, with its own message)
            path = os.path.join(calib, feeds[0])
            if not quiet:
                console.print(f"note: the check runs on {p.name}'s calibration feed {path}, where "
                              "its budget holds (give --inputs for another)", markup=False,
                              highlight=False)
            return path
    return None


def bounds_note(bounds: List[CheckBound]) -> Optional[str]:
    """The note that says which pass budgets the check applies (None when none does)."""
    if not any(b.label for b in bounds):
        return None
    if len(bounds) == 1:
        said = f"{bounds[0].metric} error {bounds[0].rtol:g}, the {bounds[0].label} pass's budget " \
               "under its metric"
    else:
        said = " and ".join(f"{b.metric} error {b.rtol:g} (the {b.label} pass's budget)"
                            for b in bounds)
    return f"note: the check accepts {said} (give --rtol for a max-rel bound)"


def failure_message(check: Dict[str, Any], bounds: List[CheckBound]) -> str:
    """The one-line message of a failed check (``check``: its report entry)."""
    failures = check["failures"]
    more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
    failed = next((b for b in check["bounds"] if not b["ok"]), check["bounds"][0])
    labels = {b.source: b.label for b in bounds}
    bound = (f"--rtol (now {failed['rtol']:g}) or --atol"
             if failed["source"] in ("--rtol", "default") else
             f"the {labels.get(failed['source'], failed['source'])} pass's budget (now "
             f"{failed['metric']} {failed['rtol']:g}; calibrate at the sizes you "
             "check, or give --rtol)")
    return (f"numeric check failed: output {failures[0]}{more}; loosen {bound}, or find the pass "
            "responsible with --check-each; the candidate and report.json are kept in the "
            "reproducer")


def check_inputs(header, dims: Dict[str, int], overrides: Dict[str, Any],
                  checking: bool) -> None:
    """Check ``--dim`` names and ``--inputs`` arrays against the model's graph inputs up front
    (before any pass runs); with ``checking`` (``--check`` or ``--check-each``) also resolve every
    input's shape, so sizes that do not fit in memory fail now. ``header``: the original model's
    :func:`passctl.support.inputs.load_header` (``None`` when none of these options is given).

    Raises:
        UserError: a ``--dim`` name matches no symbolic dimension, an array names no input or has
            another dtype, rank or fixed dimension than its input, or the inputs would not fit in
            memory.
    """
    from passctl.support.inputs import check_dim_names, plan_inputs

    if dims:
        check_dim_names(header, dims)
    if checking or overrides:
        plan_inputs(header, dim_values=dims, overrides=overrides)


def run_check(reference: str, header, candidate: str, model, args, bounds: List[CheckBound],
              dims, overrides,
              known: Optional[Tuple[Dict[str, Any], Dict[str, Any]]] = None) -> Dict[str, Any]:
    """The numeric check's report entry: inputs used, per-output errors, worst errors, ``ok``.

    Uses :mod:`passctl.support.check` (ONNX Runtime's CPU execution provider) on seeded inputs from
    ``make_inputs``: the reference (original) runs with graph optimizations off; an ONNX Runtime
    artifact's ``model.onnx`` runs with its ``session.json``'s ``graph_optimization_level``
    (``ORT_ENABLE_ALL``: what ships, e.g. QLinearConv kernels for a quantized cpu model) and
    ``optimization`` in the entry says so; any other ``model.onnx`` (a TensorRT artifact's, which
    TensorRT parses as written) runs unoptimized. An output passes when
    ``OutputDiff.ok(rtol, atol, metric)`` for every bound of ``bounds`` (from
    :func:`check_bounds`: ``--rtol`` under max-rel, or each budget pass's metric under its
    budget); ``bounds`` in the entry gives each bound's ``metric``, ``rtol``, ``source``, worst
    ``error`` and ``ok``, and ``metric``, ``rtol``, ``metric_error`` repeat the first. A TVM
    artifact's folder (``candidate``'s folder holds its manifest) runs in ``tvm.runtime`` on inputs
    of the static shapes in its manifest; without ``dims``, a TensorRT artifact's inputs take its
    optimization profile's OPT sizes. ``model``: the compiled IR the emitter wrote ``candidate``
    from (its graph inputs are the candidate's). ``header``: ``reference``'s
    :func:`passctl.support.inputs.load_header`, read once per compile. ``known``: ``(inputs,
    outputs)`` of the original already run (``--check-each``'s), reused when the check's inputs are
    the same arrays.

    Raises:
        UserError: the original model itself fails on the inputs (sizes that do not fit it).
    """
    from passctl.targets.tvm.runtime import is_tvm_artifact
    from passctl.support.check import compare
    from passctl.support.inputs import draw_inputs, plan_inputs

    folder = os.path.dirname(candidate)
    tvm = is_tvm_artifact(folder)
    plan = plan_inputs(header, dim_values=_candidate_dims(folder, model, dims, tvm),
                       overrides=overrides)
    sources = {k: "artifact" if v == "given" and k not in dims else v
               for k, v in plan.dim_sources.items()}
    inputs = draw_inputs(plan, args.seed)
    want = _run_original(reference, inputs, known)
    warnings = _vacuous_check_warnings(want, args.atol, plan.dims, sources, overrides)
    level = _session_optimization(folder)
    got = _run_candidate(folder, candidate, inputs, tvm, level)
    result = compare(want, got)
    entry = _judge(result, bounds, args.atol)
    if not entry["ok"]:
        note = _judge_on_float64(entry, result, bounds, args.atol, reference, inputs, want, got)
        if note:
            warnings.append(note)
    single = [name for name, a in want.items() if getattr(a, "size", 0) == 1]
    if single and any(b.metric == "cosine" for b in bounds):
        warnings.append(f"--check: metric=cosine does not bound {', '.join(map(repr, single))}: "
                        "the cosine of two one-element outputs is 1 whatever their values; use "
                        "metric=mean-rel or max-rel for such outputs")
    entry.update(
        seed=args.seed, optimization=level or ("tvm" if tvm else "ORT_DISABLE_ALL"),
        dims=plan.dims, dims_source=sources, overridden=sorted(overrides),
        inputs=[{"name": k, "shape": list(v.shape), "dtype": str(v.dtype)}
                for k, v in inputs.items()],
        warnings=warnings)
    return entry


def _candidate_dims(folder: str, model, dims: Dict[str, int], tvm: bool) -> Dict[str, int]:
    """The sizes the check's inputs take: ``dims`` (``--dim``), else a TensorRT artifact's
    optimization profile OPT sizes; plus a TVM artifact's static manifest shapes, or the sizes the
    graph inputs of ``model`` (the compiled IR, which the emitter wrote unchanged as
    ``model.onnx``) declare fixed (a pass such as ``lower-tvm{dims=...}`` fixed them: the only ones
    it runs with)."""
    from passctl.targets.tensorrt import is_tensorrt_artifact

    if not dims and is_tensorrt_artifact(folder):  # the sizes its engine is tuned for
        from passctl.tools.run_artifact import profile_opt_dims

        dims = profile_opt_dims(folder)
    if tvm:  # a TVM artifact has static input shapes: the check uses them (H12, additive)
        from passctl.targets.tvm.runtime import read_manifest

        return dict(dims, **{f"{i['name']}[{axis}]": int(n) for i in read_manifest(folder)["inputs"]
                             for axis, n in enumerate(i["shape"])})
    return dict(dims, **{f"{v.name}[{axis}]": d for v in model.graph.inputs
                         if v.const is None and v.shape is not None
                         for axis, d in enumerate(v.shape.dims) if isinstance(d, int) and d > 0})


def _run_original(reference: str, inputs: Dict[str, Any],
                  known: Optional[Tuple[Dict[str, Any], Dict[str, Any]]]) -> Dict[str, Any]:
    """The original's outputs on ``inputs``: ``known``'s outputs when its inputs are the same
    arrays (same names, dtypes and values), else a run in ONNX Runtime (optimizations off).

    Raises:
        UserError: the original model fails on ``inputs`` (sizes that do not fit it).
    """
    import numpy as np

    from passctl.support.check import run_onnxruntime

    if known is not None and known[0].keys() == inputs.keys() and all(
            known[0][k].dtype == v.dtype and np.array_equal(known[0][k], v)
            for k, v in inputs.items()):
        return known[1]
    try:
        return run_onnxruntime(reference, inputs)
    except Exception as e:  # noqa: BLE001  (ORT's Fail / InvalidArgument / RuntimeException)
        shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in inputs.items())
        raise UserError(f"--check: the original model fails on the seeded inputs ({shapes}): "
                        f"{one_line(e)}; give sizes that fit with --dim NAME=SIZE or arrays with "
                        "--inputs FILE.npz") from e


def _run_candidate(folder: str, candidate: str, inputs: Dict[str, Any], tvm: bool,
                   level: Optional[str]) -> Dict[str, Any]:
    """The artifact's outputs on ``inputs``: in ``tvm.runtime`` for a TVM artifact, else
    ``candidate`` in ONNX Runtime's CPU provider at ``level`` (unoptimized when ``None``).

    Raises:
        UserError: the CPU provider has no kernel for a low-precision op of the artifact.
    """
    from passctl.targets.tvm.runtime import load_artifact
    from passctl.support.check import run_onnxruntime

    try:
        return (load_artifact(folder).run(inputs) if tvm else
                run_onnxruntime(candidate, inputs, optimize=level or False))
    except Exception as e:  # noqa: BLE001  (ORT's NotImplemented and siblings)
        first = one_line(e)
        if tvm or "NOT_IMPLEMENTED" not in first:
            raise
        raise UserError(f"--check runs the artifact on ONNX Runtime's CPU provider, which cannot "
                        f"run it ({first.split(' : ')[-1]}: a low-precision kernel that CUDA and "
                        "TensorRT have and the CPU lacks); drop --check here, or check with "
                        "amp{emulate=true} (low-precision rounding computed in float32)") from e


def _judge(result, bounds: List[CheckBound], atol: float) -> Dict[str, Any]:
    """``result`` (a :class:`passctl.support.check.CheckResult`) judged under every bound: its ``to_dict`` under the first, each output's ``ok``, and ``ok``,
    ``bounds``, ``atol``, ``max_abs``, ``max_rel``, ``failures``, ``passed_on_atol``,
    ``metric_error`` of the check's report entry."""
    entry = result.to_dict(bounds[0].rtol, bounds[0].metric)
    finite = [o for o in result.outputs.values() if o.problem is None]

    def passes(diff, atol: float) -> bool:
        return all(diff.ok(b.rtol, atol, b.metric) for b in bounds)

    for diff, item in zip(result.outputs.values(), entry["outputs"]):
        item["ok"] = passes(diff, atol)
    failures: List[str] = []
    for b in bounds:
        failures += [f for f in result.failures(b.rtol, atol, b.metric) if f not in failures]
    checked = [{"metric": b.metric, "rtol": b.rtol, "source": b.source,
                "ok": result.ok(b.rtol, atol, b.metric),
                "error": max((o.error(b.metric) for o in finite), default=0.0)} for b in bounds]
    entry.update(
        ok=all(b["ok"] for b in checked), bounds=checked, atol=atol,
        max_abs=max((o.max_abs for o in finite), default=0.0),
        max_rel=result.max_rel if result.max_rel != float("inf") else "inf",
        failures=failures,
        passed_on_atol=[d.name for d in result.outputs.values()
                        if passes(d, atol) and not passes(d, 0.0)],
        metric_error=checked[0]["error"])
    return entry


def _judge_on_float64(entry: Dict[str, Any], result, bounds: List[CheckBound], atol: float,
                      reference: str, inputs: Dict[str, Any], want: Dict[str, Any],
                      got: Dict[str, Any]) -> Optional[str]:
    """Second look at a failed max-rel check of float32 outputs: where the float64 evaluation of
    the original (:func:`passctl.support.exact.float64_outputs`) shows that the artifact is
    within ``rtol`` of the exact answer beyond the original's own float32 error
    (:func:`passctl.support.exact.rounding_excess`), the difference is the original's fp32
    rounding on an ill-conditioned output (e.g. a LayerNorm over rows equal in exact arithmetic,
    where ``x - mean`` is rounding noise amplified ``1/sqrt(eps)`` times), not the rewrite's:
    those outputs pass, ``entry["float64"]`` gives each one's ``excess``, and a warning says so.
    Only max-rel bounds (``--rtol``, the default) are judged so; budgets under mean-rel or cosine
    are left as they are. Updates ``entry`` in place; returns the warning (None when nothing
    changed)."""
    import numpy as np

    if any(b.metric != "max-rel" for b in bounds):
        return
    failing = [item for item in entry["outputs"] if not item.get("ok")]
    if not failing or result.extra:
        return
    for item in failing:
        diff = result.outputs.get(item["name"])
        a, r = got.get(item["name"]), want.get(item["name"])
        if (diff is None or diff.problem is not None or diff.nonfinite_mismatch
                or not isinstance(a, np.ndarray) or not isinstance(r, np.ndarray)
                or r.dtype != np.float32 or a.dtype != np.float32):
            return
    from passctl.support.exact import float64_outputs, rounding_excess

    exact = float64_outputs(reference, inputs, check=want)
    if exact is None:
        return
    rtol = min(b.rtol for b in bounds)
    excess = {}
    for item in failing:
        e = exact.get(item["name"])
        if not isinstance(e, np.ndarray) or e.shape != want[item["name"]].shape:
            return
        excess[item["name"]] = rounding_excess(want[item["name"]], got[item["name"]], e)
        if excess[item["name"]] > rtol and result.outputs[item["name"]].max_abs > atol:
            return
    for item in failing:
        item["ok"] = True
    names = set(excess)
    entry["failures"] = [f for f in entry["failures"]
                         if not any(f.startswith(f"{n}: ") for n in names)]
    entry["float64"] = [{"name": n, "excess": x} for n, x in excess.items()]
    entry["ok"] = not entry["failures"]
    for b in entry["bounds"]:
        b["ok"] = entry["ok"]
    return (
        f"--check: {'outputs' if len(names) > 1 else 'output'} "
        f"{', '.join(map(repr, sorted(names)))}: off the original's float32 run by more than "
        f"{rtol:g} relative but within "
        f"{rtol:g} of the original's float64 evaluation beyond the original's own float32 error "
        "(an ill-conditioned output: fp32 rounding, not the rewrite; largest excess "
        f"{max(excess.values()):.2g})")


def _session_optimization(folder: str) -> Optional[str]:
    """The ``graph_optimization_level`` of the ONNX Runtime artifact in ``folder`` (its
    ``session.json``), or ``None`` when ``folder`` is not one."""
    import json

    from passctl.targets.onnxruntime.emit import SESSION_FILE

    path = os.path.join(folder, SESSION_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return str(json.load(f)["graph_optimization_level"])


def _vacuous_check_warnings(want: Dict[str, Any], atol: float, dims: Dict[str, int],
                            sources: Dict[str, str], overrides: Dict[str, Any]) -> List[str]:
    """One warning when the original's outputs on the check's inputs leave little to compare
    (:func:`passctl.support.check.uninformative_outputs`), saying how to get telling inputs."""
    from passctl.support.check import uninformative_outputs

    reasons = uninformative_outputs(want, atol)
    if not reasons:
        return []
    parts = [f"'{name}' {why}" for name, why in reasons.items()]
    listed = "; ".join(parts[:3]) + (f"; and {len(parts) - 3} more" if len(parts) > 3 else "")
    defaults = [f"{k}={v}" for k, v in dims.items() if sources.get(k) == "default"]
    if defaults:
        todo = (f"give realistic sizes with --dim NAME=SIZE (defaults used: {', '.join(defaults)})"
                " or real data with --inputs FILE.npz")
    elif overrides:
        todo = "give other arrays with --inputs FILE.npz"
    else:
        todo = "give real data with --inputs FILE.npz"
    noun = "output" if len(parts) == 1 else "outputs"
    return [f"--check: the original's {noun} {listed} on these inputs, so the check can hardly "
            f"fail; {todo}"]
