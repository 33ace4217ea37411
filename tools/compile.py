"""``passctl compile``: load, run a pipeline, emit for a target, check, write report.json.

The driver; the numeric check is :mod:`passctl.tools.numeric_check`, the ``-o`` safety checks
:mod:`passctl.tools.output_folder`, the crash reproducer :mod:`passctl.tools.reproducer`."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from passctl.ir.errors import UserError
from passctl.support.context import CompileContext
from passctl.support.dims import parse_dim_args
from passctl.support.errors import CheckFailed, EnvironmentFault, InternalError, one_line
from passctl.support.input_files import load_input_file
from passctl.tools.model_source import (IR_TEXT_SUFFIX, TorchSource, describe_model_argument,
                                        load_model, torch_source_of)
from passctl.tools.numeric_check import (bounds_note, calibration_feed, check_bounds, check_inputs,
                                         failure_message, run_check)
from passctl.tools.output_folder import check_output_path, check_writable_folder, default_out
from passctl.tools.report import (REPORT_SCHEMA, DelayedProgress, count_nodes, op_histogram,
                                  print_summary, write_report)
from passctl.tools.reproducer import check_failure_folder, write_crash_folder
from passctl.tools.verify_artifact import (TouchRecorder, VerifyFailed, blame_runtime_error,
                                           verify_artifact)

logger = logging.getLogger(__name__)


class _ProgressInstrument:
    """Pass-manager instrument that drives the delayed progress bar."""

    def __init__(self, progress: DelayedProgress):
        self.progress = progress

    def before_pass(self, pass_, model, index) -> None:
        self.progress.update(f"{pass_.name}")

    def after_pass(self, pass_, model, record) -> None:
        self.progress.update(pass_.name, advance=1)


def _work_prefix() -> str:
    """``passctl-work-<pid>.<host id>-``: the prefix of compile's temporary folder under the system temp
    folder; first removes those of killed runs (their process no longer runs)."""
    import re

    from passctl.targets.base import host_id, remove_dead_pid_folders

    remove_dead_pid_folders(tempfile.gettempdir(),
                            re.compile(r"passctl-work-(\d+)(?:\.([0-9a-f]{8}))?-[^/]*"))
    return f"passctl-work-{os.getpid()}.{host_id()}-"


def _reference_model(model, path: str, workdir: str) -> str:
    """An ONNX file of the original model for the numeric check (the input itself when ONNX)."""
    if not path.endswith(IR_TEXT_SUFFIX):
        return path
    from passctl.ir.onnx_export import save

    ref = os.path.join(workdir, "reference.onnx")
    save(model, ref)
    return ref


def _check_print_ir_names(args, flat) -> None:
    """``--print-ir-before/after`` must name passes of the pipeline (``flat``: its passes, fixpoint
    groups flattened) or be ``all``.

    Raises:
        UserError: a name matches no pass of the pipeline; the closest names are suggested.
    """
    import difflib

    names: List[str] = list(dict.fromkeys(p.name for p in flat))
    names += [] if "dce" in names else ["dce"]  # the final dce compile may add
    for option, given in (("--print-ir-before", args.print_ir_before),
                          ("--print-ir-after", args.print_ir_after)):
        for name in given:
            if name == "all" or name in names:
                continue
            close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise UserError(f"{option} '{name}' is not a pass of the pipeline: {hint}the pipeline "
                            f"runs {', '.join(names)} (or give 'all')")


def _verify_input(model, path: str) -> None:
    """Verify the imported model before any pass (an invalid input is the user's, not a crash).

    Raises:
        UserError: the graph has no outputs, or the verifier finds an error; the message is its
            first error, naming the node.
    """
    from passctl.ir.verifier import verify

    if not model.graph.outputs:
        raise UserError(f"{path}: the graph declares no outputs, so every node is dead code and "
                        "there is nothing to compile; add the values the model returns to "
                        "graph.output")
    errors = [d for d in verify(model, check_output_types=False) if d.severity == "error"]
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise UserError(f"{path}: invalid model: {errors[0].kind}: {errors[0].message}{more}; "
                        f"`passctl verify {path}` lists every problem")


def run_compile(args, argv: List[str], console, keep_model=None) -> Dict[str, Any]:
    """Run ``passctl compile`` for parsed ``args``; return the report that was written.

    ``args.model`` may also be an object (a :class:`passctl.ir.Model`, a PyTorch model or
    :class:`passctl.tools.model_source.TorchSource`: :func:`passctl.tools.api.compile`);
    ``keep_model``, when given, is called with the compiled IR once the artifact is written.

    Raises:
        UserError: bad model file, pipeline, target, emitter, option or input (exit 2).
        InternalError: a pass raised, broke the IR, the emitted model does not load, or the check
            failed (exit 3; carries the reproducer folder).
    """
    from passctl.passes.instruments import CheckEach
    from passctl.passes.manager import PassFailure, PassManager, VerifyError
    from passctl.passes.pipeline_text import build_pipeline, format_pipeline
    from passctl.support.inputs import load_header
    from passctl.targets import get_emitter, get_target
    from passctl.tools.commands import load_plugins
    from passctl.tools.instrument_setup import build_instruments, instruments_report

    start = time.perf_counter()
    plugins = load_plugins(args.load)
    target = get_target(args.target)
    emitter = get_emitter(args.emit or target.default_emitter)
    emitter.preflight(target, check=bool(args.check))
    context = CompileContext(target=target, emitter=emitter.name,
                             artifact_optimization=getattr(emitter, "optimization_level", ""))
    passes = build_pipeline(args.pipeline, target.name, emitter.name, context=context)
    flat = PassManager(passes).flat_passes()
    emitter.check_passes(flat)
    if args.check or args.check_each:
        args.inputs = args.inputs or calibration_feed(args.rtol, flat, console, args.quiet)
    dims, overrides = parse_dim_args(args.dim), load_input_file(args.inputs)
    context.check_bounds = check_bounds(args.rtol, flat)
    note = bounds_note(context.check_bounds)
    if note and (args.check or args.check_each) and not args.quiet:
        console.print(note, markup=False, highlight=False)
    verifying = getattr(args, "verify", True)
    # load, passes, final dce, emit, verify, check
    steps = 1 + len(passes) + 1 + 1 + int(verifying) + int(args.check)

    with DelayedProgress(console, total=steps) as progress, \
            tempfile.TemporaryDirectory(prefix=_work_prefix()) as work:
        progress.update("loading the model")
        torch_source = torch_source_of(args.model)
        model, path = load_model(torch_source or args.model, work)
        if torch_source is not None and torch_source.inputs and not args.inputs:
            overrides = torch_source.feeds()  # the check runs on the module's example inputs
        given_out = args.out or default_out(
            args.model.rpartition(":")[0] if torch_source is not None and isinstance(
                args.model, str) else path if isinstance(args.model, str) else "model.onnx")
        check_output_path(given_out, path)
        out = os.path.abspath(given_out)
        _verify_input(model, path)
        hist_before, nodes_before = op_histogram(model), count_nodes(model.graph)
        from passctl.targets.onnx_file import weight_bytes

        original_bytes = weight_bytes(model.graph)  # dims only: reads no weight
        reference = _reference_model(model, path, work)
        progress.update("loaded", advance=1)
        t_loaded = time.perf_counter()

        checking = bool(args.check or args.check_each)
        # The original's graph inputs, read once for --dim, --inputs, --check-each and --check.
        header = load_header(reference) if checking or dims or overrides else None
        check_inputs(header, dims, overrides, checking)
        context.input_sizes = emitter.input_sizes(model)
        for p in flat:  # the passes take the input sizes the emitter builds for (calibration)
            for text in p.configure(context):
                if not args.quiet:
                    console.print(f"note: {text}", markup=False, highlight=False)
        _check_print_ir_names(args, flat)
        if args.dump_ir:
            check_writable_folder(args.dump_ir, "--dump-ir")
        try:
            recorder = TouchRecorder() if verifying else None  # which pass touched each node
            instruments = build_instruments(args, context.check_bounds, reference, header, dims,
                                            overrides) + [_ProgressInstrument(progress)] + (
                                                [recorder] if recorder is not None else [])
        except UserError:
            raise
        except Exception as e:  # --check-each runs the original in ONNX Runtime, which may refuse it
            _raise_if_ort_refuses_original(e, reference, path)
            raise
        known = next(((i.inputs, i.reference) for i in instruments  # --check-each's original run
                      if isinstance(i, CheckEach)), None)
        manager = PassManager(passes, verify_each=args.verify_each, instruments=instruments,
                              final_dce=True)
        try:
            with context:
                result = manager.run(model)
        except PassFailure as e:
            _raise_if_environment_fault(e, e.reproducer)
            raise InternalError(str(e), e.reproducer) from e
        except VerifyError as e:
            if e.pass_name is None:
                raise UserError(f"{path}: {e}") from e
            raise InternalError(str(e), write_crash_folder(args.reproducer_dir, argv, e,
                                                            model)) from e
        t_passes = time.perf_counter()
        ran = list(passes)
        if result.records and result.records[-1].name == "dce" and (
                not flat or flat[-1].name != "dce"):  # the manager's final dce
            from passctl.passes.registry import get_pass

            ran.append(get_pass("dce")())

        report: Dict[str, Any] = {
            "schema": REPORT_SCHEMA,
            "command": ["passctl"] + list(argv),
            "model": {"path": (os.path.abspath(args.model.rpartition(":")[0])
                               if torch_source is not None and isinstance(args.model, str) else
                               None if torch_source is not None else os.path.abspath(path)),
                      "argument": describe_model_argument(args.model),
                      "source": "pytorch" if torch_source is not None else "file"},
            "target": target.to_dict(),
            "emitter": emitter.name,
            "plugins": plugins,
            "pipeline": {"text": args.pipeline, "as_run": format_pipeline(ran),
                         "passes": [p.name for p in ran]},
            "passes": [{"index": r.index, "name": r.name, "time_ms": round(r.time_ms, 3),
                        "modified": r.modified, "stats": r.stats, "round": r.round}
                       for r in result.records],
            "warnings": list(result.warnings),
            "nodes": {"before": nodes_before, "after": count_nodes(model.graph)},
            "op_histogram": {"before": hist_before, "after": op_histogram(model)},
        }
        report.update(instruments_report(instruments))
        report["provenance"] = provenance_table(model)

        def finalize(folder: str, info: Dict[str, Any]) -> None:
            t_emitted = time.perf_counter()
            progress.update("artifact written", advance=1)
            report["artifact"] = dict(info, path=out)
            report["check"] = None
            report["verify"] = {"ran": False, "reason": "--no-verify"}
            verified = None
            if not verifying:  # release the session the emitter's load check kept for it
                from passctl.targets.onnx_file import take_loaded_session

                take_loaded_session("", False)
            else:
                progress.update("verifying the artifact on seeded inputs", advance=1)
                try:
                    report["verify"], verified = verify_artifact(
                        folder, model, reference, header or load_header(reference), dims,
                        args.seed, recorder, known,
                        torch_source.feeds() if torch_source is not None else None, shown=path,
                        original_weight_bytes=original_bytes)
                except VerifyFailed as e:
                    report["verify"] = {"ran": True, "ok": False, "error": str(e)}
                    e.reproducer = check_failure_folder(args, argv, model, report, folder,
                                                        "the verify run failed")
                    raise
            t_verified = time.perf_counter()
            if args.check:
                progress.update("checking against the original", advance=1)
                try:
                    report["check"] = run_check(reference, header,
                                                os.path.join(folder, "model.onnx"), model, args,
                                                context.check_bounds, dims, overrides,
                                                known or verified)
                except UserError:
                    raise
                except Exception as e:  # the artifact fails to run (--no-verify let it through)
                    _raise_if_ort_level_bug(folder, model, reference, path, header, dims, args,
                                            overrides, e)
                    raise
                if not report["check"]["ok"]:  # ONNX Runtime's optimizer on the original?
                    _raise_if_ort_level_bug(folder, model, reference, path, header, dims, args,
                                            overrides, values=not any(
                                                o.get("problem")
                                                for o in report["check"].get("outputs", [])))
                if torch_source is not None and torch_source.inputs:
                    report["check"]["torch"] = torch_eager_check(
                        torch_source, folder, context.check_bounds, args.atol)
                    report["check"]["ok"] = report["check"]["ok"] and report["check"]["torch"]["ok"]
                for warning in report["check"]["warnings"]:
                    report["warnings"].append(warning)
                    print(f"passctl: warning: {warning}", file=sys.stderr)
            t_end = time.perf_counter()
            timing = dict(load_s=t_loaded - start, passes_s=t_passes - t_loaded,
                          emit_s=t_emitted - t_passes, verify_s=t_verified - t_emitted,
                          check_s=t_end - t_verified,
                          total_s=t_end - start)
            report["timing"] = {k: round(v, 4) for k, v in timing.items()}
            if report["check"] is not None and not report["check"]["ok"]:
                message = failure_message(report["check"], context.check_bounds)
                eager = report["check"].get("torch")
                if eager is not None and not eager["ok"]:
                    message = torch_failure_message(eager)
                raise CheckFailed(message,
                                  check_failure_folder(args, argv, model, report, folder))
            write_report(folder, report)
            if keep_model is not None:
                keep_model(model)

        progress.update(f"writing the {emitter.name} artifact")
        try:
            emitter.emit(model, target, out, finalize)
        except (UserError, InternalError, EnvironmentFault):
            raise
        except Exception as e:
            from passctl.targets.base import EmitError

            blame = ""
            if isinstance(e, EmitError):  # the emitter's ONNX Runtime load check
                _raise_if_ort_refuses_original(e, reference, path, emitter)
                _raise_if_ort_refuses_artifact(e, model, reference, path, emitter, header, dims,
                                               args, overrides, work)
                blame = blame_runtime_error(model, e, recorder)
            raise InternalError(f"emitting for {target.name} with {emitter.name} failed: "
                                f"{type(e).__name__}: {one_line(e)}"
                                + (f"; {blame}" if blame else ""),
                                write_crash_folder(args.reproducer_dir, argv, e, model)) from e
        finally:
            from passctl.targets.onnx_file import take_loaded_session

            take_loaded_session("", False)  # release the load check's session, if still kept
    if not args.quiet:
        print_summary(console, report)
    return report


def provenance_table(model) -> List[Dict[str, Any]]:
    """Per compiled node: its name, op and provenance (the source nodes it came from: ONNX node
    names, or module paths such as ``layers.0.q_proj/linear`` for a PyTorch model)."""
    return [{"node": n.name, "op": n.op_type, "from": list(n.provenance)} for n in model.graph]


def torch_eager_check(source: TorchSource, folder: str, bounds, atol: float) -> Dict[str, Any]:
    """The artifact in ``folder`` against the PyTorch model's own eager outputs on its example
    inputs, under the numeric check's ``bounds`` (``--rtol``, or the budget passes' metrics).

    Runs the artifact as ``passctl run`` does (ONNX Runtime with its ``session.json``) and the
    module under ``torch.no_grad()``; outputs pair in order; errors are
    :class:`passctl.support.check.OutputDiff`'s (max-rel against the output's largest magnitude,
    NaN/inf mismatches counted). Returns ``{"ok", "metric", "rtol", "outputs":
    [OutputDiff.to_dict()]}`` (``metric`` / ``rtol``: the first bound).
    """
    from passctl.frontends.torch_module import torch_outputs
    from passctl.support.check import compare
    from passctl.tools.run_artifact import open_artifact

    got = open_artifact(folder).run_checked(source.feeds(), folder)
    want = dict(zip(got, torch_outputs(source.model, source.inputs)))
    result = compare(want, got)
    ok = len(got) == len(want) and all(result.ok(b.rtol, atol, b.metric) for b in bounds)
    return {"ok": ok, "metric": bounds[0].metric, "rtol": bounds[0].rtol,
            "outputs": [d.to_dict() for d in result.outputs.values()]}


def torch_failure_message(eager: Dict[str, Any]) -> str:
    """One line for a failed :func:`torch_eager_check`: the worst output and its error."""
    key = eager["metric"].replace("-", "_")
    bad = [r for r in eager["outputs"] if r["problem"] or r["nonfinite_mismatch"]
           or (key in r and float(r[key]) > eager["rtol"])]
    if not bad:
        return "check failed: the artifact returns a different number of outputs than the module"
    r = bad[0]
    what = r["problem"] or (f"{r['nonfinite_mismatch']} NaN/inf positions differ"
                            if r["nonfinite_mismatch"] else
                            f"{eager['metric']} {float(r[key]):.3g} > {eager['rtol']:g}")
    return (f"check failed against the PyTorch module's eager outputs: output '{r['name']}': "
            f"{what}")


def _raise_if_environment_fault(error: BaseException, reproducer) -> None:
    """A pass that failed because the disk is full (or a quota is exhausted): remove the crash
    reproducer the pass manager's instrument wrote for it (and its default parent folder when
    that is left empty), and raise the environment's error.

    Raises:
        EnvironmentFault: ``error`` was caused by a full disk
            (:func:`passctl.support.errors.environment_fault`).
    """
    import shutil

    from passctl.support.errors import EnvironmentFault, environment_fault, fault_message

    fault = environment_fault(error)
    if fault is None:
        return
    if reproducer and os.path.isdir(reproducer):
        shutil.rmtree(reproducer, ignore_errors=True)
        parent = os.path.dirname(reproducer)
        if os.path.basename(parent).startswith("passctl-crash-"):
            try:
                os.rmdir(parent)  # only when empty
            except OSError:
                pass
    raise EnvironmentFault(fault_message(fault)) from error


def _raise_if_ort_refuses_original(error: BaseException, reference: str, path: str,
                                   emitter=None) -> None:
    """After ONNX Runtime failed on a model (the emitter's load check of its output, or
    ``--check-each``'s run of the original): when ONNX Runtime refuses the original model, the
    problem is the user's input, not passctl's.

    Raises:
        UserError: ONNX Runtime cannot load ``reference`` (the input, or the exported ``.pir``
            input); one line naming ``path``, the node and op, and what to do
            (:func:`passctl.tools.ort_refusal.explain_refusal`); or, for an ONNX Runtime
            ``emitter`` (its ``optimization_level``), ONNX Runtime's optimizer refuses the
            original at the shipped level but a lower level loads it: the message names that
            level and the ``--emit`` option to ship at it
            (:func:`passctl.tools.ort_refusal.explain_level_refusal`).
    """
    from passctl.tools.ort_refusal import explain_refusal

    message = explain_refusal(reference, path)
    level = getattr(emitter, "optimization_level", None)
    if message is None and level is not None:  # refused only by ORT's optimizer at that level
        from passctl.tools.ort_refusal import explain_level_refusal

        message = explain_level_refusal(reference, path, level)
    if message is not None:
        raise UserError(message) from error


def _raise_if_ort_level_bug(folder: str, model, reference: str, path: str, header, dims, args,
                            overrides, error: Optional[BaseException] = None,
                            values: bool = False) -> None:
    """``--check`` found an artifact output of the wrong shape or dtype (or, with ``values``,
    numbers off the bound), or the artifact failed to run: when ONNX Runtime's optimizer at the
    artifact's level is to blame (:func:`passctl.tools.verify_artifact.explain_level_breakage`,
    on the verify run's seeded inputs; with ``values``, the original itself off its unoptimized
    run at that level), raise its UserError."""
    from passctl.support.inputs import load_header
    from passctl.tools.numeric_check import _session_optimization
    from passctl.tools.verify_artifact import explain_with_seeded_inputs

    message = explain_with_seeded_inputs(os.path.join(folder, "model.onnx"), model, reference,
                                         path, _session_optimization(folder),
                                         header or load_header(reference), dims, args.seed,
                                         overrides, values)
    if message is not None:
        raise UserError(message) from error


def _raise_if_ort_refuses_artifact(error: BaseException, model, reference: str, path: str,
                                   emitter, header, dims, args, overrides, work: str) -> None:
    """The emitter's load check refused the compiled model at its ONNX Runtime optimization level
    although the original loads there: when the compiled graph is valid and runs right at a lower
    level, ONNX Runtime's optimizer is to blame, not passctl (its level-3 rewrites fail on some
    valid graphs with "Failed to find node output or a constant initializer producing output").

    Raises:
        UserError: one line naming the level, ONNX Runtime's refusal and the ``--emit`` option of
            the highest level at which the compiled model runs right
            (:func:`passctl.tools.verify_artifact.explain_level_breakage` on a copy of the
            artifact's ``model.onnx`` written to ``work``).
    """
    level = getattr(emitter, "optimization_level", None)
    if not level or level == "ORT_DISABLE_ALL":
        return
    from passctl.ir.onnx_export import save
    from passctl.support.inputs import load_header
    from passctl.tools.verify_artifact import explain_with_seeded_inputs

    folder = os.path.join(work, "refused-artifact")
    os.makedirs(folder, exist_ok=True)
    candidate = os.path.join(folder, "model.onnx")
    try:
        save(model, candidate)
    except Exception:  # noqa: BLE001  (over 2 GB inline: the crash report stands)
        return
    message = explain_with_seeded_inputs(candidate, model, reference, path, level,
                                         header or load_header(reference), dims, args.seed,
                                         overrides)
    if message is not None:
        raise UserError(message) from error
