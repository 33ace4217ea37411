"""``passctl opt``: run a pipeline on a model and print the IR text after it (as mlir-opt does)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, List, Optional, Sequence

from passctl.ir.errors import UserError

if TYPE_CHECKING:  # the CLI builds this parser for --help: keep onnx out of that path
    from passctl.ir import Model
    from passctl.passes import Pass

EXIT_OK, EXIT_INTERNAL_ERROR = 0, 3


def add_parser(sub) -> None:
    """Register the ``opt`` subcommand on the CLI's subparsers object."""
    p = sub.add_parser("opt", help="run a pipeline on IR text (or ONNX) and print the IR text "
                                   "after it (as mlir-opt; for golden tests)")
    p.add_argument("model", help="an IR text file (.pir), an .onnx file, or package:relative/path")
    p.add_argument("--pipeline", "-p", required=True,
                   help="pipeline text, e.g. 'fuse-conv-bn,dce' (see list-passes)")
    p.add_argument("--target", "-t", default="cpu",
                   help="target profile: expands groups and reaches target-dependent passes "
                        "(default: cpu)")
    p.add_argument("--emit", default=None, metavar="EMITTER",
                   help="expand groups as for this emitter (onnxruntime | tvm | tensorrt; "
                        "default: the target's), e.g. `-p fuse --emit tvm` lowers to standard ONNX")
    p.add_argument("--verify-each", action="store_true", help="run the verifier after each pass")
    p.add_argument("--load", action="append", default=[], metavar="FILE.py",
                   help="import a Python file that registers passes (repeatable)")


def pipeline_passes(pipeline: str, target: str = "cpu", emit: Optional[str] = None) -> List[Pass]:
    """The passes of ``pipeline``, groups expanded for ``target`` and the emitter ``emit`` (default:
    the target's), as ``passctl compile`` expands them.

    Raises:
        UserError: the pipeline is empty or does not parse, or the target or emitter is unknown.
    """
    from passctl.passes import build_pipeline
    from passctl.targets import get_emitter, get_target

    if not pipeline.strip():
        raise UserError("the pipeline is empty: give passes, e.g. -p cleanup (`passctl show` "
                        "prints a model without running any)")
    profile = get_target(target)
    emitter = get_emitter(emit or profile.default_emitter)
    return build_pipeline(pipeline, profile.name, emitter.name)


def optimize(model: Model, passes: Sequence[Pass], verify_each: bool = False,
             source: str = "<model>") -> Model:
    """Verify ``model`` and run ``passes`` on it in place, as ``passctl opt`` does.

    Unlike ``passctl compile`` no final ``dce`` runs (the result is exactly the pipeline's) and
    calibrating passes get no input sizes from the emitter (give them ``dims=`` in the pipeline).

    Args:
        model: the model (changed in place).
        passes: from :func:`pipeline_passes`.
        verify_each: verify the IR after every pass.
        source: the model's file, for messages.

    Returns:
        ``model``, after the passes.

    Raises:
        UserError: the verifier rejects the input.
        PassFailure: a pass raised. VerifyError: (``verify_each``) a pass broke the IR.
    """
    from passctl.ir.verifier import verify
    from passctl.passes import PassManager

    errors = [d for d in verify(model, check_output_types=False) if d.severity == "error"]
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise UserError(f"{source}: invalid model: {errors[0].kind}: {errors[0].message}{more}; "
                        f"`passctl verify {source}` lists every problem")
    PassManager(passes, verify_each=verify_each).run(model)
    return model


def opt_text(model_spec: str, pipeline: str, target: str = "cpu", verify_each: bool = False,
             plugins: Sequence[str] = (), emit: Optional[str] = None) -> str:
    """Load ``model_spec``, run ``pipeline`` on it and return the IR text after it.

    Args:
        model_spec: an IR text (.pir) or ONNX file, or ``package:relative/path``.
        pipeline: pipeline text.
        target: target profile name.
        verify_each: verify the IR after every pass.
        plugins: Python files that register passes (``--load``).
        emit: the emitter whose group expansion to use (default: the target's).

    Returns:
        The text ``print_model`` writes (small constants inline, large ones as references to the
        source file when unchanged, else hex), ending with a newline.

    Raises:
        UserError: as :func:`pipeline_passes` and :func:`optimize`; or the file is missing or
            does not parse (the parser's ``file:line:column: message``), or a plugin does not
            load.
    """
    from passctl.passes import load_plugin_file
    from passctl.tools.model_source import load_model

    for path in plugins:
        load_plugin_file(path)
    passes = pipeline_passes(pipeline, target, emit)  # pipeline errors before the model loads
    model, path = load_model(model_spec)
    from passctl.ir import print_model

    return print_model(optimize(model, passes, verify_each, path))


def main(args, stdout=None) -> int:
    """Run ``passctl opt`` for parsed ``args`` and write the IR text to ``stdout``.

    Args:
        args: the parsed command line (see :func:`add_parser`).
        stdout: where the text goes (default ``sys.stdout``).

    Returns:
        0, or 3 when a pass raised or broke the IR under ``--verify-each`` (an internal error,
        said in one line on stderr).

    Raises:
        UserError: bad arguments, file or model (the CLI prints it in one line and exits 2).
    """
    from passctl.passes import PassFailure, VerifyError

    out = sys.stdout if stdout is None else stdout
    try:
        text = opt_text(args.model, args.pipeline, args.target, args.verify_each, args.load,
                        args.emit)
    except (PassFailure, VerifyError) as e:
        if isinstance(e, VerifyError) and e.pass_name is None:
            raise UserError(f"{args.model}: {e}") from e
        print(f"passctl: internal error: {_first_line(e)}", file=sys.stderr)
        return EXIT_INTERNAL_ERROR
    out.write(text)
    out.flush()
    return EXIT_OK


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
