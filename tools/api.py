"""passctl's Python API: ``compile``, ``load``, ``save``, ``run``; the CLI is a layer over it.

``passctl.compile(...)`` runs the very code path of ``passctl compile`` (:func:`run_compile`), with
the options given as keyword arguments instead of flags, and returns a :class:`CompileResult`.
Errors are the CLI's, typed: :class:`passctl.UserError` (the CLI's exit 2: bad model, pipeline,
target, option or input), :class:`passctl.CheckFailed` (exit 3: the check's error is over its
bound), :class:`passctl.InternalError` (exit 3: a pass or emitter failed; ``.reproducer`` names the
folder), :class:`passctl.EnvironmentFault` where defined (exit 4: disk full and the like). Nothing
here raises ``SystemExit``.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from passctl.ir import Model
from passctl.ir.errors import UserError
from passctl.tools.model_source import TorchSource, describe_model_argument


class CompileResult:
    """What :func:`compile` made.

    Attributes:
        model: the compiled IR (:class:`passctl.ir.Model`), as the emitter wrote it.
        artifact: the artifact folder (absolute path): ``model.onnx``, ``session.json``,
            ``report.json``, ... as :doc:`docs/report-schema` describes.
        report: the report, the same dict as ``report.json``.
        check: the numeric check's entry of the report (``None`` without ``check=True``).
    """

    def __init__(self, model: Model, artifact: str, report: Dict[str, Any]):
        self.model, self.artifact, self.report = model, artifact, report
        self.check = report.get("check")

    @property
    def check_errors(self) -> Dict[str, Dict[str, float]]:
        """Per output name: ``max_abs``, ``max_rel``, ``mean_rel`` of the check (empty without
        ``check=True``)."""
        if not self.check:
            return {}
        return {o["name"]: {k: o[k] for k in ("max_abs", "max_rel", "mean_rel") if k in o}
                for o in self.check.get("outputs", [])}

    def __repr__(self) -> str:
        nodes = self.report.get("nodes", {})
        return (f"CompileResult(artifact={self.artifact!r}, nodes {nodes.get('before')} -> "
                f"{nodes.get('after')}, check={'ok' if (self.check or {}).get('ok') else self.check and 'failed'})")


def _compile_args(model, pipeline: str, target: str, emit: Optional[str], output: Optional[str],
                  check: bool, options: Mapping[str, Any]):
    """An argparse namespace as ``passctl compile`` would parse it, with ``options`` applied."""
    from passctl.tools.cli import _pipeline_text, build_parser, check_compile_args

    args = build_parser().parse_args(["compile", "MODEL"])
    args.model = model
    args.pipeline = _pipeline_text(pipeline)
    args.target, args.emit, args.out, args.check = target, emit, output, bool(check)
    args.quiet = True
    known = vars(args)
    for key, value in options.items():
        name = {"output": "out", "inputs_file": "inputs", "dims": "dim"}.get(key, key)
        if name not in known:
            raise UserError(f"passctl.compile: unknown option '{key}' (options: "
                            f"{', '.join(sorted(k for k in known if k not in ('command', 'model')))})")
        if name == "dim" and isinstance(value, Mapping):
            value = [f"{k}={v}" for k, v in value.items()]
        if name in ("load", "print_ir_before", "print_ir_after") and isinstance(value, str):
            value = [value]
        setattr(args, name, value)
    check_compile_args(args)
    return args


def compile(model: Union[str, os.PathLike, Model, Any], pipeline: str = "cleanup",
            target: str = "cpu", emit: Optional[str] = None, output: Optional[str] = None,
            check: bool = False, *, example_inputs: Optional[Sequence[Any]] = None,
            dynamic_dims: Optional[Sequence[Optional[Mapping[int, str]]]] = None,
            **options: Any) -> CompileResult:
    """Compile ``model`` as ``passctl compile`` does; return the compiled IR, artifact and report.

    Args:
        model: an ``.onnx`` or ``.pir`` path, ``package:relative/path``, ``FILE.py:FUNCTION``, a
            :class:`passctl.ir.Model` (copied: not changed), a ``torch.nn.Module`` (with
            ``example_inputs``) or a ``torch.export.ExportedProgram``.
        pipeline: pipeline text, as ``--pipeline`` (``"cleanup,fuse"``, ``"quantize{calib=DIR}"``).
        target: target profile name (``passctl list-targets``).
        emit: emitter text, as ``--emit`` (default: the target's).
        output: the artifact folder (as ``-o``); default: a new temporary folder (its path is
            ``result.artifact``; the caller removes it).
        check: run the original and the artifact in ONNX Runtime on seeded inputs and compare
            (as ``--check``); a PyTorch model is also compared with its own eager outputs on
            ``example_inputs`` (``report["check"]["torch"]``).
        example_inputs: tensors for an ``nn.Module``'s forward (a tuple, or one tensor).
        dynamic_dims: for an ``nn.Module``, one ``{axis: name}`` (or ``None``) per example input:
            the axes that stay symbolic in the artifact.
        **options: the other compile flags by their long names with ``_`` for ``-``: ``seed``,
            ``rtol``, ``atol``, ``dims`` (``{"batch": 1}``), ``inputs`` (an ``.npz`` path),
            ``load`` (plugin files), ``dump_ir``, ``verify_each``, ``check_each``,
            ``reproducer_dir``, ``no_verify`` where the CLI has them.

    Returns:
        A :class:`CompileResult`.

    Raises:
        UserError: bad model, pipeline, target, emitter, option or input.
        CheckFailed: ``check=True`` and an error is over its bound (``.reproducer``: the folder).
        InternalError: a pass or the emitter failed (``.reproducer``: the crash folder).
    """
    from rich.console import Console

    from passctl.tools.compile import run_compile

    if example_inputs is not None or dynamic_dims is not None:
        from passctl.frontends.torch_module import normalize_torch_model

        if isinstance(model, (str, os.PathLike, Model)):
            raise UserError("passctl.compile: example_inputs / dynamic_dims go with a torch.nn.Module "
                            f"model, not with {describe_model_argument(model)}")
        module, inputs, _ = normalize_torch_model((model, example_inputs or ()))
        model = TorchSource(module, inputs, dynamic_dims)
    if output is None:
        output = tempfile.mkdtemp(prefix="passctl-out-")
        os.rmdir(output)  # the compile creates it (a missing -o folder is made, never reused)
    args = _compile_args(model, pipeline, target, emit, os.fspath(output), check, options)
    compiled: List[Model] = []
    report = run_compile(args, ["compile", describe_model_argument(model)], Console(quiet=True),
                         keep_model=compiled.append)
    return CompileResult(compiled[0] if compiled else None, os.path.abspath(output), report)


def load(path: Union[str, os.PathLike]) -> Model:
    """Load an ONNX file, IR text (``.pir``) or ``package:relative/path`` as a :class:`Model`.

    Raises:
        UserError: the file is missing, not ONNX / IR text, or damaged (one line, naming it).
    """
    from passctl.tools.model_source import load_model

    return load_model(os.fspath(path))[0]


def save(model: Model, path: Union[str, os.PathLike]) -> None:
    """Write ``model`` as ONNX (``.onnx``; weights over 2 GB in ``path + ".data"``) or IR text
    (``.pir``).

    Raises:
        UserError: the folder of ``path`` does not exist or is not writable.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UserError(f"cannot save to '{path}': folder '{folder}' does not exist")
    if path.endswith(".pir"):
        from passctl.ir.printer import print_model

        with open(path, "w", encoding="utf-8") as f:
            f.write(print_model(model))
        return
    from passctl.ir.onnx_export import save as save_onnx

    save_onnx(model, path)


def run(artifact: Union[str, os.PathLike],
        inputs: Optional[Mapping[str, Any]] = None, *, seed: int = 0,
        dims: Optional[Mapping[str, int]] = None) -> Dict[str, np.ndarray]:
    """Run an artifact folder once (ONNX Runtime with its ``session.json``, or TVM) and return the
    outputs by name (numpy arrays).

    Args:
        artifact: the folder ``compile`` wrote.
        inputs: arrays by input name; inputs not given are seeded random values
            (:func:`passctl.support.inputs.make_inputs`, sized by ``dims`` for symbolic axes).

    Raises:
        UserError: not an artifact, a damaged file, or inputs that do not fit.
    """
    from passctl.support.inputs import make_inputs
    from passctl.tools.run_artifact import open_artifact

    runner = open_artifact(os.fspath(artifact))
    feeds = make_inputs(runner.header, seed=seed, dim_values=dims,
                        overrides={k: np.asarray(v) for k, v in (inputs or {}).items()})
    return runner.run_checked(feeds, os.fspath(artifact))
