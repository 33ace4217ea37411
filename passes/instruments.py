"""Pass instruments: timing, print-ir-before/after(-change), dump-ir, crash reproducer, check-each.

An instrument is any object with some of these hooks, called by :class:`PassManager`:
``on_start(model, passes)``, ``before_pass(pass_, model, index)``, ``after_pass(pass_, model, record)``,
``on_failure(pass_, model, failure, index)``, ``on_end(model, result)``. ``index`` counts pass
executions from 1 (fixpoint rounds count each time). Instruments never print: text goes to the
``write`` callable the caller gives (the CLI passes its rich Console's ``print``); the default
logs it at INFO level.
"""

from __future__ import annotations

import io
import logging
import os
import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Union

from passctl.ir import Model
from passctl.passes._snapshot import clone_model
from passctl.passes.base import Pass

logger = logging.getLogger(__name__)

Write = Callable[[str], None]


def _default_write(text: str) -> None:
    logger.info("%s", text)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _print_model(model: Model) -> str:
    from passctl.ir.printer import print_model

    return print_model(model)


def _write_pir(model: Model, path: Path) -> None:
    """Write the IR text to ``path``; constants too large to inline that the source model file does
    not hold unchanged go to ``<path stem>.weights`` beside it (not kept when empty)."""
    from passctl.ir.printer import print_model

    weights = path.with_suffix(".weights")
    text = print_model(model, weights_path=str(weights))
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    if weights.exists() and weights.stat().st_size == 0:
        weights.unlink()


def _save_onnx(model: Model, path: Path) -> None:
    from passctl.ir.onnx_export import save

    save(model, str(path))


class Timing:
    """Collects each pass's wall time; on the end of the pipeline writes a table (slowest first).

    Args:
        write: receives the rendered table (plain text of a rich table).
    """

    def __init__(self, write: Optional[Write] = None):
        self.write = write or _default_write
        self.records: List[Any] = []

    def after_pass(self, pass_: Pass, model: Model, record) -> None:
        self.records.append(record)

    def table(self):
        """The timing table as a ``rich.table.Table`` (pass, runs, total ms, share, modified runs)."""
        from rich.table import Table

        totals: Dict[str, List[float]] = {}
        for r in self.records:
            t = totals.setdefault(r.name, [0, 0.0, 0])
            t[0] += 1
            t[1] += r.time_ms
            t[2] += int(r.modified)
        grand = sum(t[1] for t in totals.values()) or 1.0
        table = Table(title="pass timing")
        for col in ("pass", "runs", "time (ms)", "share", "modified"):
            table.add_column(col, justify="left" if col == "pass" else "right")
        for name, (runs, ms, mod) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
            table.add_row(name, str(runs), f"{ms:.2f}", f"{100 * ms / grand:.1f}%", str(mod))
        table.add_row("total", str(len(self.records)), f"{grand if self.records else 0:.2f}", "100%", "")
        return table

    def render(self) -> str:
        """The table as plain text."""
        from rich.console import Console

        buf = io.StringIO()
        Console(file=buf, width=100, color_system=None).print(self.table())
        return buf.getvalue()

    def on_end(self, model: Model, result) -> None:
        self.write(self.render())


def _selected(spec: Union[None, str, Iterable[str]]):
    if spec is None:
        return frozenset()
    if isinstance(spec, str):
        return "all" if spec == "all" else frozenset(s for s in spec.split(",") if s)
    return frozenset(spec)


class PrintIR:
    """Writes the IR text before and/or after passes (MLIR's ``-print-ir-before/after``).

    Args:
        before: pass names (a set or comma-separated text) or ``"all"``; ``None`` for none.
        after: likewise, after the pass.
        after_change: after every pass that reported ``modified`` (``-print-ir-after-change``).
        write: receives each header line plus IR text.
    """

    def __init__(self, before=None, after=None, after_change: bool = False,
                 write: Optional[Write] = None):
        self.before, self.after = _selected(before), _selected(after)
        self.after_change = after_change
        self.write = write or _default_write

    @staticmethod
    def _hit(sel, name: str) -> bool:
        return sel == "all" or name in sel

    def before_pass(self, pass_: Pass, model: Model, index: int) -> None:
        if self._hit(self.before, pass_.name):
            self.write(f"// ----- IR before {pass_.name} (#{index}) ----- //\n{_print_model(model)}")

    def after_pass(self, pass_: Pass, model: Model, record) -> None:
        if self._hit(self.after, pass_.name) or (self.after_change and record.modified):
            self.write(f"// ----- IR after {pass_.name} (#{record.index}) ----- //\n"
                       f"{_print_model(model)}")


#: The names an IR dump writes (``000_input.pir``, ``003_fold-constants.onnx``, its ``.onnx.data``
#: and ``.weights``), and the ``.NNN_<pass>.pir.tmp`` a dump stopped mid-write leaves.
DUMP_FILE = re.compile(r"\.?[0-9]{3}_[A-Za-z0-9_.-]+\.(pir|onnx|onnx\.data|weights|pir\.tmp)")


def check_dump_folder(directory: Union[str, os.PathLike]) -> None:
    """Refuse an IR dump folder that holds anything besides an earlier dump's files.

    A dump overwrites the files it writes; a missing or empty folder, or one holding only plain
    files whose names match :data:`DUMP_FILE`, is accepted.

    Raises:
        UserError: one line naming the folder, its first foreign entry (a user file, a subfolder,
            a link, a FIFO...) and what to do.
    """
    import stat

    from passctl.ir.errors import UserError

    try:
        names = sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as e:
        raise UserError(f"IR dump folder '{directory}' (--dump-ir): cannot list it ({e.strerror}); "
                        "give a new or empty folder") from None
    for name in names:
        try:
            plain = stat.S_ISREG(os.lstat(os.path.join(directory, name)).st_mode)
        except OSError:
            plain = False
        if not plain or not DUMP_FILE.fullmatch(name):
            what = "a file" if plain else "an entry"
            raise UserError(f"IR dump folder '{directory}' (--dump-ir) holds '{name}', {what} an "
                            "earlier dump did not write (dumps write NNN_<pass>.pir/.onnx/.weights "
                            "and overwrite them); give a new or empty folder")


class DumpIR:
    """Writes ``000_input.{pir,onnx}`` and, after every pass, ``NNN_<pass>.pir`` and ``NNN_<pass>.onnx``.

    ``NNN`` is the execution index (3 digits). The ``.onnx`` files open in Netron and run in ONNX
    Runtime; the ``.pir`` files are :func:`passctl.ir.printer.print_model` text, with large
    constants that the source model does not hold unchanged in ``NNN_<pass>.weights``.

    Args:
        directory: created if missing. An existing folder may hold only an earlier dump's files
            (:data:`DUMP_FILE`: ``NNN_<pass>.pir`` / ``.onnx`` / ``.onnx.data`` / ``.weights``, all
            plain files), which are overwritten; anything else is refused, so that no user file
            of the same name is ever overwritten.
        onnx: also write the ``.onnx`` files (on by default).

    Raises:
        UserError: ``directory`` holds something that is not a file of an earlier dump (the
            first one, sorted by name, is named).
    """

    def __init__(self, directory, onnx: bool = True):
        self.directory = Path(directory)
        self.onnx = onnx
        self.written: List[Path] = []
        check_dump_folder(self.directory)

    def _dump(self, stem: str, model: Model) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        pir = self.directory / f"{stem}.pir"
        _write_pir(model, pir)
        self.written.append(pir)
        if pir.with_suffix(".weights").exists():
            self.written.append(pir.with_suffix(".weights"))
        if self.onnx:
            path = self.directory / f"{stem}.onnx"
            _save_onnx(model, path)
            self.written.append(path)

    def on_start(self, model: Model, passes) -> None:
        self._dump("000_input", model)

    def after_pass(self, pass_: Pass, model: Model, record) -> None:
        self._dump(f"{record.index:03d}_{_safe(pass_.name)}", model)


def passctl_command() -> List[str]:
    """The argv prefix that runs this passctl: the running interpreter with ``-m
    passctl.tools.cli`` (a bare ``passctl`` may be another install, or not on PATH)."""
    return [sys.executable, "-m", "passctl.tools.cli"]


class CrashReproducer:
    """When a pass raises, writes a folder that re-runs that pass on the IR it got.

    The folder (``<directory>/<NNN>_<pass>``) holds ``input.onnx`` and ``input.pir`` (+
    ``input.weights`` when it has large new constants; the IR before the failing pass), ``pipeline.txt`` (that pass with its options), ``plugins/`` (copies of
    ``--load`` files defining it), ``error.txt`` and ``reproduce.sh``, which runs
    ``<python> -m passctl.tools.cli input.onnx --pipeline <pass> --target <target> --verify-each
    [--load plugins/F.py] -o OUT --reproducer-dir <OUT folder>/reproducers`` (``$OUT`` may be set).
    Its path is stored in ``failure.reproducer``.

    Costs one structural copy of the model (weights shared) before every pass.

    Args:
        directory: parent folder of the reproducer folders.
        target: target profile name written into the command.
        write: receives one line naming the folder.
    """

    def __init__(self, directory, target: str = "cpu", write: Optional[Write] = None):
        self.directory = Path(directory)
        self.target = target
        self.write = write or _default_write
        self._snapshot: Optional[Model] = None
        self.folders: List[Path] = []

    def before_pass(self, pass_: Pass, model: Model, index: int) -> None:
        self._snapshot = clone_model(model)

    def on_failure(self, pass_: Pass, model: Model, failure, index: int) -> None:
        from passctl.passes.pipeline_text import format_pass

        snapshot = self._snapshot if self._snapshot is not None else model
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"{index:03d}_{_safe(pass_.name)}"
        tmp = Path(tempfile.mkdtemp(prefix=".repro-", dir=self.directory))
        try:
            args = passctl_command() + ["input.onnx", "--pipeline", format_pass(pass_),
                                        "--target", self.target, "--verify-each"]
            plugin = _plugin_file(type(pass_))
            if plugin is not None:
                (tmp / "plugins").mkdir()
                shutil.copy2(plugin, tmp / "plugins" / plugin.name)
                args += ["--load", f"plugins/{plugin.name}"]
            for fname, write in (("input.onnx", lambda p: _save_onnx(snapshot, p)),
                                 ("input.pir", lambda p: _write_pir(snapshot, p))):
                try:
                    write(tmp / fname)
                except Exception as e:  # keep the rest of the reproducer; say what is missing
                    (tmp / f"{fname}.error.txt").write_text(f"{type(e).__name__}: {e}\n")
            (tmp / "pipeline.txt").write_text(format_pass(pass_) + "\n")
            (tmp / "error.txt").write_text(str(failure) + "\n")
            cmd = " ".join(shlex.quote(a) for a in args)
            script = ("#!/bin/sh\n"
                      f"# Re-runs pass '{pass_.name}' on the IR it got (passctl crash reproducer).\n"
                      f"# It failed after passes [{', '.join(failure.before)}].\n"
                      'cd "$(dirname "$0")" || exit 1\n'
                      'OUT="${OUT:-$(mktemp -d)/out}"\n'
                      f'exec {cmd} -o "$OUT" --reproducer-dir "$(dirname "$OUT")/reproducers" '
                      '"$@"\n')
            sh = tmp / "reproduce.sh"
            sh.write_text(script)
            sh.chmod(0o755)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        failure.reproducer = str(final)
        self.folders.append(final)
        self.write(f"crash reproducer for pass '{pass_.name}' written to {final}")


def _plugin_file(cls: type) -> Optional[Path]:
    """The ``--load`` file that defined ``cls`` (None for passes of installed packages)."""
    module = sys.modules.get(cls.__module__)
    if module is None or not cls.__module__.startswith("passctl_plugin_"):
        return None
    path = getattr(module, "__file__", None)
    return Path(path) if path else None


class CheckEach:
    """After every pass, runs the current model in ONNX Runtime against the original on the same
    seeded inputs (:mod:`passctl.support.check`) and writes the worst error. A stage with
    passctl-only ops (fuse-layernorm's SkipLayerNorm, fuse-attention's Attention, ...) runs as a
    copy put through their standard lowering (``lower-standard``, which keeps each op's math),
    and its line says so.

    Args:
        original: the original model (path or ``onnx.ModelProto``), the reference.
        inputs: ``{name: array}``; ``None`` uses ``make_inputs(original, seed)``.
        seed: seed for :func:`passctl.support.check.make_inputs`.
        write: receives one line per pass: ``check after NNN <pass>: max_abs A, max_rel R (ok|FAILED)``.
        rtol: bound on the max-rel error for the ok/FAILED mark (without ``bounds``).
        atol: absolute error always accepted (see ``passctl.support.check.OutputDiff.ok``).
        bounds: ``[(metric, rtol), ...]`` every one of which must hold, each ``metric`` one of
            ``passctl.support.check.METRICS`` (the CLI's bounds: ``--rtol``, or the pipeline's amp /
            quantize budgets under their metrics); replaces ``rtol`` when given.

    Attributes:
        results: ``(index, pass name, CheckResult)`` per pass, in order.
    """

    def __init__(self, original, inputs: Optional[Dict[str, Any]] = None, seed: int = 0,
                 write: Optional[Write] = None, rtol: Optional[float] = None, atol: float = 0.0,
                 bounds: Optional[List[Any]] = None):
        from passctl.support.check import DEFAULT_RTOL, make_inputs, run_onnxruntime

        self.original = original
        self.inputs = dict(inputs) if inputs is not None else make_inputs(original, seed=seed)
        self.reference = run_onnxruntime(original, self.inputs)
        self.write = write or _default_write
        self.atol = atol
        self.bounds = list(bounds) if bounds else [
            ("max-rel", DEFAULT_RTOL if rtol is None else rtol)]
        self.results: List[Any] = []

    def ok(self, result) -> bool:
        """Whether ``result`` (a :class:`passctl.support.check.CheckResult`) meets every bound."""
        return all(result.ok(rtol, self.atol, metric) for metric, rtol in self.bounds)

    def after_pass(self, pass_: Pass, model: Model, record) -> None:
        from passctl.ir.onnx_export import to_onnx
        from passctl.passes.lowering.lower_standard import has_passctl_ops, make_runnable
        from passctl.support.check import compare, run_onnxruntime

        via = ""
        try:
            if has_passctl_ops(model):  # no runtime has kernels for them: their standard lowering
                model = clone_model(model)
                make_runnable(model)
                via = " (passctl-only ops run through lower-standard)"
            outputs = run_onnxruntime(to_onnx(model), self.inputs)
        except Exception as e:  # a stage ORT cannot run is a finding to report, not a crash
            self.results.append((record.index, pass_.name, None))
            self.write(f"check after {record.index:03d} {pass_.name}: does not run in ONNX Runtime"
                       f"{via}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            return
        result = compare(self.reference, outputs)
        self.results.append((record.index, pass_.name, result))
        max_abs = max((d.max_abs for d in result.outputs.values()), default=0.0)
        mark = ("ok" if self.ok(result) else "FAILED: " + "; ".join(
            line for metric, rtol in self.bounds for line in result.failures(rtol, self.atol, metric)))
        self.write(f"check after {record.index:03d} {pass_.name}: max_abs {max_abs:.3g}, "
                   f"max_rel {result.max_rel:.3g} ({mark}){via}")


__all__ = ["CheckEach", "CrashReproducer", "DumpIR", "PrintIR", "Timing"]
