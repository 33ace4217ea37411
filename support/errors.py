"""The CLI's error classes and one-line messages, below the entry point so that every layer can
raise them (``passctl.tools.cli`` maps them to exit codes: UserError 2, InternalError 3)."""

from __future__ import annotations

from typing import Optional

from passctl.ir.errors import PassctlError, UserError

__all__ = ["CheckFailed", "InternalError", "PassctlError", "UserError", "one_line"]


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
