"""Errors passctl reports to people: one line, naming the file, node or op, and what to do."""

from __future__ import annotations


class PassctlError(Exception):
    """Base of passctl's own errors."""


class UserError(PassctlError):
    """A mistake in the user's input (bad model file, unknown pass, bad option).

    The CLI prints ``str(error)`` as one line and exits with code 2, without a traceback.
    """


class ModelLoadError(UserError):
    """A model file cannot be read: not ONNX, truncated, missing or unsafe external data."""


class ParseError(UserError):
    """The IR text form does not parse. ``str()`` is ``file:line:column: message``."""

    def __init__(self, message: str, filename: str = "<string>", line: int = 0, column: int = 0):
        self.filename, self.line, self.column, self.message = filename, line, column, message
        super().__init__(f"{filename}:{line}:{column}: {message}")
