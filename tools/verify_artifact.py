"""The verify step of ``passctl compile``: before the output folder is published, the artifact runs
once on seeded inputs at small sizes in the runtime it targets, and every output must have the
declared shape and dtype and be finite where the original's is (on the same inputs).

A failure is passctl's bug (an internal error, exit 3, with a reproducer): the message names the
pass that last touched the failing value, from :class:`TouchRecorder`, a pass-manager instrument
that records which pass created or changed each node. ``--no-verify`` skips the step.

Unless ONNX Runtime's own graph optimizer is to blame (:func:`explain_level_breakage`): the
original model breaks the same way at the artifact's level, or passctl's valid graph breaks only
at that level; that is the user's to choose around (a UserError, exit 2, naming the highest level
that runs right and the ``--emit`` option that ships at it). Values are not judged here (that is
``--check``'s job), with one exception: when the artifact's float32 outputs are off the
original's unoptimized run by more than :data:`passctl.support.ort_levels.LEVEL_RTOL`, and the
original itself is as far off at the artifact's level (beyond what its float64 evaluation
explains), ONNX Runtime's optimizer disagrees with itself on the original: the same UserError.""" 

from __future__ import annotations

import os
import re
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from passctl.ir.errors import UserError
from passctl.support.errors import InternalError, one_line


class VerifyFailed(InternalError):
    """The artifact failed the verify run (exit 3; ``reproducer``: the folder with the candidate)."""


class TouchRecorder:
    """Pass-manager instrument: which pass last created or changed each node.

    After every pass it compares each node's signature (op, domain, input and output values,
    attribute objects, output names and types) with the one before the pass; a new node, or one
    whose signature changed, is recorded as touched by that pass (a pass whose record says it
    changed nothing is not scanned), and so is the producer of a graph output that is now another
    value (a removed node whose input became the output). Used only to name the pass to blame
    when the artifact fails (:meth:`blame`); about 15 ms per pass on SmolLM2's 2176 nodes."""

    def __init__(self) -> None:
        self._sig: Dict[int, Tuple[Any, tuple]] = {}
        self._touched: Dict[int, Tuple[Any, str, int]] = {}
        self._order = 0
        self._outputs: tuple = ()
        self._by_source: Dict[str, List[str]] = {}  # source node name -> passes, in order

    @staticmethod
    def _signature(node) -> tuple:
        return (node.op_type, node.domain, node.inputs, node.outputs,
                tuple((k, id(a)) for k, a in node.attributes.items()),
                tuple((v.name, id(v.type)) for v in node.outputs))  # types are immutable

    def _snapshot(self, model) -> Dict[int, Tuple[Any, tuple]]:
        return {id(n): (n, self._signature(n)) for n in model.graph.all_nodes()}

    def on_start(self, model, passes) -> None:
        self._sig = self._snapshot(model)
        self._outputs = tuple(model.graph.outputs)

    def after_pass(self, pass_, model, record) -> None:
        self._order += 1
        if record is not None and not record.modified:
            return  # the pass says it changed nothing: skip the scan (most fixpoint rounds)
        new = self._snapshot(model)
        for key, (node, sig) in new.items():
            old = self._sig.get(key)
            if old is None or old[0] is not node or old[1] != sig:
                self._touch(node, pass_.name)
        outputs = tuple(model.graph.outputs)
        for i, v in enumerate(outputs):
            was = self._outputs[i] if i < len(self._outputs) else None
            if v is not was and v.producer is not None:
                self._touch(v.producer, pass_.name)
        self._sig, self._outputs = new, outputs

    def _touch(self, node, name: str) -> None:
        self._touched[id(node)] = (node, name, self._order)
        for source in node.provenance:
            passes = self._by_source.setdefault(source, [])
            if not passes or passes[-1] != name:
                passes.append(name)

    def history(self, node) -> List[str]:
        """The passes that touched nodes made from ``node``'s source nodes (its provenance), in
        order: the rewrites that led to it even where a later pass replaced the node object."""
        passes: List[str] = []
        for source in node.provenance:
            for name in self._by_source.get(source, []):
                if name not in passes:
                    passes.append(name)
        return passes

    def pass_of(self, node) -> Optional[str]:
        """The pass that last touched ``node`` (None when no pass changed it)."""
        hit = self._touched.get(id(node))
        return hit[1] if hit is not None and hit[0] is node else None

    def blame(self, node) -> Tuple[Optional[str], Any]:
        """``(pass, node)``: the pass that last touched ``node``, or, when none did, the most
        recent pass that touched a node it reads from (transitively); ``(None, None)`` when no
        pass changed anything it depends on."""
        if self.pass_of(node) is not None:
            return self.pass_of(node), node
        best: Tuple[int, Optional[str], Any] = (-1, None, None)
        seen, stack = {id(node)}, [node]
        while stack:
            n = stack.pop()
            for v in n.inputs:
                p = v.producer if v is not None else None
                if p is None or id(p) in seen:
                    continue
                seen.add(id(p))
                hit = self._touched.get(id(p))
                if hit is not None and hit[0] is p and hit[2] > best[0]:
                    best = (hit[2], hit[1], p)
                stack.append(p)
        return best[1], best[2]


_ORT_NODE = re.compile(r"running (\S+) node\. Name:'([^']*)'")
_NODE_IN_LOAD = re.compile(r"Node \(([^)]*)\)|node (?:with name )?'([^']+)'", re.IGNORECASE)


def _node_label(node) -> str:
    return f"node '{node.name}' ({node.op_type})" if node.name else f"a {node.op_type} node"


def blame_runtime_error(model, error: BaseException, recorder: Optional[TouchRecorder]) -> str:
    """``last touched by pass 'P' (...)`` for the node a runtime's error message names (its load
    check or a run), or "" when the message names no node of ``model``."""
    node = _node_of_error(model, str(error), recorder)
    return "" if node is None else _blame_text(recorder, node, "it")


def _blame_text(recorder: Optional[TouchRecorder], node, what: str) -> str:
    """``last touched by pass 'P' (node 'N' (Op))`` for the value ``what`` produced by ``node``."""
    if recorder is None or node is None:
        return "the pass responsible is unknown (no pass record)"
    name, culprit = recorder.blame(node)
    if name is None:
        return (f"no pass changed {what} or anything it reads (the emitter or the runtime is "
                "responsible)")
    where = "" if culprit is node else f", upstream of {_node_label(node)}"
    history = recorder.history(culprit)
    if len(history) > 1:
        where += (f"; the passes that rewrote its source nodes "
                  f"{', '.join(repr(p) for p in culprit.provenance[:3])}: {', '.join(history)}")
    return f"last touched by pass '{name}' ({_node_label(culprit)}{where})"


def _nodes_by_name(model) -> Dict[str, Any]:
    return {n.name: n for n in model.graph.all_nodes() if n.name}


def _node_of_error(model, message: str, recorder: Optional[TouchRecorder]) -> Any:
    """The IR node a runtime error message names (by node name, else the only node of the op
    type), or None."""
    by_name = _nodes_by_name(model)
    m = _ORT_NODE.search(message)
    if m:
        op, name = m.groups()
        if name in by_name:
            return by_name[name]
        same = [n for n in model.graph.all_nodes() if n.op_type == op]
        return same[0] if len(same) == 1 else _latest_touched(same, recorder)
    for m in _NODE_IN_LOAD.finditer(message):
        name = m.group(1) or m.group(2)
        if name in by_name:
            return by_name[name]
    return None


def _latest_touched(nodes, recorder: Optional[TouchRecorder]) -> Any:
    """Of ``nodes`` (all of the op a runtime error names, none by name), the one a pass touched
    last (the first when none was touched); None for no nodes."""
    if recorder is None or not nodes:
        return nodes[0] if nodes else None
    ranked = [(recorder._touched.get(id(n), (None, None, -1))[2], i, n) for i, n in enumerate(nodes)]
    return max(ranked, key=lambda t: (t[0], -t[1]))[2]


def _declared_dtype(value) -> Optional[str]:
    from passctl.targets.base import dtype_name

    return dtype_name(value)


def _shape_problem(value, got: np.ndarray, bound: Dict[str, int],
                   want: Optional[np.ndarray]) -> Optional[str]:
    """Why output ``got`` does not fit ``value``'s declared shape (dim_params bind across
    outputs and inputs through ``bound``) or the original's output ``want``; None when it fits."""
    shape = value.shape
    if shape is not None:
        dims = list(shape.dims)
        if len(dims) != got.ndim:
            return f"has rank {got.ndim} (shape {list(got.shape)}) where rank {len(dims)} " \
                   f"({dims}) is declared"
        for axis, (d, n) in enumerate(zip(dims, got.shape)):
            if isinstance(d, int) and d >= 0 and d != n:
                return f"has shape {list(got.shape)} where {dims} is declared (axis {axis})"
            if isinstance(d, str) and d and d not in ("?", "-1", "None", "unk"):
                if bound.setdefault(d, int(n)) != n:
                    return (f"has shape {list(got.shape)} where {dims} is declared and "
                            f"'{d}' is {bound[d]} elsewhere")
    if want is not None and tuple(want.shape) != tuple(got.shape):
        return f"has shape {list(got.shape)} where the original's is {list(want.shape)}"
    return None


def _nonfinite_problem(got: np.ndarray, want: Optional[np.ndarray]) -> Optional[str]:
    if want is None or got.dtype.kind not in "fc" or want.shape != got.shape:
        return None
    try:
        bad = np.isfinite(want.astype(np.float64)) & ~np.isfinite(got.astype(np.float64))
    except (TypeError, ValueError):
        return None
    count = int(bad.sum())
    if not count:
        return None
    return (f"is NaN or infinite at {count} of {got.size} positions where the original is finite "
            f"(first at index {[int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape)]})")


def verify_artifact(folder: str, model, reference: str, header, dims: Dict[str, int],
                    seed: int, recorder: Optional[TouchRecorder],
                    known: Optional[Tuple[Dict[str, Any], Dict[str, Any]]] = None,
                    overrides: Optional[Dict[str, Any]] = None, shown: str = "the model",
                    original_weight_bytes: Optional[int] = None
                    ) -> Tuple[Dict[str, Any], Optional[Tuple[Dict[str, Any], Dict[str, Any]]]]:
    """Run the artifact in ``folder`` once and check its outputs; return ``report["verify"]``
    and ``(inputs, original outputs)`` (None when the original did not run), which a later
    ``--check`` on the same inputs reuses.

    Inputs: seeded random arrays (``seed``) at the sizes of ``dims`` (``--dim``), else the small
    defaults of :func:`passctl.support.inputs.make_inputs` (batch 1, sequence 16, spatial 32,
    other 16) for symbolic dims, and a TVM artifact's static manifest shapes. The original
    (``reference``, ONNX Runtime's CPU provider, optimizations off) runs on the same arrays.
    The artifact runs where it ships: an ONNX Runtime artifact at its ``session.json``
    optimization level, a TVM artifact in ``tvm.runtime``, any other ``model.onnx`` (TensorRT's)
    in ONNX Runtime unoptimized. Every output must exist, have the declared dtype, rank and
    static dims (a ``dim_param`` the same size everywhere it appears) and be finite (no NaN / inf)
    wherever the original's output is finite; and an ONNX Runtime artifact whose values are off at
its level where the original is off the same way there is refused (the module docstring). Where
the original ran, its outputs' dtypes and
    shapes are the reference: an artifact output that matches them but not the declaration (the
    original model's own declaration is wrong) passes, with a note.

    ``known``: ``(inputs, outputs)`` of the original already run (``--check-each``'s), reused
    when the inputs are the same arrays. ``overrides``: arrays by input name used instead of
    seeded ones (a PyTorch model's example inputs, whose token ids random values could not be).

    Returns:
        the report entry ``{"ran", "ms", "runtime", "dims", "inputs", "outputs"}`` (``outputs``: ``name``, ``shape``,
        ``dtype`` per artifact output), plus ``notes`` for declarations the original breaks too; ``ran`` is false with ``reason`` when the step cannot
        judge here: the original itself fails on the inputs (its sizes are the user's to give
        with ``--check --dim``) or the CPU has no kernel for a GPU artifact.

    ``shown``: how messages name the original model (the path the user gave).

    Huge models are not run: when the original's weights (``original_weight_bytes``, counted at
    load) or the artifact's exceed :func:`passctl.support.check.run_weight_limit` (2 GiB unless
    ``$PASSCTL_RUN_MAX_WEIGHT_BYTES`` says otherwise), ``ran`` is false and ``reason`` says why:
    an ONNX Runtime session holds about twice a model's weights, and this step opens two.

    Raises:
        VerifyFailed: the artifact fails to run where the original runs, or an output breaks a
            rule above; one line naming the output (or node), what is wrong and the pass that last
            touched it (``reproducer`` is set by the caller).
        UserError: such a failure is ONNX Runtime's optimizer's at the artifact's level, not
            passctl's (:func:`explain_level_breakage`).
    """
    from passctl.support.check import run_onnxruntime
    from passctl.support.inputs import draw_inputs, plan_inputs
    from passctl.targets.tvm.runtime import is_tvm_artifact
    from passctl.tools.numeric_check import _candidate_dims, _run_candidate, _session_optimization
    start = time.perf_counter()
    tvm = is_tvm_artifact(folder)
    candidate = os.path.join(folder, "model.onnx")
    level = _session_optimization(folder)
    runtime = "tvm" if tvm else f"onnxruntime {level or 'ORT_DISABLE_ALL'}"
    entry: Dict[str, Any] = {"ran": False, "ms": 0.0, "runtime": runtime}
    if not tvm and not os.path.isfile(candidate):  # another emitter's artifact (a plugin's)
        entry.update(runtime=None, reason="the artifact has no model.onnx or TVM library that "
                                          "passctl knows how to run")
        return entry, None

    ran: Optional[Tuple[Dict[str, Any], Dict[str, Any]]] = None

    def done(**kw):
        entry.update(kw)
        entry["ms"] = round((time.perf_counter() - start) * 1e3, 3)
        return entry, ran

    from passctl.support.check import RUN_LIMIT_ENV, run_weight_limit
    from passctl.targets.onnx_file import weight_bytes

    limit = run_weight_limit()
    biggest = max(original_weight_bytes or 0, weight_bytes(model.graph))
    if biggest > limit:
        return done(reason=f"skipped: {biggest / 1e9:.2f} GB of weights is over the "
                           f"{limit / 1e9:.2f} GB that compile runs in ONNX Runtime "
                           f"({RUN_LIMIT_ENV}; a session holds about twice the weights and this "
                           "step opens the original and the artifact); run `passctl check` or "
                           "--check on a machine with the memory, or raise the limit")

    try:
        plan = plan_inputs(header, dim_values=_candidate_dims(folder, model, dims, tvm),
                           overrides=overrides or {})
        inputs = draw_inputs(plan, seed)
    except UserError as e:
        return done(reason=f"no seeded inputs for this model: {one_line(e)}")
    shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in inputs.items())
    entry.update(dims=plan.dims, inputs=[{"name": k, "shape": list(v.shape), "dtype": str(v.dtype)}
                                         for k, v in inputs.items()])
    original_error = ""
    if known is not None and known[0].keys() == inputs.keys() and all(
            known[0][k].dtype == v.dtype and np.array_equal(known[0][k], v)
            for k, v in inputs.items()):
        want: Optional[Dict[str, Any]] = known[1]
    else:
        try:
            want = run_onnxruntime(reference, inputs)
        except Exception as e:  # noqa: BLE001  (ORT's Fail / InvalidArgument / RuntimeException)
            want, original_error = None, one_line(e)
    ran = None if want is None else (inputs, want)
    from passctl.targets.onnx_file import take_loaded_session

    session = None if tvm else take_loaded_session(candidate, level or False)
    try:
        if session is not None:  # the emitter's load check opened it just now, at this level
            names = [o.name for o in session.get_outputs()]
            got = dict(zip(names, session.run(names, inputs)))
        else:
            got = _run_candidate(folder, candidate, inputs, tvm, level)
    except UserError as e:  # the CPU provider has no kernel for a GPU artifact's precision
        return done(reason=one_line(e))
    except Exception as e:  # noqa: BLE001
        if want is None:
            return done(reason=f"the original fails on the seeded inputs too ({original_error}); "
                               "give sizes that fit with --check --dim NAME=SIZE")
        from passctl.tools.ort_refusal import clean_message

        text = clean_message(e)
        node = _node_of_error(model, str(e), recorder)
        _raise_if_ort_level_bug(candidate, reference, shown, level, inputs, want, shapes, e)
        raise VerifyFailed(
            f"verify: the artifact fails in {runtime} on seeded inputs ({shapes}) where the "
            f"original runs: {text[:300]}; {_blame_text(recorder, node, 'it')}; the candidate is "
            "in the reproducer (--no-verify ships without this run)") from e

    bound = {k: v for k, v in plan.dims.items() if not k.endswith("]")}
    outputs: List[Dict[str, Any]] = []
    notes: List[str] = []
    declared = {v.name: v for v in model.graph.outputs}
    for name, value in declared.items():
        arr = got.get(name)
        problem = None
        if arr is None:
            problem = "is missing from the artifact's outputs"
        elif not isinstance(arr, np.ndarray):  # a sequence, map or optional: not judged here
            outputs.append({"name": name, "shape": None, "dtype": type(arr).__name__})
        else:
            ref = None if want is None else want.get(name)
            ref = ref if isinstance(ref, np.ndarray) else None
            dtype = _declared_dtype(value)
            declared_problem = (f"has dtype {arr.dtype.name} where {dtype} is declared"
                                if dtype is not None and arr.dtype.name != dtype else None) \
                or _shape_problem(value, arr, bound, None)
            if ref is None:
                problem = declared_problem
            elif ref.dtype != arr.dtype:
                problem = f"has dtype {arr.dtype.name} where the original's is {ref.dtype.name}"
            elif ref.shape != arr.shape:
                problem = f"has shape {list(arr.shape)} where the original's is {list(ref.shape)}"
            elif declared_problem is not None:  # the original's own declaration is off
                notes.append(f"output '{name}' {declared_problem}, as the original's does")
            problem = problem or _nonfinite_problem(arr, ref)
            outputs.append({"name": name, "shape": list(arr.shape), "dtype": arr.dtype.name})
        if problem is not None:
            node = value.producer
            if not tvm:
                _raise_if_ort_level_bug(candidate, reference, shown, level, inputs, want, shapes)
            raise VerifyFailed(
                f"verify: output '{name}' of the artifact {problem} on seeded inputs ({shapes}); "
                f"{_blame_text(recorder, node, f'{name!r}')}; the candidate is in the reproducer "
                "(--no-verify ships without this run)")
    extra = sorted(set(got) - set(declared))
    if extra:
        raise VerifyFailed(f"verify: the artifact returns undeclared outputs {extra}; the "
                           "candidate is in the reproducer")
    if not tvm and want is not None and level and level != "ORT_DISABLE_ALL":
        from passctl.support.ort_levels import values_problem

        if values_problem(got, want) is not None:  # ONNX Runtime's optimizer on the original?
            message = explain_level_breakage(candidate, reference, shown, level, inputs, want,
                                             shapes, values=True)
            if message is not None:
                raise UserError(message)
    if want is None:
        entry["original"] = f"fails on these inputs ({original_error}): shapes and dtypes " \
                            "checked against the declarations only"
    if notes:
        entry["notes"] = notes
    return done(ran=True, outputs=outputs)


def _raise_if_ort_level_bug(candidate: str, reference: str, shown: str, level: Optional[str],
                            inputs: Dict[str, Any], want: Optional[Dict[str, Any]], shapes: str,
                            error: Optional[BaseException] = None) -> None:
    """Raise :func:`explain_level_breakage`'s UserError when it finds ONNX Runtime to blame."""
    message = explain_level_breakage(candidate, reference, shown, level, inputs, want, shapes)
    if message is not None:
        raise UserError(message) from error


def checker_problem(path: str) -> Optional[str]:
    """``onnx.checker.check_model(path, full_check=True)``'s first error line (strict shape and type
    inference: a declared shape the graph contradicts is an error), or None when it accepts the
    model. Ops of domains the checker does not know (``com.microsoft``) are not judged by it, nor
    are ops ONNX Runtime registers in the default domain without an ONNX schema
    (``SimplifiedLayerNormalization``, which ``lower-onnxruntime`` writes and the report names in
    ``artifact.runtime_only_ops``): the checker stops at them ("No Op registered"), and the
    callers judge such an artifact by ONNX Runtime running it right unoptimized (fuzz seed
    fuse:8655)."""
    import re

    import onnx

    try:
        onnx.checker.check_model(path, full_check=True)
    except Exception as e:  # noqa: BLE001  (ValidationError, InferenceError)
        m = re.search(r"No Op registered for (\S+) with domain_version", str(e))
        if m and m.group(1) in _ort_default_domain_ops():
            return None
        return one_line(e)[:200]
    return None


def _ort_default_domain_ops() -> set:
    """Names of the ops ONNX Runtime registers in the default ONNX domain (its schemas)."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as state

        return {s.name for s in state.get_all_operator_schema() if s.domain in ("", "ai.onnx")}
    except Exception:  # noqa: BLE001  (an ONNX Runtime build without the schema list)
        return set()


def explain_level_breakage(candidate: str, reference: str, shown: str, level: Optional[str],
                           inputs: Dict[str, Any], want: Optional[Dict[str, Any]],
                           shapes: str = "", values: bool = False) -> Optional[str]:
    """After the artifact ``candidate`` failed at ONNX Runtime optimization ``level`` on
    ``inputs`` (it did not load or run, or an output has the wrong shape, dtype or NaN/inf): a
    one-line message for a UserError when ONNX Runtime's graph optimizer is to blame, else None
    (passctl's bug stands).

    ``want`` is the original's (``reference``'s) ``ORT_DISABLE_ALL`` outputs on ``inputs``, the
    reference of what is right (:func:`passctl.support.ort_levels.outputs_problem`: the same
    outputs, dtypes, shapes, and no NaN/inf where those are finite). ONNX Runtime is to blame when

    - the unchanged original is not right at ``level`` either (it fails, or an output's shape or
      dtype differs from its own unoptimized run: e.g. its (Simplified)LayerNormFusion drops the
      rank a broadcast constant adds), and both the original and the artifact are right at a lower
      level; or
    - the original is right at ``level`` but passctl's graph is valid (``onnx.checker`` full
      check) and right at ``ORT_DISABLE_ALL``, and right at a lower level: ONNX Runtime's
      optimizer breaks a valid graph that passctl wrote.

    ``values``: the artifact's values were off (shapes fine): the original is also not right at
    ``level`` when a float32 output is off its unoptimized run by more than
    :data:`passctl.support.ort_levels.LEVEL_RTOL` beyond what the float64 evaluation of the
    original explains (:func:`passctl.support.ort_levels.values_problem`; ONNX Runtime's
    optimizer disagreeing with itself: fuzz seed cleanup:7016, its LayerNorm fusion of a
    rank-raising keepdims=0 spelling); judged only where the original has a float64 evaluation
    (:func:`passctl.support.exact.float64_outputs`; not for quantized originals, whose levels
    round differently by design), and the lower level it names must be right by values too.

    The message names what breaks (output or ONNX Runtime's error), the highest level at which
    the outputs are right, and the ``--emit 'onnxruntime{optimization_level=...}'`` option that
    ships at it. passctl does not lower the level on its own: the level decides which fused
    kernels the artifact runs with, and the budgeted passes measured at ``level``.
    """
    from passctl.support.ort_levels import (emit_option, highest_right_level, level_problem,
                                            runs_with)

    if not level or level == "ORT_DISABLE_ALL" or want is None or not os.path.isfile(candidate):
        return None
    on = f" on seeded inputs ({shapes})" if shapes else ""
    artifact = runs_with(candidate, inputs)
    original = runs_with(reference, inputs)
    exact = None
    if values:
        from passctl.support.exact import float64_outputs
        from passctl.support.ort_levels import outputs_problem, values_problem

        try:
            at_level = original(level)
        except Exception:  # noqa: BLE001  (judged by level_problem below)
            at_level = None
        if at_level is not None and outputs_problem(at_level, want) is None \
                and values_problem(at_level, want) is None:
            return None  # the original is right at level (no float64 run needed)
        exact = float64_outputs(reference, inputs, check=want)
        if exact is None:
            return None
    broken = level_problem(original, level, want, exact)
    if broken is not None:
        works = highest_right_level(original, level, want, exact=exact,
                                    judge=lambda lv: level_problem(artifact, lv, want) is None)
        if works is None:
            return None
        return (f"{shown}: ONNX Runtime's graph optimizer breaks this model itself at {level}, the "
                f"level the artifact would ship with, even unchanged by passctl: there the "
                f"original {broken}{on}, while it runs right unoptimized; a bug of ONNX "
                f"Runtime, not of the model or passctl; the original's and the artifact's outputs "
                f"are right at {works}: compile with {emit_option(works)} to ship at that level")
    if values:
        return None  # the original is right at level: the artifact's values are --check's to judge
    if level_problem(artifact, "ORT_DISABLE_ALL", want) is not None:
        return None  # wrong as written: passctl's rewrite
    invalid = checker_problem(candidate)
    if invalid is not None:
        return None  # passctl wrote an invalid graph that only ORT_DISABLE_ALL tolerates
    problem = level_problem(artifact, level, want)
    works = highest_right_level(artifact, level, want)
    if problem is None or works is None:
        return None
    return (f"{shown}: ONNX Runtime's graph optimizer at {level}, the level the artifact would "
            f"ship with, breaks the compiled model: there it {problem}{on}, although passctl's "
            f"graph is valid (onnx.checker full check) and runs right at ORT_DISABLE_ALL, and the "
            f"original runs right at {level}; a bug of ONNX Runtime's optimizer that the compiled "
            f"graph triggers, not of passctl; the compiled model runs right at {works}: compile "
            f"with {emit_option(works)} to ship at that level")


def explain_with_seeded_inputs(candidate: str, model, reference: str, shown: str,
                               level: Optional[str], header, dims: Dict[str, int], seed: int,
                               overrides: Optional[Dict[str, Any]] = None,
                               values: bool = False) -> Optional[str]:
    """:func:`explain_level_breakage` on the verify run's seeded inputs (``seed``, ``dims``,
    ``overrides``), for a failure found without them: the emitter's load check refusing the
    artifact at ``level``, or ``--check`` failing on shapes or a run error. None when the inputs
    cannot be drawn or the original does not run on them. ``values``: as for
    :func:`explain_level_breakage` (``--check`` failed on numbers)."""
    from passctl.support.check import run_onnxruntime
    from passctl.support.inputs import draw_inputs, plan_inputs
    from passctl.tools.numeric_check import _candidate_dims

    if not level or level == "ORT_DISABLE_ALL":
        return None
    try:
        plan = plan_inputs(header, dim_values=_candidate_dims(os.path.dirname(candidate), model,
                                                              dims, False),
                           overrides=overrides or {})
        inputs = draw_inputs(plan, seed)
        want = run_onnxruntime(reference, inputs)
    except Exception:  # noqa: BLE001  (UserError for inputs, ORT's errors for the original)
        return None
    shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in inputs.items())
    return explain_level_breakage(candidate, reference, shown, level, inputs, want, shapes,
                                  values)
