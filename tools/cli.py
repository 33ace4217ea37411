"""The ``passctl`` command line: compile (default), show, verify, explain, list-passes/-rules/-targets, run."""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import traceback
from typing import List, Optional, Sequence

from passctl.ir.errors import UserError
from passctl.support.errors import (CheckFailed, EnvironmentFault, InternalError,
                                    environment_fault, fault_message, one_line)
from passctl.tools.terminal import discard_stdout, stdout_closed

logger = logging.getLogger(__name__)

EXIT_OK, EXIT_USER_ERROR, EXIT_INTERNAL_ERROR, EXIT_ENVIRONMENT = 0, 2, 3, 4
EXIT_CODES_HELP = ("exit status: 0 success; 2 the user's error (a bad model, option or input; one "
                   "line naming what to fix); 3 passctl's internal error (a failed pass, verify run "
                   "or --check; one line and a reproducer folder); 4 the environment's fault (a "
                   "full disk or exhausted quota; one line, nothing written); 130 interrupted")
SUBCOMMANDS = ("compile", "show", "verify", "explain", "list-passes", "list-rules", "list-targets",
               "run", "opt", "export-decoder", "generate", "compare", "bisect", "diff")


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are UserErrors (one line, exit 2).

    Abbreviated options are off (``--chek`` must not silently mean something); an unknown option
    gets the closest known ones as a suggestion.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_args(args, namespace)

    def _subcommand(self) -> Optional[argparse.ArgumentParser]:
        """The subparser the parsed argv chose (None when there is none)."""
        argv = getattr(self, "_argv", [])
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and argv:
                return action.choices.get(argv[0])
        return None

    def _all_options(self) -> List[str]:
        sub = self._subcommand()
        options = set(self._option_string_actions) | set(sub._option_string_actions if sub else ())
        return sorted(o for o in options if o.startswith("--"))

    def error(self, message: str):
        import difflib

        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            hints = []
            for arg in message[len(prefix):].split():
                if arg.startswith("-"):
                    close = difflib.get_close_matches(arg.split("=")[0], self._all_options(),
                                                      n=3, cutoff=0.6)
                    if close:
                        hints.append(f"did you mean {' or '.join(close)} for {arg}?")
            sub = self._subcommand()
            help_cmd = f"{sub.prog if sub is not None else self.prog} --help"
            raise UserError(f"{message}; {' '.join(hints) + ' ' if hints else ''}"
                            f"see `{help_cmd}`")
        raise UserError(f"{message} (see `{self.prog} --help`)")


def _tolerance(text: str) -> float:
    """argparse type of ``--rtol`` / ``--atol``: a finite float >= 0 (NaN passes every check)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a tolerance: give a finite number >= 0, "
                                         "e.g. 1e-4")
    return value


def seed_value(text: str) -> int:
    """argparse type of ``--seed``: an integer >= 0 (``numpy.random.default_rng`` refuses
    negative seeds)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a seed: give an integer >= 0, e.g. 0")
    return value


def _pipeline_text(text: str) -> str:
    """argparse type of ``--pipeline``: not blank (an empty pipeline would emit the model unchanged
    while the command line looks like it rewrote something)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the pipeline is empty: give passes, e.g. -p cleanup "
                                         "(`passctl list-passes` lists them; -p dce only removes "
                                         "dead code)")
    return text


def check_compile_args(args) -> None:
    """Checks across compile options that argparse cannot express.

    Raises:
        UserError: ``--inputs`` or ``--dim`` without ``--check`` or ``--check-each`` (they would
            be ignored: they size and fill the check's inputs, never the artifact).
    """
    if args.inputs and not (args.check or args.check_each):
        raise UserError(f"--inputs '{args.inputs}' is used only by the numeric check and does not "
                        "change the artifact (no calibration, no fixed shapes); add --check (or "
                        "--check-each), or drop --inputs")
    if args.dim and not (args.check or args.check_each):
        raise UserError(f"--dim {args.dim[0]} sizes only the numeric check's inputs and does not "
                        "change the artifact; add --check (or --check-each), or fix sizes in the "
                        "artifact with lower-tvm{dims=...} (TVM) or --emit 'tensorrt{shapes=...}'")


def _add_compile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="an .onnx file, IR text (.pir), or package:relative/path")
    p.add_argument("--pipeline", "-p", default="cleanup", type=_pipeline_text,
                   help="comma-separated passes and groups, e.g. 'cleanup,fuse-conv-bn' or "
                        "'fold-constants{size_limit=1024}' (default: cleanup)")
    p.add_argument("--target", "-t", default="cpu",
                   help="target profile (see list-targets; default: cpu)")
    p.add_argument("-o", "--output", dest="out", default=None,
                   help="output folder (default: ./<model stem>.passctl/)")
    p.add_argument("--emit", default=None, help="onnxruntime | tvm | tensorrt, with emitter options "
                   "in braces, e.g. 'tvm{fp32_precision=tf32x3,cuda_graph=false}' (docs/tvm.md; "
                   "default: the target's default emitter)")
    p.add_argument("--check", action="store_true",
                   help="run the original and the result in ONNX Runtime on seeded inputs")
    p.add_argument("--no-verify", dest="verify", action="store_false",
                   help="skip the verify run: by default the artifact runs once in its runtime on "
                        "seeded inputs at small sizes before it is written, and an output of "
                        "another shape or dtype than declared, or NaN/inf where the original is "
                        "finite, is an internal error (exit 3) naming the pass")
    p.add_argument("--seed", type=seed_value, default=0,
                   help="seed of the check's random inputs (>= 0)")
    p.add_argument("--rtol", type=_tolerance, default=None,
                   help="largest relative error (max |a-b| / max |a|) the check accepts "
                        "(default 1e-4; with amp in the pipeline, the amp pass's budget)")
    p.add_argument("--atol", type=_tolerance, default=2.4e-7,
                   help="absolute error the check always accepts (default 2.4e-7: two float32 "
                        "ulps at 1.0, the step of ONNX Runtime's Sigmoid near 0)")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                   help="size of a symbolic input dimension for the check (repeatable)")
    p.add_argument("--inputs", metavar="FILE.npz",
                   help="arrays by input name to use instead of random ones in the check "
                        "(needs --check or --check-each)")
    p.add_argument("--dump-ir", metavar="DIR",
                   help="write NNN_<pass>.pir and .onnx after each pass")
    p.add_argument("--timing", action="store_true", help="print a pass timing table")
    p.add_argument("--verify-each", action="store_true", help="run the verifier after each pass")
    p.add_argument("--load", action="append", default=[], metavar="FILE.py",
                   help="import a Python file that registers passes (repeatable)")
    p.add_argument("--print-ir-before", action="append", default=[], metavar="PASS|all")
    p.add_argument("--print-ir-after", action="append", default=[], metavar="PASS|all")
    p.add_argument("--print-ir-after-change", action="store_true",
                   help="print the IR after every pass that changed it")
    p.add_argument("--check-each", action="store_true",
                   help="after every pass, run it in ONNX Runtime against the original")
    p.add_argument("--reproducer-dir", metavar="DIR",
                   help="where a crash reproducer goes (default: a new passctl-crash-DATE-PID "
                        "folder under the system temp folder, made only on a crash)")
    p.add_argument("-q", "--quiet", action="store_true", help="no terminal summary")


_EPILOG = """examples:
  passctl model.onnx --pipeline cleanup,fuse --target cpu --check -o out
  passctl model.onnx -p 'cleanup,fuse,quantize{calib=images/}' -t cpu -o out-int8
  passctl model.py:make_model -p cleanup,fuse -o out      (a PyTorch nn.Module factory)
  passctl run out --inputs feeds.npz                       (run an artifact, print outputs, ms)
  passctl show model.onnx | less                           (the IR text form)
  passctl list-passes                                      (passes, groups, options)

exit codes:
  0  success
  2  user error: bad model file, pipeline, target, option or input (one line says what to fix)
  3  internal error: a failed pass, verify run or --check (one line and a reproducer folder)
  4  the environment's fault: a full disk or exhausted quota (one line, nothing written)
  130  interrupted
"""


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser with one subparser per subcommand."""
    parser = _Parser(prog="passctl", description=(
        "Compile a trained model: passctl MODEL --pipeline P --target T -o OUT (same as "
        "`passctl compile ...`)."), epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    from passctl import __version__

    parser.add_argument("--version", action="version", version=f"passctl {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    _add_compile_args(sub.add_parser("compile", epilog=EXIT_CODES_HELP,
                                     help="run a pipeline and emit an artifact (default)"))
    show = sub.add_parser("show", help="print a model as IR text (parses back)")
    show.add_argument("model")
    show.add_argument("--weights", metavar="FILE",
                      help="write large weights to FILE and reference them relative to its "
                           "folder (default: reference the source model by absolute path)")
    verify = sub.add_parser("verify", help="run the IR verifier and print its diagnostics")
    verify.add_argument("model")
    explain = sub.add_parser("explain", help="show why a rewrite rule matches or not in a model")
    explain.add_argument("rule")
    explain.add_argument("model")
    explain.add_argument("--load", action="append", default=[], metavar="FILE.py")
    lp = sub.add_parser("list-passes", help="registered passes, groups and their options")
    lp.add_argument("--load", action="append", default=[], metavar="FILE.py")
    lr = sub.add_parser("list-rules", help="registered rewrite rules and their patterns "
                        "(names for explain)")
    lr.add_argument("--load", action="append", default=[], metavar="FILE.py")
    sub.add_parser("list-targets", help="target profiles")
    from passctl.tools import opt, run_artifact

    run_artifact.add_parser(sub)
    opt.add_parser(sub)
    from passctl.tools import export_decoder, generate

    export_decoder.add_parser(sub)
    generate.add_parser(sub)
    from passctl.tools.debug_args import add_bisect_parser, add_compare_parser, add_diff_parser

    add_compare_parser(sub)
    add_bisect_parser(sub)
    add_diff_parser(sub)
    return parser


def _normalize_argv(argv: Sequence[str]) -> List[str]:
    """``passctl MODEL ...`` and ``passctl --pipeline P MODEL`` mean ``passctl compile ...``."""
    argv = list(argv)
    if not argv or argv[0] in SUBCOMMANDS or argv[0] in ("-h", "--help", "--version"):
        return argv
    _check_not_a_misspelled_subcommand(argv[0])
    return ["compile"] + argv


def _check_not_a_misspelled_subcommand(word: str) -> None:
    """Raise a UserError naming the closest subcommands when ``word`` (read as the model) is a
    plain word that is no existing file and is close to a subcommand (``list-pases``)."""
    import difflib
    import re

    if not re.fullmatch(r"[A-Za-z][A-Za-z-]*", word) or os.path.exists(word):
        return
    ratio = {c: difflib.SequenceMatcher(None, word.lower(), c).ratio() for c in SUBCOMMANDS}
    best = max(ratio.values())
    close = [c for c in SUBCOMMANDS if ratio[c] >= 0.6 and ratio[c] >= best - 0.05]
    if close:
        raise UserError(f"'{word}' is not a subcommand or a model file; did you mean "
                        f"{' or '.join(f'`passctl {c}`' for c in close)}? (see `passctl --help`)")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run passctl with ``argv`` (default ``sys.argv[1:]``); return the exit code.

    Returns:
        0 on success, 2 for a user error (one line ``passctl: error: ...`` on stderr), 3 for an
        internal error (one line plus the reproducer folder's path), 4 for the environment's fault
        (a full disk or quota: one line ``passctl: environment error: ...``, no reproducer, the
        partial output removed).
    """
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            # rich exits 1 here; instead drop further output and let the command finish (a
            # compile still writes its artifact), then exit as usual
            self.quiet = self.stdout_closed = True
            discard_stdout()

    argv = sys.argv[1:] if argv is None else list(argv)
    logging.basicConfig(level=os.environ.get("PASSCTL_LOG", "WARNING").upper(),
                        format="%(levelname)s %(name)s: %(message)s")
    # Not a terminal (a pipe, a file, a test): no wrapping, so lines stay greppable.
    # NOTE: piped output is not wrapped (tables stay one row per line, for grep and tests).
    out = _Console(soft_wrap=True, width=None if sys.stdout.isatty() else 400)
    err = Console(stderr=True)
    try:
        args = build_parser().parse_args(_normalize_argv(argv))
        if args.command is None:
            build_parser().print_help()
            return EXIT_USER_ERROR
        return _dispatch(args, argv, out)
    except SystemExit as e:  # --help / --version
        return int(e.code or 0)
    except EnvironmentFault as e:
        print(f"passctl: environment error: {one_line(e)}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    except UserError as e:
        print(f"passctl: error: {one_line(e)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except InternalError as e:
        if environment_fault(e) is not None:
            return _environment_exit(e)
        kind = "" if isinstance(e, CheckFailed) else "internal error: "
        print(f"passctl: {kind}{one_line(e)}", file=sys.stderr)
        if e.reproducer:
            print(f"passctl: reproducer: {e.reproducer}", file=sys.stderr)
        return EXIT_INTERNAL_ERROR
    except KeyboardInterrupt:
        print("passctl: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug outside any pass: say so, with the traceback
        if environment_fault(e) is not None:
            return _environment_exit(e)
        if isinstance(e, BrokenPipeError) and stdout_closed(out):
            discard_stdout()  # the reader closed stdout early (`passctl list-passes | head -1`)
            return EXIT_OK
        traceback.print_exc()
        print(f"passctl: internal error: {type(e).__name__}: {one_line(e)}", file=sys.stderr)
        err.print("please report it with the command above", style="dim")
        return EXIT_INTERNAL_ERROR


def _environment_exit(error: BaseException) -> int:
    """Exit 4 for a failure a full disk or quota caused (:func:`environment_fault`): remove the
    reproducer folder a crash path may have begun, print one line."""
    import shutil

    folder = getattr(error, "reproducer", None)
    if folder and os.path.isdir(folder):
        shutil.rmtree(folder, ignore_errors=True)
    print(f"passctl: environment error: {fault_message(environment_fault(error))}",
          file=sys.stderr)
    return EXIT_ENVIRONMENT


def _dispatch(args, argv: List[str], console) -> int:
    from passctl.tools import commands

    if args.command == "compile":
        from passctl.tools.compile import run_compile
        from passctl.tools.reproducer import write_crash_folder

        check_compile_args(args)
        try:
            run_compile(args, argv, console)
        except (UserError, InternalError, EnvironmentFault):
            raise
        except Exception as e:  # a bug outside any pass (import, export...): keep a reproducer
            if isinstance(e, BrokenPipeError) and stdout_closed(console):
                raise  # not a bug: the reader of stdout went away (main exits 0)
            if environment_fault(e) is not None:  # a full disk: no reproducer (exit 4)
                raise EnvironmentFault(fault_message(environment_fault(e))) from e
            folder = write_crash_folder(args.reproducer_dir, argv, e)
            raise InternalError(f"{type(e).__name__}: {e} (traceback in the reproducer)",
                                folder) from e
    elif args.command == "show":
        commands.show(args.model, args.weights)
    elif args.command == "verify":
        return commands.verify(args.model, console)
    elif args.command == "explain":
        commands.explain(args.rule, args.model, args.load, console)
    elif args.command == "list-passes":
        commands.list_passes(args.load, console)
    elif args.command == "list-rules":
        commands.list_rules(args.load, console)
    elif args.command == "list-targets":
        commands.list_targets(console)
    elif args.command == "run":
        from passctl.tools import run_artifact

        return run_artifact.main(args, console)
    elif args.command == "opt":
        from passctl.tools import opt

        return opt.main(args)
    elif args.command == "export-decoder":
        from passctl.tools import export_decoder

        return export_decoder.main(args, console)
    elif args.command == "generate":
        from passctl.tools import generate

        return generate.main(args, console)
    elif args.command in ("compare", "bisect", "diff"):
        import importlib

        name = args.command
        if name == "compare":
            from passctl.tools.compare_tvm import wants_tvm

            name = "compare_tvm" if wants_tvm(args) else name
        return importlib.import_module(f"passctl.tools.{name}").main(args, console)
    return EXIT_OK


if __name__ == "__main__":
    # `python -m passctl.tools.cli`: the error classes live in passctl.support.errors, so this
    # second copy of the module catches the very classes compile.py raises
    sys.exit(main())
