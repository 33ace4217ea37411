"""``passctl compile``: load, run a pipeline, emit for a target, check, write report.json."""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

from passctl.ir.errors import UserError
from passctl.tools.cli import one_line
from passctl.tools.model_source import IR_TEXT_SUFFIX, load_model
from passctl.tools.report import (REPORT_SCHEMA, DelayedProgress, count_nodes, op_histogram,
                                  print_summary, write_report)

logger = logging.getLogger(__name__)


def default_out(model_path: str) -> str:
    """``./<model stem>.passctl``: in the current folder, never next to a packaged model."""
    stem = os.path.basename(model_path)
    for suffix in (".onnx", IR_TEXT_SUFFIX):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    return f"{stem}.passctl"


def parse_dims(items: List[str]) -> Dict[str, int]:
    """``["batch=2", "x[2]=48"]`` -> ``{"batch": 2, "x[2]": 48}``.

    Raises:
        UserError: an item is not ``NAME=SIZE`` with a positive integer size.
    """
    dims: Dict[str, int] = {}
    for item in items:
        name, sep, size = item.partition("=")
        if not sep or not name or not size.isdigit() or int(size) <= 0:
            raise UserError(f"--dim '{item}': expected NAME=SIZE with a positive integer size, "
                            "e.g. --dim batch=1")
        dims[name.strip()] = int(size)
    return dims


def load_input_file(path: Optional[str]) -> Dict[str, Any]:
    """Arrays by input name from an ``.npz`` file (the ``--inputs`` option of compile and run);
    empty without a path.

    Returns:
        ``{array name: numpy array}`` with every array read into memory.

    Raises:
        UserError: the file is missing or unreadable, is not an ``.npz`` (zip) archive (a single
            ``.npy`` array or a text file), holds no arrays, or holds an array that is not a numeric
            ``.npy`` (Python objects, damaged data); the message names the file and the array.
    """
    if not path:
        return {}
    import zipfile

    import numpy as np

    how = "write it with numpy.savez(path, name=array, ...) using the graph input names"
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError as e:
        raise UserError(f"--inputs '{path}': cannot read it ({e.strerror or e}); give an .npz file")
    if magic == b"\x93NUMPY":
        raise UserError(f"--inputs '{path}': a single array (.npy), not an .npz archive of arrays "
                        f"by input name; {how}")
    if not zipfile.is_zipfile(path):
        raise UserError(f"--inputs '{path}': not an .npz archive (not a zip file); {how}")
    arrays: Dict[str, Any] = {}
    try:
        with np.load(path, allow_pickle=False) as data:
            names = list(data.files)
            for name in names:
                try:
                    value = data[name]
                    if not isinstance(value, np.ndarray):  # a zip member that is no .npy: raw bytes
                        raise ValueError("no .npy header")
                    arrays[name] = value
                except ValueError as e:
                    if "allow_pickle" in str(e) or "pickled" in str(e):
                        problem = "holds Python objects (dtype object)"
                    else:
                        problem = f"is not a numeric .npy array ({one_line(e)})"
                    raise UserError(f"--inputs '{path}': array '{name}' {problem}; save numeric "
                                    f"arrays instead: {how}") from e
                except (OSError, EOFError, zipfile.BadZipFile) as e:
                    raise UserError(f"--inputs '{path}': array '{name}' is damaged "
                                    f"({one_line(e)}); {how}") from e
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise UserError(f"--inputs '{path}': not a readable .npz archive ({one_line(e)}); "
                        f"{how}") from e
    if not arrays:
        raise UserError(f"--inputs '{path}' holds no arrays (random inputs would be used "
                        f"instead); {how}")
    return arrays


class _ProgressInstrument:
    """Pass-manager instrument that drives the delayed progress bar."""

    def __init__(self, progress: DelayedProgress):
        self.progress = progress

    def before_pass(self, pass_, model, index) -> None:
        self.progress.update(f"{pass_.name}")

    def after_pass(self, pass_, model, record) -> None:
        self.progress.update(pass_.name, advance=1)


def _reference_model(model, path: str, workdir: str) -> str:
    """An ONNX file of the original model for the numeric check (the input itself when ONNX)."""
    if not path.endswith(IR_TEXT_SUFFIX):
        return path
    from passctl.ir.onnx_export import save

    ref = os.path.join(workdir, "reference.onnx")
    save(model, ref)
    return ref


def write_crash_folder(root: Optional[str], argv: List[str], error: BaseException,
                        model=None) -> str:
    """A reproducer for a failure outside the passes: the command, traceback and IR (when given).

    The folder is ``<root>/compile-XXXX`` (``root``: ``--reproducer-dir``, else a fresh folder under
    the system temp folder). It holds ``command.sh`` (re-runs the command, with the running
    interpreter, in the folder it was run from), ``traceback.txt`` and, with ``model``, ``model.pir`` (large constants in
    ``model.weights``).
    """
    from passctl.passes.instruments import passctl_command
    from passctl.tools.instrument_setup import default_reproducer_dir

    root = os.path.abspath(root or default_reproducer_dir())
    os.makedirs(root, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="compile-", dir=root)
    with open(os.path.join(folder, "command.sh"), "w") as f:
        f.write(f"cd {shlex.quote(os.getcwd())} || exit 1\n"
                + " ".join(shlex.quote(a) for a in passctl_command() + list(argv)) + "\n")
    with open(os.path.join(folder, "traceback.txt"), "w") as f:
        f.write("".join(traceback.format_exception(type(error), error, error.__traceback__)))
    if model is not None:
        try:
            from passctl.ir.printer import print_model

            text = print_model(model, weights_path=os.path.join(folder, "model.weights"))
            with open(os.path.join(folder, "model.pir"), "w") as f:
                f.write(text)
        except Exception:  # the reproducer must not hide the original error
            logger.exception("could not print the model into the reproducer")
    return folder


def _artifact_files(folder: str) -> Tuple[Optional[set], str]:
    """Names a passctl artifact in ``folder`` owns and its ``emitter`` from its ``report.json``
    (``(None, "")``: no passctl ``report.json`` there)."""
    import json

    from passctl.tools.report import REPORT_FILE

    try:
        with open(os.path.join(folder, REPORT_FILE)) as f:
            report = json.load(f)
    except (OSError, ValueError):
        return None, ""
    if not isinstance(report, dict) or report.get("schema") != REPORT_SCHEMA:
        return None, ""
    artifact = report.get("artifact") if isinstance(report.get("artifact"), dict) else {}
    files = artifact.get("files") if isinstance(artifact.get("files"), list) else []
    return {REPORT_FILE, *(str(f) for f in files)}, str(report.get("emitter", ""))


def _check_output_path(out: str, model_path: str) -> None:
    """Refuse, before any work, an output that would destroy something that is not an artifact.

    ``-o`` replaces the whole folder, so it must be new, empty, or a passctl artifact: a
    ``report.json`` of the passctl report schema and only plain files its emitter writes that
    the report lists (or that the emitter may add afterwards: ``model.onnx.data``, TensorRT's
    ``model.engine``).

    Raises:
        UserError: ``out`` exists and is not a real folder (a file, symbolic link, device node,
            FIFO or socket: see :func:`passctl.targets.base.refuse_non_folder_output`), is below
            a file, holds the input model, is the
            current folder, one of its ancestors or the home folder, or is a non-empty folder that
            is not a passctl artifact or holds something else besides (the first one is named).
    """
    from passctl.targets.base import refuse_non_folder_output

    shown = out
    out = os.path.abspath(out)
    refuse_non_folder_output(out, shown)
    parent = os.path.dirname(out)
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent) if os.path.dirname(parent) != parent else ""
    if parent and not os.path.isdir(parent):
        raise UserError(f"output '{shown}': '{parent}' is a file, not a folder; choose another -o")
    real_out, real_model = os.path.realpath(out), os.path.realpath(model_path)
    cwd, home = os.path.realpath(os.getcwd()), os.path.realpath(os.path.expanduser("~"))
    if os.path.commonpath([real_out, cwd]) == real_out or real_out == home:
        what = "the home folder" if real_out == home else "the current folder or one above it"
        raise UserError(f"output folder '{shown}' is {what} and -o replaces the whole folder; "
                        "choose a new or empty -o")
    if os.path.commonpath([real_out, real_model]) == real_out:
        raise UserError(f"output folder '{shown}' contains the input model '{model_path}' and would "
                        "replace it; choose another -o")
    if os.path.isdir(out):
        _refuse_foreign_entries(out, shown)
    if parent and not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"output '{shown}': cannot write in '{parent}' (permission denied); "
                        "choose a writable -o")


#: The files each emitter writes (model.engine: built later by build_engine.sh; the data file:
#: written when the weights are large), and those it may add after its report listed the others.
_EMITTER_FILES = {"onnxruntime": {"model.onnx", "model.onnx.data", "session.json"},
                  "tvm": {"manifest.json", "model.so", "model.params"},
                  "tensorrt": {"model.onnx", "model.onnx.data", "manifest.json", "precision.json",
                               "build_engine.sh", "model.engine"}}
_WRITTEN_LATER = {"model.onnx.data", "model.engine"}


def _refuse_foreign_entries(out: str, shown: str) -> None:
    """Refuse an existing non-empty folder ``out`` (``shown``: as the user gave it) unless it is a
    passctl artifact holding only plain files its emitter writes that its report lists (or that
    the emitter adds later: :data:`_WRITTEN_LATER`).

    Raises:
        UserError: ``out`` is not a passctl artifact, or holds something else (the first one, sorted
            by name, is named).
    """
    import stat

    names = sorted(os.listdir(out))
    listed, kind = _artifact_files(out)
    if names and listed is None:
        shown_names = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise UserError(f"output folder '{shown}' exists and is not a passctl artifact (holds "
                        f"{shown_names}); choose a new or empty -o")
    own = _EMITTER_FILES.get(kind, set().union(*_EMITTER_FILES.values()))
    for n in names:
        try:
            plain = stat.S_ISREG(os.lstat(os.path.join(out, n)).st_mode)
        except OSError:
            plain = False
        if not plain or (n != "report.json" and (n not in own or (
                n not in listed and n not in _WRITTEN_LATER))):
            what = "" if plain else " (not a plain file)"
            raise UserError(f"output folder '{shown}' is a passctl {kind or 'compile'} artifact "
                            f"but also holds '{n}'{what}, which passctl did not write; -o "
                            "replaces the whole folder: move it out or choose a new or empty -o")


def _default_rtol(args, flat, console) -> None:
    """Set ``args.check_bounds``: the bounds the numeric check (``--check``, ``--check-each``)
    applies, the one place the check's metric and tolerance are decided.

    ``args.check_bounds`` lists ``(metric, rtol, source)``: with ``--rtol``, ``[("max-rel", rtol,
    "--rtol")]``; else one bound per metric of the pipeline's amp (``mixed-precision``) and
    ``quantize-int8`` passes (``flat``: its passes, fixpoint groups flattened), that metric bounded
    by the pass's ``budget`` whatever its size (the largest budget when several passes share a
    metric; their outputs are meant to differ that much, measured the way the pass measured them),
    in pipeline order; without such a pass ``[("max-rel", DEFAULT_RTOL, "default")]``
    (:data:`passctl.support.check.DEFAULT_RTOL`). Says so when a budget is used."""
    from passctl.support.check import DEFAULT_RTOL

    if args.rtol is not None:
        args.check_bounds = [("max-rel", float(args.rtol), "--rtol")]
        return
    bounds: Dict[str, Any] = {}
    for p in flat:
        if p.name in ("mixed-precision", "quantize-int8"):
            metric, budget = p.options.metric, float(p.options.budget)
            if metric not in bounds or budget > bounds[metric][1]:
                bounds[metric] = (metric, budget, p.name)
    args.check_bounds = list(bounds.values()) or [("max-rel", DEFAULT_RTOL, "default")]
    if not bounds or not (args.check or args.check_each) or args.quiet:
        return
    if len(bounds) == 1:
        metric, rtol, source = args.check_bounds[0]
        said = (f"{metric} error {rtol:g}, the {_pass_word(source)} pass's budget under its "
                "metric")
    else:
        said = " and ".join(f"{m} error {r:g} (the {_pass_word(src)} pass's budget)"
                            for m, r, src in args.check_bounds)
    console.print(f"note: the check accepts {said} (give --rtol for a max-rel bound)",
                  markup=False, highlight=False)


def _pass_word(name: str) -> str:
    """How messages name a budget pass: ``amp`` or ``quantize``."""
    return "amp" if name == "mixed-precision" else "quantize"


def _calibrate_at(flat, sizes: Dict[str, int], console, quiet: bool) -> None:
    """Give the calibrating passes (amp's ``mixed-precision``, ``quantize-int8``) that have neither
    ``calib`` nor ``dims`` the input sizes the emitter builds for (a TensorRT profile's OPT sizes),
    so their random calibration feeds and their measured error are at the sizes the artifact runs
    at (the check runs there too). Says so unless ``quiet``."""
    if not sizes:
        return
    text = ";".join(f"{k}={v}" for k, v in sizes.items())
    for p in flat:
        if p.name in ("mixed-precision", "quantize-int8") and not p.options.calib \
                and not p.options.dims:
            p.options.dims = text
            if not quiet:
                console.print(f"note: {p.name} calibrates at the emitter's input sizes "
                              f"{text.replace(';', ', ')} (give {p.name}{{dims=...}} or calib= to "
                              "choose)", markup=False, highlight=False)


def _check_inputs(header, dims: Dict[str, int], overrides: Dict[str, Any],
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


def _check_writable_folder(folder: str, option: str) -> None:
    """Create ``folder`` if needed and prove a file can be written in it.

    Raises:
        UserError: ``folder`` (or a part of its path) is a file, or it cannot be created or
            written.
    """
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise UserError(f"{option} '{folder}' is a file; give a folder path")
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise UserError(f"{option} '{folder}': cannot write there ({e.strerror or e}); choose a "
                        "writable folder") from e


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


def run_compile(args, argv: List[str], console) -> Dict[str, Any]:
    """Run ``passctl compile`` for parsed ``args``; return the report that was written.

    Raises:
        UserError: bad model file, pipeline, target, emitter, option or input (exit 2).
        InternalError: a pass raised, broke the IR, the emitted model does not load, or the check
            failed (exit 3; carries the reproducer folder).
    """
    from passctl.passes.instruments import CheckEach
    from passctl.passes.manager import PassFailure, PassManager, VerifyError
    from passctl.passes.pipeline_text import build_pipeline, format_pipeline
    from passctl.targets import get_emitter, get_target
    from passctl.tools.cli import InternalError
    from passctl.tools.commands import load_plugins
    from passctl.support.inputs import load_header
    from passctl.tools.instrument_setup import build_instruments, instruments_report

    start = time.perf_counter()
    plugins = load_plugins(args.load)
    target = get_target(args.target)
    emitter = get_emitter(args.emit or target.default_emitter)
    emitter.preflight(target, check=bool(args.check))
    passes = build_pipeline(args.pipeline, target.name, emitter.name)
    flat = PassManager(passes).flat_passes()
    emitter.check_passes(flat)
    dims, overrides = parse_dims(args.dim), load_input_file(args.inputs)
    _default_rtol(args, flat, console)
    steps = 1 + len(passes) + 1 + 1 + int(args.check)  # load, passes, final dce, emit, check

    with DelayedProgress(console, total=steps) as progress, \
            tempfile.TemporaryDirectory(prefix="passctl-") as work:
        progress.update("loading the model")
        model, path = load_model(args.model)
        given_out = args.out or default_out(path)
        _check_output_path(given_out, path)
        out = os.path.abspath(given_out)
        _verify_input(model, path)
        hist_before, nodes_before = op_histogram(model), count_nodes(model.graph)
        reference = _reference_model(model, path, work)
        progress.update("loaded", advance=1)
        t_loaded = time.perf_counter()

        checking = bool(args.check or args.check_each)
        # The original's graph inputs, read once for --dim, --inputs, --check-each and --check.
        header = load_header(reference) if checking or dims or overrides else None
        _check_inputs(header, dims, overrides, checking)
        _calibrate_at(flat, emitter.input_sizes(model), console, args.quiet)
        _check_print_ir_names(args, flat)
        if args.dump_ir:
            _check_writable_folder(args.dump_ir, "--dump-ir")
        try:
            instruments = build_instruments(args, reference, header, dims, overrides) + [
                _ProgressInstrument(progress)]
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
            result = manager.run(model)
        except PassFailure as e:
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
            "model": {"path": os.path.abspath(path), "argument": args.model},
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

        def finalize(folder: str, info: Dict[str, Any]) -> None:
            t_emitted = time.perf_counter()
            progress.update("artifact written", advance=1)
            report["artifact"] = dict(info, path=out)
            report["check"] = None
            if args.check:
                progress.update("checking against the original", advance=1)
                report["check"] = _run_check(reference, header, os.path.join(folder, "model.onnx"),
                                             model, args, dims, overrides, known)
                for warning in report["check"]["warnings"]:
                    report["warnings"].append(warning)
                    print(f"passctl: warning: {warning}", file=sys.stderr)
            t_end = time.perf_counter()
            timing = dict(load_s=t_loaded - start, passes_s=t_passes - t_loaded,
                          emit_s=t_emitted - t_passes, check_s=t_end - t_emitted,
                          total_s=t_end - start)
            report["timing"] = {k: round(v, 4) for k, v in timing.items()}
            if report["check"] is not None and not report["check"]["ok"]:
                from passctl.tools.cli import CheckFailed

                failures = report["check"]["failures"]
                more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
                failed = next((b for b in report["check"]["bounds"] if not b["ok"]),
                              report["check"]["bounds"][0])
                bound = (f"--rtol (now {failed['rtol']:g}) or --atol"
                         if failed["source"] in ("--rtol", "default") else
                         f"the {_pass_word(failed['source'])} pass's budget (now "
                         f"{failed['metric']} {failed['rtol']:g}; calibrate at the sizes you "
                         "check, or give --rtol)")
                raise CheckFailed(f"numeric check failed: output {failures[0]}{more}; loosen "
                                  f"{bound}, or find the pass "
                                  "responsible with --check-each; the candidate and report.json "
                                  "are kept in the reproducer",
                                  _check_failure_folder(args, argv, model, report, folder))
            write_report(folder, report)

        progress.update(f"writing the {emitter.name} artifact")
        try:
            emitter.emit(model, target, out, finalize)
        except (UserError, InternalError):
            raise
        except Exception as e:
            from passctl.targets.base import EmitError

            if isinstance(e, EmitError):  # the emitter's ONNX Runtime load check
                _raise_if_ort_refuses_original(e, reference, path)
            raise InternalError(f"emitting for {target.name} with {emitter.name} failed: "
                                f"{type(e).__name__}: {e}",
                                write_crash_folder(args.reproducer_dir, argv, e, model)) from e
    if not args.quiet:
        print_summary(console, report)
    return report


def _raise_if_ort_refuses_original(error: BaseException, reference: str, path: str) -> None:
    """After ONNX Runtime failed on a model (the emitter's load check of its output, or
    ``--check-each``'s run of the original): when ONNX Runtime refuses the original model, the
    problem is the user's input, not passctl's.

    Raises:
        UserError: ONNX Runtime cannot load ``reference`` (the input, or the exported ``.pir``
            input); one line naming ``path``, the node and op, and what to do
            (:func:`passctl.tools.ort_refusal.explain_refusal`).
    """
    from passctl.tools.ort_refusal import explain_refusal

    message = explain_refusal(reference, path)
    if message is not None:
        raise UserError(message) from error


def _check_failure_folder(args, argv: List[str], model, report: Dict[str, Any],
                          folder: str) -> str:
    """Crash folder for a failed check: command, IR, report.json and the candidate model files."""
    crash = write_crash_folder(args.reproducer_dir, argv, RuntimeError("numeric check failed"),
                                model)
    write_report(crash, report)
    for name in os.listdir(folder):
        if name.startswith("model.onnx"):
            shutil.copy2(os.path.join(folder, name), os.path.join(crash, name))
    return crash


def _run_check(reference: str, header, candidate: str, model, args, dims, overrides,
               known: Optional[Tuple[Dict[str, Any], Dict[str, Any]]] = None) -> Dict[str, Any]:
    """The numeric check's report entry: inputs used, per-output errors, worst errors, ``ok``.

    Uses :mod:`passctl.support.check` (ONNX Runtime's CPU execution provider) on seeded inputs from
    ``make_inputs``: the reference (original) runs with graph optimizations off; an ONNX Runtime
    artifact's ``model.onnx`` runs with its ``session.json``'s ``graph_optimization_level``
    (``ORT_ENABLE_ALL``: what ships, e.g. QLinearConv kernels for a quantized cpu model) and
    ``optimization`` in the entry says so; any other ``model.onnx`` (a TensorRT artifact's, which
    TensorRT parses as written) runs unoptimized. An output passes when
    ``OutputDiff.ok(rtol, atol, metric)`` for every bound of ``args.check_bounds`` (set by
    :func:`_default_rtol`: ``--rtol`` under max-rel, or each budget pass's metric under its
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
    result = compare(want, _run_candidate(folder, candidate, inputs, tvm, level))
    entry = _judge(result, args.check_bounds, args.atol)
    single = [name for name, a in want.items() if getattr(a, "size", 0) == 1]
    if single and any(m == "cosine" for m, _, _ in args.check_bounds):
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


def _judge(result, bounds: List[Tuple[str, float, str]], atol: float) -> Dict[str, Any]:
    """``result`` (a :class:`passctl.support.check.CheckResult`) judged under every bound
    ``(metric, rtol, source)``: its ``to_dict`` under the first, each output's ``ok``, and ``ok``,
    ``bounds``, ``atol``, ``max_abs``, ``max_rel``, ``failures``, ``passed_on_atol``,
    ``metric_error`` of the check's report entry."""
    entry = result.to_dict(bounds[0][1], bounds[0][0])
    finite = [o for o in result.outputs.values() if o.problem is None]

    def passes(diff, atol: float) -> bool:
        return all(diff.ok(r, atol, m) for m, r, _ in bounds)

    for diff, item in zip(result.outputs.values(), entry["outputs"]):
        item["ok"] = passes(diff, atol)
    failures: List[str] = []
    for m, r, _ in bounds:
        failures += [f for f in result.failures(r, atol, m) if f not in failures]
    checked = [{"metric": m, "rtol": r, "source": src, "ok": result.ok(r, atol, m),
                "error": max((o.error(m) for o in finite), default=0.0)} for m, r, src in bounds]
    entry.update(
        ok=all(b["ok"] for b in checked), bounds=checked, atol=atol,
        max_abs=max((o.max_abs for o in finite), default=0.0),
        max_rel=result.max_rel if result.max_rel != float("inf") else "inf",
        failures=failures,
        passed_on_atol=[d.name for d in result.outputs.values()
                        if passes(d, atol) and not passes(d, 0.0)],
        metric_error=checked[0]["error"])
    return entry


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
