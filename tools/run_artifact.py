"""``passctl run ARTIFACT``: run an ONNX Runtime, TVM or TensorRT artifact on given or seeded inputs, time it."""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
import time
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from passctl.ir.errors import UserError
from passctl.support.errors import one_line

logger = logging.getLogger(__name__)


def add_parser(sub) -> None:
    """Register the ``run`` subcommand on the CLI's subparsers object."""
    p = sub.add_parser("run", help="run an artifact (ONNX Runtime, TVM, or a TensorRT artifact's "
                                   "model.onnx) and print outputs and latency")
    p.add_argument("artifact", help="an artifact folder written by passctl compile")
    p.add_argument("--inputs", metavar="FILE.npz", help="arrays by input name (default: seeded random)")
    p.add_argument("--runs", type=int, default=10, help="timed runs; the median is printed (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs first (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                   help="size of a symbolic input dimension (ONNX Runtime artifacts; repeatable)")
    p.add_argument("--save-outputs", metavar="FILE.npz", help="write the outputs to FILE.npz")


def artifact_kind(folder: str) -> str:
    """``"tvm"``, ``"tensorrt"`` or ``"onnxruntime"`` from the files in ``folder``.

    A ``manifest.json`` of a TVM or TensorRT artifact schema makes it that kind; else a
    ``session.json`` makes it an ONNX Runtime artifact.

    Raises:
        UserError: ``folder`` is not a folder, holds neither artifact, or its only
            ``manifest.json`` is unreadable, not JSON, or has a missing or unknown ``schema``.
    """
    return _read_artifact(folder)[0]


def _read_artifact(folder: str) -> Tuple[str, Optional[dict]]:
    """:func:`artifact_kind` and the manifest it read (None for an ONNX Runtime artifact): the
    one read of ``manifest.json`` per run."""
    from passctl.targets.tensorrt.emit import MANIFEST_SCHEMA as TRT_SCHEMA
    from passctl.targets.tvm.runtime import MANIFEST_FILE, MANIFEST_SCHEMA as TVM_SCHEMA
    from passctl.targets.tvm.runtime import read_manifest

    if not os.path.isdir(folder):
        raise UserError(f"artifact '{folder}' is not a folder; give the -o folder of passctl compile")
    data, problem = None, None
    if os.path.lexists(os.path.join(folder, MANIFEST_FILE)):
        try:
            data = read_manifest(folder)
        except OSError as e:
            problem = f"cannot be read ({e.strerror})"
        except ValueError:
            problem = "is not valid JSON"
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema in (TVM_SCHEMA, TRT_SCHEMA):
        return ("tvm" if schema == TVM_SCHEMA else "tensorrt"), data
    if os.path.isfile(os.path.join(folder, "session.json")):
        return "onnxruntime", None
    if problem is not None:
        raise _damaged(folder, MANIFEST_FILE, problem)
    if data is not None:
        known = f"this passctl reads '{TVM_SCHEMA}' (TVM) and '{TRT_SCHEMA}' (TensorRT)"
        if schema is None:
            raise _damaged(folder, MANIFEST_FILE, f"has no 'schema' entry ({known})")
        raise _damaged(folder, MANIFEST_FILE, f"has the unknown schema {schema!r} ({known})")
    raise UserError(f"artifact '{folder}' has neither session.json (ONNX Runtime) nor a TVM or "
                    f"TensorRT {MANIFEST_FILE}; give the -o folder of passctl compile")


def _damaged(folder: str, name: str, what: str) -> UserError:
    """The one-line error for a damaged artifact file: ``artifact 'F': NAME WHAT; re-run ...``."""
    return UserError(f"artifact '{folder}': {name} {what}; re-run passctl compile to write the "
                     "artifact again")


def _load_header(folder: str):
    """The artifact's ``model.onnx`` without its weights (the inputs for ``make_inputs``): external
    data is not read and embedded initializers' data is dropped, so the runner does not hold a
    second copy of the weights while it times the session.

    Raises:
        UserError: ``model.onnx`` is missing or not an ONNX file.
    """
    import onnx
    from google.protobuf.message import DecodeError

    from passctl.support.inputs import drop_initializer_data

    try:
        proto = onnx.load(os.path.join(folder, "model.onnx"), load_external_data=False)
    except FileNotFoundError:
        raise _damaged(folder, "model.onnx", "is missing") from None
    except (DecodeError, OSError, ValueError):
        raise _damaged(folder, "model.onnx", "is not a valid ONNX file") from None
    return drop_initializer_data(proto)


def _ort_error(e: BaseException) -> bool:
    """True for the exceptions ONNX Runtime raises when a model does not load."""
    return type(e).__module__.startswith("onnxruntime")


class _Runner:
    """One loaded artifact: its input declarations (an ONNX header for make_inputs) and a run()."""

    def __init__(self, folder: str):
        """Load the artifact in ``folder``.

        Raises:
            UserError: not an artifact, a damaged file (named, with "re-run passctl compile"), or
                apache-tvm missing for a TVM artifact.
        """
        import onnx

        self.kind, self.manifest = _read_artifact(folder)
        if self.kind == "tvm":
            from passctl.targets.tvm.runtime import load_artifact

            try:
                self.tvm = load_artifact(folder)
                graph_inputs = [onnx.helper.make_tensor_value_info(
                    i["name"], onnx.helper.np_dtype_to_tensor_dtype(np.dtype(i["dtype"])),
                    i["shape"]) for i in self.tvm.manifest["inputs"]]
            except ImportError as e:
                raise UserError(f"artifact '{folder}' is a TVM artifact; running it needs apache-tvm "
                                f"(pip install -e '.[tvm]' in a passctl clone): {e}") from e
            except (KeyError, TypeError, ValueError) as e:
                raise _damaged(folder, "manifest.json", f"lacks an entry or has a wrong one "
                               f"({type(e).__name__}: {one_line(e)[:200]})") from None
            self.header = onnx.helper.make_model(onnx.helper.make_graph([], "inputs", graph_inputs, []))
            return
        self.header = _load_header(folder)
        try:
            if self.kind == "tensorrt":  # its model.onnx (the network TensorRT parses) on the CPU
                from passctl.support.check import cpu_session

                self.session = cpu_session(os.path.join(folder, "model.onnx"), optimize=True)
            else:
                from passctl.targets.onnxruntime import create_session

                try:
                    self.session = create_session(folder)
                except (KeyError, TypeError, ValueError, AttributeError) as e:
                    import json

                    what = ("is not valid JSON" if isinstance(e, json.JSONDecodeError) else
                            "lacks an entry or has a wrong one "
                            f"({type(e).__name__}: {one_line(e)[:200]})")
                    raise _damaged(folder, "session.json", what) from None
        except Exception as e:
            if not _ort_error(e):
                raise
            raise _damaged(folder, "model.onnx", "does not load in ONNX Runtime "
                           f"({one_line(e)[:200]})") from None

    def run(self, feeds: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
        if self.kind == "tvm":
            return self.tvm.run(feeds)
        names = [o.name for o in self.session.get_outputs()]
        return dict(zip(names, self.session.run(None, dict(feeds))))

    def run_checked(self, feeds: Mapping[str, np.ndarray], folder: str) -> Dict[str, np.ndarray]:
        """:meth:`run`, with inputs that do not fit reported as the user's.

        Raises:
            UserError: the runtime refuses the inputs (names the artifact folder).
        """
        try:
            return self.run(feeds)
        except Exception as e:
            if not isinstance(e, (KeyError, ValueError)) and not _is_ort_input_error(e):
                raise
            raise UserError(f"artifact '{folder}': the inputs do not fit: {one_line(e)}") from e


def open_artifact(folder: str) -> _Runner:
    """The artifact in ``folder``, loaded for running (``_Runner.run`` / ``run_checked``).

    Raises:
        UserError: as ``_Runner``: not an artifact, damaged, or apache-tvm missing.
    """
    return _Runner(folder)


def summarize(array: np.ndarray) -> str:
    """One line: shape, dtype and (for numbers) min / max / mean / std of ``array``."""
    head = f"{list(array.shape)} {array.dtype}"
    if array.size == 0 or not np.issubdtype(array.dtype, np.number):
        return head
    a = array.astype(np.float64)
    return f"{head}  min {a.min():.6g}  max {a.max():.6g}  mean {a.mean():.6g}  std {a.std():.6g}"


def run_artifact(folder: str, inputs: Optional[str] = None, runs: int = 10, warmup: int = 2,
                 seed: int = 0, dims: Optional[Mapping[str, int]] = None
                 ) -> Tuple[str, Dict[str, np.ndarray], List[float]]:
    """Load ``folder``, run it ``warmup`` + ``runs`` times on the inputs; return what it printed.

    Returns:
        ``(kind, outputs, latencies_ms)``: the artifact kind, the outputs of the last run by name,
        and the wall-clock milliseconds of each timed run.

    Without ``dims``, a TensorRT artifact's random inputs take its optimization profile's OPT sizes.

    Raises:
        UserError: not an artifact, unreadable ``inputs``, ``runs`` < 1, or inputs that do not fit.
    """
    from passctl.support.input_files import load_input_file
    from passctl.support.inputs import check_dim_names, make_inputs

    if runs < 1 or warmup < 0:
        raise UserError(f"--runs must be >= 1 and --warmup >= 0 (got {runs}, {warmup})")
    runner = _Runner(folder)
    if dims:
        check_dim_names(runner.header, dims)
    profile = {}  # a TensorRT artifact's optimization profile: the sizes its engine takes
    if runner.kind == "tensorrt":
        profile = runner.manifest.get("optimization_profile") or {}
    if not dims and profile:
        dims = _opt_dims(profile)
    feeds = make_inputs(runner.header, seed=seed, dim_values=dims, overrides=load_input_file(inputs))
    _warn_outside_profile(profile, feeds)
    if runner.kind == "onnxruntime":
        _warn_isa(folder, runner.header)
    outputs = runner.run_checked(feeds, folder)  # the first run says when the inputs do not fit
    for _ in range(max(warmup - 1, 0)):
        runner.run(feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        outputs = runner.run(feeds)
        times.append((time.perf_counter() - start) * 1e3)
    return runner.kind, outputs, times


_INT8_OPS = ("DequantizeLinear", "QLinearConv", "QLinearMatMul", "QGemm", "MatMulInteger",
             "ConvInteger", "DynamicQuantizeMatMul")


def _warn_isa(folder: str, header) -> None:
    """Warn when an ONNX Runtime artifact with int8 layers was built for a CPU whose int8 kernels
    accumulate in int32 (VNNI, AMX, Arm: 8-bit weights) and this CPU's saturate (x86 without VNNI),
    or for another architecture: its error is then not the one measured when it was compiled
    (:mod:`passctl.support.cpu_isa`). Nothing for artifacts without int8 or without a recorded ISA.
    """
    import json

    from passctl.support.cpu_isa import CpuIsa, host_isa
    from passctl.targets.onnxruntime.emit import SESSION_FILE

    with open(os.path.join(folder, SESSION_FILE)) as f:
        recorded = (json.load(f).get("target") or {}).get("isa")
    if not recorded or not any(n.op_type in _INT8_OPS for n in header.graph.node):
        return
    built, host = CpuIsa.from_dict(recorded), host_isa()
    if built.arch != host.arch:
        logger.warning("artifact '%s' was built for %s (%s) and runs on %s: its int8 error was "
                       "measured for the other CPU; recompile with --target cpu here", folder,
                       built.arch, built.name, host.arch)
    elif host.u8s8_saturates and not built.u8s8_saturates:
        missing = ", ".join(built.missing_on(host)) or built.name
        logger.warning("artifact '%s' was built for a CPU with %s (8-bit int8 weights); this CPU "
                       "(%s) lacks %s, and ONNX Runtime's int8 kernels here add pairs of products "
                       "in saturating int16: expect a larger error than compile measured; "
                       "recompile with --target cpu (7-bit weights) on this machine", folder,
                       built.name, host.name, missing)


def _warn_outside_profile(profile: Mapping[str, Dict[str, List[int]]],
                          feeds: Mapping[str, np.ndarray]) -> None:
    """Warn when an input's shape lies outside a TensorRT artifact's optimization ``profile`` (its
    manifest's ``{input: {"min", "opt", "max"}}``): its model.onnx runs here, but the engine would
    refuse that shape."""
    for name, rows in profile.items():
        shape = list(np.shape(feeds.get(name, ())))
        if len(shape) == len(rows["min"]) and not all(
                lo <= d <= hi for d, lo, hi in zip(shape, rows["min"], rows["max"])):
            logger.warning("input '%s' has shape %s, outside the engine's optimization profile "
                           "(min %s, max %s): model.onnx runs it here, TensorRT's engine would "
                           "refuse it", name, shape, rows["min"], rows["max"])


def profile_opt_dims(folder: str) -> Dict[str, int]:
    """A TensorRT artifact's optimization-profile OPT sizes as ``{"input[axis]": size}`` (the sizes
    its engine is tuned for: the default inputs of ``passctl run``)."""
    from passctl.targets.tvm.runtime import read_manifest

    return _opt_dims(read_manifest(folder).get("optimization_profile") or {})


def _opt_dims(profile: Mapping[str, Dict[str, List[int]]]) -> Dict[str, int]:
    """The OPT rows of an optimization ``profile`` as ``{"input[axis]": size}``."""
    return {f"{name}[{axis}]": size for name, rows in profile.items()
            for axis, size in enumerate(rows["opt"])}


def _is_ort_input_error(e: BaseException) -> bool:
    """True for ONNX Runtime's InvalidArgument (wrong input shape, dtype or name)."""
    try:
        from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument
    except ImportError:
        return False
    return isinstance(e, InvalidArgument)


def _provider_note(folder: str, kind: str) -> str:
    """For ONNX Runtime artifacts: the execution provider that ran, and a warning when session.json
    asked for one this ONNX Runtime build lacks (the latency is then that of the fallback); for
    TensorRT artifacts: that their model.onnx ran, not the engine."""
    if kind == "tensorrt":
        return (": its model.onnx on ONNX Runtime's CPUExecutionProvider (passctl does not run "
                "TensorRT engines; time model.engine with trtexec --loadEngine=model.engine)")
    if kind != "onnxruntime":
        return ""
    import json

    from passctl.targets.onnxruntime.emit import SESSION_FILE, chosen_providers

    with open(os.path.join(folder, SESSION_FILE)) as f:
        cfg = json.load(f)
    wanted = cfg["execution_providers"][0][0] if cfg["execution_providers"] else "CPUExecutionProvider"
    used = chosen_providers(cfg)[0][0]
    if used == wanted:
        return f" on {used}"
    return (f" on {used} (session.json asks for {wanted} first, which this ONNX Runtime build "
            f"lacks: the latency below is {used}'s)")


def main(args, console) -> int:
    """The ``run`` subcommand: print one line per output and the median latency; return 0."""
    from passctl.support.dims import parse_dim_args

    if args.save_outputs:
        check_save_path(args.save_outputs)
    kind, outputs, times = run_artifact(args.artifact, args.inputs, args.runs, args.warmup,
                                        args.seed, parse_dim_args(args.dim))
    console.print(f"{args.artifact}: {kind} artifact{_provider_note(args.artifact, kind)}",
                  markup=False, highlight=False)
    for name, array in outputs.items():
        console.print(f"  {name}: {summarize(array)}", markup=False, highlight=False)
    console.print(f"latency: median {statistics.median(times):.3f} ms over {len(times)} runs "
                  f"(min {min(times):.3f}, max {max(times):.3f}; {args.warmup} warm-up)",
                  markup=False, highlight=False)
    if args.save_outputs:
        save_outputs(args.save_outputs, outputs)
    return 0


def check_save_path(path: str) -> None:
    """Refuse a ``--save-outputs`` path that cannot or must not be written, before any run.

    Raises:
        UserError: ``path`` exists and is not a regular file (a folder, a symbolic link, a device
            node, a FIFO, a socket: never replaced), or its folder is missing, not a folder or not
            writable. One line naming the path and what to do.
    """
    import stat

    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    except OSError as e:
        raise UserError(f"--save-outputs '{path}': cannot inspect it ({e.strerror}); give another "
                        "file path") from None
    if mode is not None and not stat.S_ISREG(mode):
        what = ("a folder" if stat.S_ISDIR(mode) else "a symbolic link" if stat.S_ISLNK(mode)
                else "a device node" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        hint = (f"e.g. {os.path.join(path, 'outputs.npz')}" if stat.S_ISDIR(mode)
                else f"e.g. the file it points to, {os.path.realpath(path)}"
                if stat.S_ISLNK(mode) else "a new .npz file")
        raise UserError(f"--save-outputs '{path}' is {what} and is never replaced; give a file "
                        f"path ({hint})")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        what = "does not exist" if not os.path.lexists(parent) else "is not a folder"
        raise UserError(f"--save-outputs '{path}': the folder '{parent}' {what}; create it or "
                        "give another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"--save-outputs '{path}': cannot write in '{parent}' (permission denied); "
                        "give a writable path")


def save_outputs(path: str, outputs: Mapping[str, np.ndarray]) -> None:
    """Write ``outputs`` to the ``.npz`` file ``path`` (exactly that name: no ``.npz`` is
    appended) through a temporary file in the same folder renamed onto ``path``, so an existing
    file is replaced only by a complete one and nothing is left behind on failure.

    Raises:
        UserError: as :func:`check_save_path`, or the write fails (e.g. the disk is full).
    """
    import tempfile

    check_save_path(path)
    parent = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **outputs)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it 0600; a plain open would not
        check_save_path(path)  # it may have become something else while the file was written
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if isinstance(e, OSError):
            raise UserError(f"--save-outputs '{path}': cannot write it ({e.strerror}); give "
                            "another path") from None
        raise


__all__ = ["add_parser", "artifact_kind", "check_save_path", "main", "profile_opt_dims",
           "run_artifact", "save_outputs", "summarize"]
