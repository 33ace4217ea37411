"""Calibration runs for mixed precision: value ranges, per-node sensitivity, and the fp32-set search."""

from __future__ import annotations

import glob
import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from passctl.ir import Attr, AttrType, DataType, Model, Node, Shape, TensorType, Value, save, to_onnx
from passctl.ir.errors import UserError
from passctl.ir.onnx_protos import ProtoBuilder
from passctl.passes._snapshot import clone_model
from passctl.passes.precision.ops import float_inputs

logger = logging.getLogger(__name__)

METRICS = ("max-rel", "mean-rel", "cosine")
EMBED_LIMIT = 1_500_000_000
"""Weight bytes from which :func:`run_model` saves the model with external data instead of in memory."""
INJECT_MIN_BYTES = 1024
"""Initializer size from which :func:`run_model` passes the data to ONNX Runtime as an ``OrtValue``
instead of serializing it into the model bytes."""
_IN_MEMORY = "passctl-in-memory-initializer"
"""External-data location written for those initializers (never read: ONNX Runtime gets the data)."""
Feeds = List[Dict[str, np.ndarray]]


MAX_SAMPLES = 1024
"""Most seeded random calibration feeds (``samples``); more real data goes in ``calib``."""


def calibration_inputs(model: Model, calib: str = "", samples: int = 2, seed: int = 0,
                       dims: Optional[Mapping[str, int]] = None, owner: str = "amp") -> Feeds:
    """The calibration feeds: every ``*.npz`` of folder ``calib`` (one run each, arrays by input
    name, read by :func:`passctl.support.input_files.load_input_file`), or ``samples`` seeded random
    feeds from :func:`passctl.support.inputs.make_inputs` (its declared ranges: ids in [0, 1000),
    masks all ones, floats in [-1, 1)), seeds ``seed, seed+1, ...``. ``owner`` (the pass name)
    starts the error messages.

    Raises:
        UserError: ``calib`` does not exist, is not a folder, holds no .npz files, a file is not a
            readable .npz of numeric arrays (not a zip, Python objects, a folder named ``*.npz``),
            lacks a graph input or holds NaN or inf in one; a ``dims`` key names no unknown input
            dimension (:func:`passctl.support.dims.check_dims`); ``samples`` is above :data:`MAX_SAMPLES`.
    """
    from passctl.support.dims import check_dims

    names = [v.name for v in model.graph.inputs if not v.is_initializer()]
    if dims:
        text = ",".join(f"{k}={v}" for k, v in dims.items())
        check_dims(model, dict(dims), owner=f'{owner}{{dims="{text}"}}')
    if calib:
        if not os.path.exists(calib):
            raise UserError(f"{owner}: calib={calib}: no such folder; give a folder of .npz files, "
                            f"each with the arrays {names}")
        if not os.path.isdir(calib):
            raise UserError(f"{owner}: calib={calib} is a file, not a folder; give a folder of .npz "
                            f"files, each with the arrays {names}")
        files = sorted(glob.glob(os.path.join(calib, "*.npz")))
        if not files:
            raise UserError(f"{owner}: calib={calib} holds no .npz files; give a folder of .npz "
                            f"files, each with the arrays {names}")
        return [_calibration_file(path, names, owner) for path in files]
    if samples > MAX_SAMPLES:
        raise UserError(f"{owner}: samples={samples} is above {MAX_SAMPLES} random calibration "
                        f"feeds (each held in memory); give calib= with real data instead")
    from passctl.support.inputs import make_inputs

    header = to_onnx(_interface_only(model))
    return [make_inputs(header, seed=seed + k, dim_values=dims) for k in range(max(1, samples))]


def check_search_options(owner: str, budget: float, samples: int, metric: str,
                         example: str) -> None:
    """Check the accuracy-budget options that amp and quantize share (their ``Options``
    ``__post_init__`` calls this, so a bad value fails when the pipeline is built).

    Raises:
        UserError: ``budget`` is not a positive finite error (a negative or NaN budget kept every
            measured node float32 with only a warning; an infinite one accepts an inf output
            error), ``samples`` < 1, or ``metric`` is not one of :data:`METRICS`. ``owner`` (the
            pass name) starts the message, ``example`` is a budget to suggest.
    """
    if metric not in METRICS:
        raise UserError(f"{owner}: metric={metric} is unknown; use {', '.join(METRICS)}")
    if not (budget > 0 and math.isfinite(budget)):
        raise UserError(f"{owner}: budget={budget:g} must be a positive error such as {example} "
                        f"(under metric={metric})")
    if samples < 1:
        raise UserError(f"{owner}: samples={samples} must be at least 1")


def _calibration_file(path: str, names: Sequence[str], owner: str) -> Dict[str, np.ndarray]:
    """The graph inputs ``names`` from calibration file ``path`` (one line UserErrors naming it)."""
    from passctl.support.input_files import load_input_file

    try:
        data = load_input_file(path)
    except UserError as e:  # worded for --inputs: name the calibration file instead
        text = str(e)
        prefix = f"--inputs '{path}'"
        text = text[len(prefix):] if text.startswith(prefix) else f": {text}"
        raise UserError(f"{owner}: calibration file {path}{text}") from e
    missing = [n for n in names if n not in data]
    if missing:
        raise UserError(f"{owner}: calibration file {path} lacks inputs {missing}; it has "
                        f"{list(data)}")
    for n in names:
        a = data[n]
        if a.dtype.kind in "fc" and not np.isfinite(a).all():
            bad = int(a.size - np.count_nonzero(np.isfinite(a)))
            raise UserError(f"{owner}: calibration file {path}: array '{n}' holds {bad} NaN or "
                            f"inf values of {a.size}; calibration needs finite real inputs")
    return {n: data[n] for n in names}


def random_feeds_note(model: Model, calib: str = "", dims: Optional[Mapping[str, int]] = None) -> str:
    """What a warning about the calibration result adds when the feeds are seeded random data.

    Random feeds (no ``calib``) are sized by ``dims`` and, for the other unknown input dimensions, by
    :func:`passctl.support.inputs.make_inputs`'s defaults (e.g. 32x32 images), which may say little about
    the real inputs. Returns ``""`` when ``calib`` is given, else one clause such as ``the calibration
    feeds are seeded random data (no calib=) at default sizes x[2]=32, x[3]=32: give calib=DIR with real
    inputs (.npz files named by input) or the real sizes, e.g. dims="x[2]=SIZE,x[3]=SIZE"`` (the
    model's own unknown dimension keys: ``dim_param`` names or ``input[axis]``; dimensions that
    defaulted to 1, such as a batch, are left out of the example unless all did).
    """
    if calib:
        return ""
    from passctl.support.inputs import plan_inputs

    plan = plan_inputs(to_onnx(_interface_only(model)), dims)
    defaulted = [k for k, source in plan.dim_sources.items() if source == "default"]
    given = [k for k, source in plan.dim_sources.items() if source != "default"]
    def sizes(keys: List[str]) -> str:
        return ", ".join(f"{k}={plan.dims[k]}" for k in keys)

    text = "the calibration feeds are seeded random data (no calib=)"
    if defaulted:
        text += f" at default sizes {sizes(defaulted)}"
    if given:
        text += f"{' and' if defaulted else ' at'} given sizes {sizes(given)}"
    text += ": give calib=DIR with real inputs (.npz files, arrays by input name)"
    if defaulted:  # batch-like dimensions defaulted to 1 can stay so
        example = ",".join(f"{k}=SIZE" for k in defaulted if plan.dims[k] != 1
                           ) or ",".join(f"{k}=SIZE" for k in defaulted)
        text += f' or the real sizes, e.g. dims="{example}"'
    return text


def _interface_only(model: Model) -> Model:
    """A node-less copy holding only the graph inputs (for make_inputs, which reads declarations)."""
    from passctl.ir import Graph

    inputs = [Value(v.name, v.type) for v in model.graph.inputs if not v.is_initializer()]
    return Model(Graph(inputs, [], []), model.opset_imports, model.ir_version)


def run_model(model: Model, feeds: Feeds, outputs: Optional[Sequence[str]] = None,
              threads: Optional[int] = None, optimize: Union[bool, str] = False
              ) -> List[Dict[str, np.ndarray]]:
    """Run ``model`` (IR) on ONNX Runtime's CPU EP for every feed (:func:`passctl.support.check.cpu_session`).

    Graph optimizations are off (``ORT_DISABLE_ALL``) by default so the Casts that round to low
    precision are executed as written (amp's sensitivity probes); ``optimize=True`` uses
    ``ORT_ENABLE_ALL``, or a ``GraphOptimizationLevel`` name: the level the check runs the artifact
    at (:meth:`passctl.passes.precision.calibrating.CalibratingPass.shipped_optimization`; an ONNX
    Runtime artifact's ``session.json`` ships ``ORT_ENABLE_ALL``, which fuses ``DQ -> Conv -> Q``
    node units into QLinearConv-style int8 kernels with their own fixed-point requantization).
    Initializers of :data:`INJECT_MIN_BYTES` or more are not serialized: the model bytes mark them
    as external data and ONNX Runtime receives their arrays as ``OrtValue``s
    (``SessionOptions.add_external_initializers``), which saves a copy of every weight per run
    (the search runs the model once per candidate assignment); a weight is marked so only when every
    initializer holding it gets its ``OrtValue`` (:func:`_external_initializers`, checked on the
    proto), and should ONNX Runtime still look for the never-written file ("External data path
    validation failed"), the model is rerun from a temporary folder with a real external data file.
    Models that still hold :data:`EMBED_LIMIT` bytes of weights or more in the proto are written to
    a temporary folder with external data first.

    At an optimization level above ``ORT_DISABLE_ALL``, ONNX Runtime's own optimizer may break a
    valid graph (refuse it at load, fail at run time, or return an output of another shape than
    the graph declares and computes unoptimized: its (Simplified)LayerNormFusion dropping a
    broadcast rank). Such a graph is unmeasurable at the shipped level. Measuring it at another
    level would not be the budget of what ships (issue 15, build item 5: int8 and fp16 kernels of
    each level round differently), and dropping the trial (its layers kept float32) would
    silently give up precision that ONNX Runtime's bug, not the budget, rules out; so it raises
    :class:`OptimizerBreaks` (a UserError, exit 2) naming the highest level at which the graph runs
    right and the ``--emit`` option that ships (and measures) at it
    (:func:`_optimizer_breakage`); a graph that fails unoptimized too raises ONNX Runtime's error.

    Raises:
        OptimizerBreaks: see above.
    """
    from passctl.support.check import quiet_stdout

    level = _level_name(optimize)
    try:
        with quiet_stdout():  # ORT's "EP Error ... Falling back" prints; the error says it
            results = _run_model(model, feeds, outputs, threads, optimize)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001  (ORT's Fail, InvalidGraph, RuntimeException)
        if level in (None, "ORT_DISABLE_ALL"):
            raise
        message = _optimizer_breakage(model, feeds, outputs, threads, level, f"it fails "
                                      f"({_first(e)})")
        if message is None:
            raise
        raise OptimizerBreaks(message) from e
    if level not in (None, "ORT_DISABLE_ALL") and results:
        wrong = _undeclared_shape(model, results[0])
        if wrong is not None:
            message = _optimizer_breakage(model, feeds, outputs, threads, level, wrong)
            if message is not None:
                raise OptimizerBreaks(message)
    return results


class OptimizerBreaks(UserError):
    """ONNX Runtime's graph optimizer breaks, at the level the artifact ships with, a valid graph
    a budgeted pass measures (:func:`run_model`): the user's to choose another level."""


def _level_name(optimize: Union[bool, str]) -> Optional[str]:
    if isinstance(optimize, str):
        return optimize
    return "ORT_ENABLE_ALL" if optimize else "ORT_DISABLE_ALL"


def _first(error: BaseException) -> str:
    from passctl.support.ort_levels import first_line

    return first_line(error)


def _undeclared_shape(model: Model, result: Mapping[str, np.ndarray]) -> Optional[str]:
    """The first output of ``result`` (one run of ``model``) whose rank or static dims differ from
    ``model``'s declaration, as ``output 'y' has shape [..] where [..] is declared``; or None."""
    declared = {v.name: v for v in model.graph.outputs}
    for name, arr in result.items():
        value = declared.get(name)
        if value is None or value.shape is None or not isinstance(arr, np.ndarray):
            continue
        dims = list(value.shape.dims)
        if len(dims) != arr.ndim or any(isinstance(d, int) and d >= 0 and d != n
                                        for d, n in zip(dims, arr.shape)):
            return f"output '{name}' has shape {list(arr.shape)} where {dims} is declared"
    return None


def _optimizer_breakage(model: Model, feeds: Feeds, outputs: Optional[Sequence[str]],
                        threads: Optional[int], level: str, problem: str) -> Optional[str]:
    """:class:`OptimizerBreaks`' message when ``model`` runs right at ``ORT_DISABLE_ALL`` on
    ``feeds`` (its outputs there are the reference: same names, dtypes, shapes, NaN/inf
    positions, :func:`passctl.support.ort_levels.level_problem`), is valid ONNX
    (``onnx.checker`` full check, where the weights fit in memory) and runs right at a level
    below ``level``; None otherwise (the failure is not ONNX Runtime's optimizer's)."""
    from passctl.support.ort_levels import emit_option, highest_right_level, level_problem

    from passctl.support.check import quiet_stdout

    def run(lv: str) -> Dict[str, np.ndarray]:
        with quiet_stdout():
            runs = _run_model(model, feeds, outputs, threads, lv)
        return {f"{name} (feed {k})" if k else name: a
                for k, r in enumerate(runs) for name, a in r.items()}

    try:
        want = run("ORT_DISABLE_ALL")
    except Exception:  # noqa: BLE001  (fails as written: not the optimizer's doing)
        return None
    if "declared" in problem:  # a shape off the declaration: ORT's only if unoptimized differs
        again = level_problem(run, level, want)
        if again is None:
            return None
        problem = again
    if _external_initializers(model)[2] < EMBED_LIMIT:
        import onnx

        try:
            onnx.checker.check_model(ProtoBuilder().model(model), full_check=True)
        except Exception:  # noqa: BLE001  (an invalid graph that ORT_DISABLE_ALL tolerates)
            return None
    works = highest_right_level(run, level, want)
    if works is None:
        return None
    return (f"ONNX Runtime's graph optimizer at {level}, the level the artifact ships with and "
            f"the budgeted pass measures at, breaks the graph it measures: {problem}, although "
            f"the graph is valid (onnx.checker full check) and runs right at ORT_DISABLE_ALL; a "
            f"bug of ONNX Runtime's optimizer, not of the model, the calibration feeds or "
            f"passctl; the graph runs right at {works}: compile with {emit_option(works)} to "
            f"measure and ship at that level")


def _run_model(model: Model, feeds: Feeds, outputs: Optional[Sequence[str]],
               threads: Optional[int], optimize: Union[bool, str]) -> List[Dict[str, np.ndarray]]:
    """:func:`run_model` without the optimizer-breakage diagnosis."""
    from passctl.support.check import cpu_session

    plan, values, embedded = _external_initializers(model)

    def from_folder():  # protobuf's 2 GB limit: weights in an external data file, a real one
        with tempfile.TemporaryDirectory(prefix="passctl-amp-") as folder:
            path = os.path.join(folder, "model.onnx")
            save(model, path, external_data=True)
            return cpu_session(path, optimize=optimize, threads=threads)

    if embedded >= EMBED_LIMIT:
        session = from_folder()
    else:
        proto = ProtoBuilder(external=plan, location=_IN_MEMORY).model(model)
        unhanded = _unhanded_external(proto, values)
        try:
            if unhanded:  # never with _external_initializers' per-tensor rule; kept as a guard
                raise RuntimeError(f"external data without an OrtValue: {unhanded[:5]}")
            session = cpu_session(proto.SerializeToString(), optimize=optimize, threads=threads,
                                  external_initializers=values)
        except Exception as e:  # noqa: BLE001  (ORT's Fail)
            if not values or "external data" not in str(e).lower():
                raise
            # An ONNX Runtime code path that reads a handed weight through its external-data
            # entry instead of its OrtValue: the same model with the weights in a real file.
            logger.debug("run_model: %s; retrying with the weights in an external data file",
                         str(e).splitlines()[0][:200])
            session = from_folder()
    names = list(outputs) if outputs is not None else [o.name for o in session.get_outputs()]
    wanted = [i.name for i in session.get_inputs()]
    return [dict(zip(names, session.run(names, {n: f[n] for n in wanted}))) for f in feeds]


def _external_initializers(model: Model) -> Tuple[Dict[int, Tuple[int, int]], Dict[str, object], int]:
    """Which main-graph initializers :func:`run_model` hands to ONNX Runtime as ``OrtValue``s.

    The plan is keyed by tensor (``ProtoBuilder`` marks every initializer holding a planned tensor
    as external data), so the choice is made per tensor: a tensor goes external only when every
    main-graph initializer holding it gets its ``OrtValue`` under its own name. One holder that
    cannot (an initializer no node reads, which ONNX Runtime drops at load and whose ``OrtValue``
    it then refuses, "Failed to find existing initializer"; or one that is also a graph input,
    which ONNX Runtime keeps and reads from the never-written file: "External data path
    validation failed", case 16 of issue 15) keeps the tensor embedded for all of them. Tensors
    also held by a node attribute (a Constant's value) or a subgraph initializer stay embedded.

    Returns:
        ``({id(tensor): (0, nbytes)}`` for ``ProtoBuilder(external=...)``, ``{initializer name:
        OrtValue}``, bytes of initializer data left embedded in the proto``)``.
    """
    import onnxruntime as ort

    graph = model.graph
    elsewhere = set()  # tensors also written outside the main graph's initializer list
    for n in graph.all_nodes():
        elsewhere.update(id(a.value) for a in n.attributes.values()
                         if a.type == AttrType.TENSOR and a.value is not None)
        for sub in n.subgraphs():
            elsewhere.update(id(u.const) for u in sub.initializers.values())
    holders: Dict[int, List[Value]] = {}
    for v in graph.initializers.values():
        if v.const is not None:
            holders.setdefault(id(v.const), []).append(v)
    plan: Dict[int, Tuple[int, int]] = {}
    values: Dict[str, object] = {}
    embedded = 0
    for key, group in holders.items():
        t = group[0].const
        value = None
        handable = all((bool(v.uses()) or v.is_graph_output()) and not v.is_graph_input()
                       for v in group)
        if (handable and t.nbytes >= INJECT_MIN_BYTES and key not in elsewhere
                and t.source_proto is None and t.dtype != DataType.STRING and not t.dtype.is_packed):
            arr = np.ascontiguousarray(t.numpy())
            if arr.dtype.byteorder != ">":
                if arr.dtype.kind in "biuf":
                    value = ort.OrtValue.ortvalue_from_numpy(arr)
                else:  # ml_dtypes types (bfloat16, float8): raw bits with the ONNX element type
                    value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                        arr.view(f"u{arr.dtype.itemsize}"), int(t.dtype))
        if value is None:
            embedded += t.nbytes * len(group)
            continue
        plan[key] = (0, t.nbytes)
        for v in group:
            values[v.name] = value
    return plan, values, embedded


def _unhanded_external(proto, values: Mapping[str, object]) -> List[str]:
    """Names of tensors in ``proto`` (any graph, any attribute) marked as :data:`_IN_MEMORY`
    external data that ``values`` does not hand over: ONNX Runtime would read them from a file
    that does not exist."""
    import onnx

    missing: List[str] = []

    def tensor(t) -> None:
        if t.data_location == onnx.TensorProto.EXTERNAL and t.name not in values and any(
                e.key == "location" and e.value == _IN_MEMORY for e in t.external_data):
            missing.append(t.name)

    def graph(g) -> None:
        for t in g.initializer:
            tensor(t)
        for n in g.node:
            for a in n.attribute:
                if a.HasField("t"):
                    tensor(a.t)
                for t in a.tensors:
                    tensor(t)
                if a.HasField("g"):
                    graph(a.g)
                for sub in a.graphs:
                    graph(sub)

    graph(proto.graph)
    for f in proto.functions:  # model-local function bodies (their Constant values)
        body = onnx.GraphProto()
        body.node.extend(f.node)
        graph(body)
    return missing


@dataclass
class Measurement:
    """What one calibration pass measured.

    Attributes:
        absmax: float32 value name -> largest finite |x| seen over the feeds.
        max_rel: node position -> max |low - fp32| / max |fp32| of the node's first output, with only
            that node in low precision (inputs exact float32, rounded on entry).
        mean_rel: node position -> sum |low - fp32| / sum |fp32| (same run).
        input_max_rel, input_mean_rel: the same errors from rounding the node's inputs alone (output
            computed and kept in float32): how much the node suffers when its producers are low,
            e.g. a Sub of two nearly equal values.
        seconds: wall time of the run, including building the session.
        reference: per feed, the float32 model's outputs ``{graph output name: array}`` (the same
            session computes them, so the caller needs no separate reference run).
    """

    absmax: Dict[str, float] = field(default_factory=dict)
    max_rel: Dict[int, float] = field(default_factory=dict)
    mean_rel: Dict[int, float] = field(default_factory=dict)
    input_max_rel: Dict[int, float] = field(default_factory=dict)
    input_mean_rel: Dict[int, float] = field(default_factory=dict)
    seconds: float = 0.0
    reference: List[Dict[str, np.ndarray]] = field(default_factory=list)


def measure(model: Model, candidates: Sequence[int], low: DataType, feeds: Feeds) -> Measurement:
    """Measure value ranges and every candidate's sensitivity in one ONNX Runtime session.

    The session runs a copy of the float32 graph extended with, for each value, ``ReduceMax(Abs(v))``,
    and for each candidate node (by position in ``model.graph``) a clone reading its float inputs
    rounded to ``low`` (``Cast(Cast(x, low), float)``) whose first output, rounded the same way, is
    compared with the float32 output (``ReduceMax`` and ``ReduceSum`` of the absolute difference). The
    added outputs are scalars only, so one run covers all nodes whatever the model size; the graph's
    own outputs stay, giving :attr:`Measurement.reference`.

    Raises:
        Exception: whatever ONNX Runtime raises when the model does not run on the feeds.
    """
    start = time.perf_counter()
    work = clone_model(model)
    graph = work.graph
    nodes = list(graph)
    outputs: List[Value] = []
    counter = [0]

    def op(op_type: str, inputs: List[Value], dtype: DataType, scalar: bool = False, **attrs) -> Value:
        counter[0] += 1
        out = Value(f"amp_m{counter[0]}", TensorType(dtype, Shape(()) if scalar else None))
        node = Node("", op_type, inputs, [Attr(k, AttrType.INT, v) for k, v in attrs.items()], [out],
                    name=f"amp_m{counter[0]}_{op_type}")
        graph.append(node)
        return out

    def absmax(v: Value) -> Value:
        return op("ReduceMax", [op("Abs", [v], DataType.FLOAT)], DataType.FLOAT, True, keepdims=0)

    range_names: Dict[str, str] = {}
    for v in list(graph.inputs) + [o for n in nodes for o in n.outputs]:
        if v.dtype != DataType.FLOAT or v.is_initializer():
            continue
        if v.shape is not None and any(isinstance(d, int) and d == 0 for d in v.shape):
            continue
        out = absmax(v)
        outputs.append(out)
        range_names[v.name] = out.name
    rounded: Dict[Value, Value] = {}

    def round_low(v: Value) -> Value:
        if v not in rounded:
            rounded[v] = op("Cast", [op("Cast", [v], low, to=int(low))], DataType.FLOAT, to=int(DataType.FLOAT))
        return rounded[v]

    probes: Dict[int, Tuple[str, ...]] = {}
    for p in candidates:
        node = nodes[p]
        slots = set(float_inputs(node))
        ins = [round_low(v) if i in slots else v for i, v in enumerate(node.inputs)]
        outs = [Value(f"amp_c{p}_{k}", o.type) for k, o in enumerate(node.outputs)]
        clone = Node(node.domain, node.op_type, ins, list(node.attributes.values()), outs,
                     name=f"amp_clone_{p}")
        graph.append(clone)
        ref = node.outputs[0]
        names = []
        for result in (round_low(outs[0]), outs[0]):  # full low precision, then input rounding only
            diff = op("Abs", [op("Sub", [result, ref], DataType.FLOAT)], DataType.FLOAT)
            names.append(op("ReduceMax", [diff], DataType.FLOAT, True, keepdims=0))
            names.append(op("ReduceSum", [diff], DataType.FLOAT, True, keepdims=0))
        names.append(op("ReduceSum", [op("Abs", [ref], DataType.FLOAT)], DataType.FLOAT, True,
                        keepdims=0))
        outputs += names
        probes[p] = tuple(v.name for v in names)
    originals = [v.name for v in graph.outputs]
    graph.outputs = list(graph.outputs) + outputs
    results = run_model(work, feeds)
    m = Measurement(reference=[{k: r[k] for k in originals} for r in results])
    for name, out in range_names.items():
        values = [float(r[out]) for r in results if np.isfinite(r[out])]
        m.absmax[name] = max(values) if values else 0.0
    for p, (e_max, e_sum, i_max, i_sum, r_sum) in probes.items():
        ref_max = m.absmax.get(nodes[p].outputs[0].name, 0.0)
        total = sum(float(r[r_sum]) for r in results)
        for maxes, means, err_max, err_sum in ((m.max_rel, m.mean_rel, e_max, e_sum),
                                               (m.input_max_rel, m.input_mean_rel, i_max, i_sum)):
            maxes[p] = error_ratio(max(float(r[err_max]) for r in results), ref_max)
            means[p] = error_ratio(sum(float(r[err_sum]) for r in results), total)
    m.seconds = time.perf_counter() - start
    logger.info("amp: measured %d values and %d nodes in %.1f s", len(range_names), len(probes),
                m.seconds)
    return m


def error_ratio(err: float, scale: float) -> float:
    """``err / scale`` for a relative error: ``inf`` for a non-finite ``err``, and for a nonzero
    ``err`` over a zero ``scale``; 0 when both are zero."""
    if not np.isfinite(err):
        return float("inf")
    if scale > 0:
        return err / scale
    return 0.0 if err == 0 else float("inf")


def output_error(reference: List[Dict[str, np.ndarray]], candidate: List[Dict[str, np.ndarray]],
                 metric: str) -> float:
    """The model-output error of ``candidate`` against ``reference`` (lists of per-feed outputs),
    judged as the numeric check judges it (:func:`passctl.support.check.outputs_error`, the one
    metric function): ``max-rel`` max |r - c| / max |r|, ``mean-rel`` sum |r - c| / sum |r|,
    ``cosine`` 1 - cosine similarity, over the finite positions; the worst over outputs and feeds;
    ``inf`` when a NaN/inf position differs in either direction (a reference NaN the candidate
    made finite, case 13 of issue 15), so a budget met here is met by ``--check`` on these feeds.
    """
    from passctl.support.check import outputs_error

    return outputs_error(reference, candidate, metric)


@dataclass
class SearchResult:
    """Outcome of :func:`search_fp32_set`: ``count`` leading ranked nodes stay float32.

    ``history`` holds ``(count, error)`` for every configuration run, in order; ``error`` is the
    chosen configuration's measured error; ``seconds`` the search's wall time.
    """

    count: int
    error: float
    history: List[Tuple[int, float]]
    seconds: float
    within_budget: bool


def group_estimates(groups: Mapping[str, Sequence[int]], local: Mapping[int, float],
                    evaluate_low: Callable[[Sequence[int]], float], metric: str
                    ) -> Tuple[Dict[int, float], Dict[str, float]]:
    """Each node's estimated model-output error alone in low precision, from one run per group.

    Rounding errors of different nodes are nearly independent, so their squared output errors add
    (measured on SmolLM2 in bf16: MatMul 4.4e-3, Add 4.8e-3, Mul 4.0e-3, Sin/Cos/Sigmoid alone give
    7.9e-3 as the root of the sum of squares; all of them low together give 7.7e-3). ``evaluate_low``
    runs the model with only one group's nodes low (one run per group, e.g. per op type); the group's
    error is shared among its nodes in proportion to their squared local errors ``local``. For
    ``cosine`` (1 - cos is already a squared quantity) errors add linearly.

    Returns:
        ``({node: estimated output error}, {group: measured output error})``.
    """
    squared = metric != "cosine"
    estimates: Dict[int, float] = {}
    measured: Dict[str, float] = {}
    for name, members in groups.items():
        err = evaluate_low(members)
        measured[name] = err
        weights = {i: local.get(i, 0.0) ** 2 for i in members}
        total = sum(weights.values())
        for i in members:
            share = weights[i] / total if total > 0 else 1.0 / len(members)
            if not np.isfinite(err):
                estimates[i] = float("inf") if share > 0 else 0.0
            else:
                estimates[i] = float(np.sqrt(share) * err) if squared else share * err
        logger.info("amp: group %s (%d nodes) alone low -> error %.3g", name, len(members), err)
    return estimates, measured


def search_fp32_set(ranking: Sequence[int], evaluate: Callable[[int], float], budget: float,
                    known: Optional[Mapping[int, float]] = None) -> SearchResult:
    """Smallest ``k`` such that keeping the ``k`` most sensitive nodes float32 meets ``budget``.

    ``evaluate(k)`` runs the model with ``ranking[:k]`` float32 and the rest low and returns its
    output error. Galloping then bisection over k (error is assumed to fall as k grows): k = 0, 1, 3,
    7, ... until one meets the budget, then binary search between the last failing and the first
    passing k, about 2 * log2(k) + 2 runs instead of one per node. ``k = len(ranking)`` (all
    candidates float32, so the graph is unchanged) is taken as error 0 without a run; ``known`` gives
    errors already measured (e.g. ``{0: all-low error}``), which count in ``history`` but are not rerun.
    """
    start = time.perf_counter()
    n = len(ranking)
    history: List[Tuple[int, float]] = list((known or {}).items())
    errors: Dict[int, float] = dict(known or {})
    errors[n] = 0.0

    def run(k: int) -> float:
        if k not in errors:
            errors[k] = evaluate(k)
            history.append((k, errors[k]))
            logger.info("amp search: %d fp32 nodes -> error %.3g", k, errors[k])
        return errors[k]

    lo, hi, step = -1, n, 1
    k = 0
    while k < n:
        if run(k) <= budget:
            hi = k
            break
        lo = k
        k = min(n, k + step)
        step *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if run(mid) <= budget:
            hi = mid
        else:
            lo = mid
    return SearchResult(hi, errors[hi], history, time.perf_counter() - start, errors[hi] <= budget)
