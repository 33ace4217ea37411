"""Crash reproducers of ``passctl compile``: a folder with the command, the traceback and the IR
for a failure outside the passes (the pass manager's own reproducer covers a failing pass)."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import tempfile
import time
import traceback
from typing import Any, Dict, List, Optional

from passctl.tools.report import write_report

logger = logging.getLogger(__name__)


def default_reproducer_dir() -> str:
    """A fresh path under the system temp folder for crash reproducers (created only on a crash)."""
    return os.path.join(tempfile.gettempdir(),
                        f"passctl-crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")


def write_crash_folder(root: Optional[str], argv: List[str], error: BaseException,
                        model=None) -> str:
    """A reproducer for a failure outside the passes: the command, traceback and IR (when given).

    The folder is ``<root>/compile-XXXX`` (``root``: ``--reproducer-dir``, else a fresh folder under
    the system temp folder). A failure caused by a full disk or quota gets none: it raises
    :class:`passctl.support.errors.EnvironmentFault` instead. It holds ``command.sh`` (re-runs the command, with the running
    interpreter, in the folder it was run from), ``traceback.txt`` and, with ``model``, ``model.pir`` (large constants in
    ``model.weights``).
    """
    from passctl.support.errors import EnvironmentFault, environment_fault, fault_message

    fault = environment_fault(error)
    if fault is not None:  # a full disk is no bug: no reproducer (it could not be written anyway)
        raise EnvironmentFault(fault_message(fault)) from error
    root = os.path.abspath(root or default_reproducer_dir())
    os.makedirs(root, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="compile-", dir=root)
    with _removed_if_disk_full(folder, error):
        _write_crash_files(folder, argv, error, model)
    return folder


@contextlib.contextmanager
def _removed_if_disk_full(folder: str, error: BaseException):
    """Remove the half-written reproducer ``folder`` when the disk fills up while it is written,
    and raise the environment's error instead (``error``: the failure being reported)."""
    from passctl.support.errors import EnvironmentFault, environment_fault, fault_message

    try:
        yield
    except Exception as e:
        fault = environment_fault(e)
        if fault is None:
            raise
        shutil.rmtree(folder, ignore_errors=True)
        parent = os.path.dirname(folder)
        if os.path.basename(parent).startswith("passctl-crash-"):  # the default root, made now
            try:
                os.rmdir(parent)  # only when empty
            except OSError:
                pass
        raise EnvironmentFault(fault_message(fault)) from e


def _write_crash_files(folder: str, argv: List[str], error: BaseException, model) -> None:
    from passctl.passes.instruments import passctl_command
    from passctl.support.errors import environment_fault

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
        except Exception as e:  # the reproducer must not hide the original error
            if environment_fault(e) is not None:
                raise
            logger.exception("could not print the model into the reproducer")


def check_failure_folder(args, argv: List[str], model, report: Dict[str, Any],
                          folder: str, why: str = "numeric check failed") -> str:
    """Crash folder for a failed check or verify run (``why``): command, IR, report.json and the
    candidate's files (every plain file of the staging ``folder``: ``model.onnx`` and its data,
    a TVM artifact's ``model.so``, ``model.params`` and ``manifest.json``, ...)."""
    error = RuntimeError(why)
    crash = write_crash_folder(args.reproducer_dir, argv, error, model)
    with _removed_if_disk_full(crash, error):
        write_report(crash, report)
        for name in os.listdir(folder):
            source = os.path.join(folder, name)
            if name != "report.json" and os.path.isfile(source) and not os.path.islink(source):
                shutil.copy2(source, os.path.join(crash, name))
    return crash
