"""The terminal: telling a closed stdout pipe (``passctl ... | head -1``) from a bug, and dropping
further output once its reader has gone."""

from __future__ import annotations

import os
import sys


def stdout_closed(console) -> bool:
    """Whether a BrokenPipeError means stdout's reader went away: rich's console saw it, or
    :func:`_stdout_reader_gone`."""
    return getattr(console, "stdout_closed", False) or _stdout_reader_gone()


def _stdout_reader_gone() -> bool:
    """True when stdout is a pipe whose reader has closed it (poll reports POLLERR on Linux), so a
    BrokenPipeError from elsewhere (a compiler subprocess) is not mistaken for it."""
    try:
        import select

        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll, or stdout without a descriptor
        return False


def discard_stdout() -> None:
    """Point stdout at /dev/null once its reader has gone (``passctl ... | head -1``), so later
    writes and the interpreter's final flush do not fail again (Python docs, signal module,
    "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (captured in tests)
        pass
