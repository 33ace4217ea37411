"""The CLI's error classes and one-line messages, below the entry point so that every layer can
raise them (``passctl.tools.cli`` maps them to exit codes: UserError 2, InternalError 3,
EnvironmentFault 4)."""

from __future__ import annotations

import errno
import tempfile
from typing import Optional

from passctl.ir.errors import PassctlError, UserError

__all__ = ["CheckFailed", "EnvironmentFault", "InternalError", "PassctlError", "UserError",
           "environment_fault", "fault_message", "one_line"]

#: ``errno`` values of a full disk or an exhausted quota: the environment's fault, not passctl's.
DISK_FULL_ERRNOS = frozenset(e for e in (errno.ENOSPC, getattr(errno, "EDQUOT", None)) if e)


class InternalError(Exception):
    """An unexpected failure; ``reproducer`` is the folder that lets someone re-run it."""

    def __init__(self, message: str, reproducer: Optional[str] = None):
        super().__init__(message)
        self.reproducer = reproducer


class CheckFailed(InternalError):
    """The numeric check found the compiled model too far from the original (exit 3)."""


def one_line(e: BaseException) -> str:
    """The first line of ``e``'s message (its type name when empty), for one-line errors."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class EnvironmentFault(PassctlError):
    """The machine, not passctl or the user's model, stopped the run: a full disk or an exhausted
    quota (CLI exit 4, one line, no crash reproducer; nothing is left behind)."""


def environment_fault(error: Optional[BaseException]) -> Optional[OSError]:
    """The ``OSError`` of a full disk or an exhausted quota (:data:`DISK_FULL_ERRNOS`) that caused
    ``error``: ``error`` itself, or one in its ``__cause__`` / ``__context__`` chain or the
    ``cause`` a :class:`passctl.passes.manager.PassFailure` carries; None when there is none."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
            return error
        error = (getattr(error, "cause", None) or error.__cause__ or error.__context__)
    return None


def fault_message(fault: OSError) -> str:
    """One line for a full disk / quota ``fault``: what happened, where, and what to do."""
    what = "the disk quota is exceeded" if fault.errno == getattr(errno, "EDQUOT", -1) else \
        "no space is left on the device"
    where = f" writing '{fault.filename}'" if fault.filename else ""
    name = errno.errorcode.get(fault.errno or 0, str(fault.errno))
    return (f"{what}{where} ({name}): nothing was written; free space there (or choose another "
            f"-o, --reproducer-dir, or TMPDIR for the temporary files, now "
            f"{tempfile.gettempdir()}) and run again")
