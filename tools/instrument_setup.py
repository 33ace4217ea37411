"""The compile command's debugging options as pass-manager instruments (passes/instruments.py)."""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, List

from passctl.support.context import CheckBound
from passctl.tools.reproducer import default_reproducer_dir


def _stdout(text: str) -> None:
    # Resolved at call time, so rich's progress display (which redirects sys.stdout) keeps its bar
    # below the text and tests that capture stdout see it.
    try:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # the reader closed stdout (`| head`): keep compiling, drop the text
        from passctl.tools.terminal import discard_stdout

        discard_stdout()


def build_instruments(args, bounds: List[CheckBound], reference: str, header,
                      dims: Dict[str, int], overrides: Dict[str, Any]) -> List[Any]:
    """The instruments for parsed compile ``args``.

    Always a crash reproducer (under ``--reproducer-dir`` or :func:`default_reproducer_dir`); a
    timing table with ``--timing``; IR printing with ``--print-ir-before/after`` and
    ``--print-ir-after-change``; ``NNN_<pass>.pir/.onnx`` files with ``--dump-ir``; a check after
    every pass with ``--check-each`` (same seeded inputs as ``--check``). Text goes to stdout.

    Args:
        args: the parsed ``compile`` arguments.
        bounds: the numeric check's bounds (the compile context's ``check_bounds``).
        reference: path of the original model as ONNX (for ``--check-each``).
        header: ``reference``'s :func:`passctl.support.inputs.load_header` (with ``--check-each``),
            so the inputs are planned without reading the file again.
        dims: ``--dim`` sizes of symbolic input dimensions.
        overrides: ``--inputs`` arrays by input name.
    """
    from passctl.passes.instruments import CheckEach, CrashReproducer, DumpIR, PrintIR, Timing

    instruments: List[Any] = [CrashReproducer(args.reproducer_dir or default_reproducer_dir(),
                                              target=args.target, write=lambda t: None)]
    if args.print_ir_before or args.print_ir_after or args.print_ir_after_change:
        before = "all" if "all" in args.print_ir_before else set(args.print_ir_before) or None
        after = "all" if "all" in args.print_ir_after else set(args.print_ir_after) or None
        instruments.append(PrintIR(before=before, after=after,
                                   after_change=args.print_ir_after_change, write=_stdout))
    if args.dump_ir:
        instruments.append(DumpIR(args.dump_ir))
    if args.check_each:
        from passctl.support.check import make_inputs

        inputs = make_inputs(header, seed=args.seed, dim_values=dims, overrides=overrides)
        instruments.append(CheckEach(reference, inputs=inputs, write=_stdout, atol=args.atol,
                                     bounds=[(b.metric, b.rtol) for b in bounds]))
    if args.timing:
        instruments.append(Timing(write=_stdout))
    return instruments


def instruments_report(instruments: List[Any]) -> Dict[str, Any]:
    """Report entries from the instruments: ``check_each`` (per pass) and ``dump_ir`` (files)."""
    from passctl.passes.instruments import CheckEach, DumpIR

    out: Dict[str, Any] = {}
    for inst in instruments:
        if isinstance(inst, CheckEach):
            out["check_each"] = [
                {"index": index, "pass": name,
                 "ok": None if res is None else inst.ok(res),
                 "max_rel": None if res is None else _finite(res.max_rel),
                 "outputs": None if res is None else [d.to_dict() for d in res.outputs.values()]}
                for index, name, res in inst.results]
        elif isinstance(inst, DumpIR):
            out["dump_ir"] = {"directory": os.path.abspath(inst.directory),
                              "files": [p.name for p in inst.written]}
    return out


def _finite(x: float):
    return x if x != float("inf") else "inf"
