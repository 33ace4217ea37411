"""Helpers the benchmarks share: make ``import passctl`` work when passctl is not installed (the GPU
machine), and scratch folders that are removed when the process exits."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def scratch_dir(prefix: str) -> str:
    """A new folder under the system temp folder (``tempfile.mkdtemp``), removed with everything in it
    when the process exits: a benchmark's artifacts are often hundreds of MB (a BERT-base TVM build is
    ~415 MB) and a run that leaves them behind fills the disk."""
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def ensure_passctl_importable() -> None:
    """Import passctl, or expose this checkout as ``passctl`` through a symlink in a temporary
    folder put first on ``sys.path`` (the repository root is the package: setup maps ir/, passes/,
    targets/, tools/ to passctl.*)."""
    try:
        import passctl.passes  # noqa: F401
        return
    except ImportError:
        pass
    shim = scratch_dir("passctl-shim-")
    os.symlink(REPO, os.path.join(shim, "passctl"))
    sys.path.insert(0, shim)
    for name in [m for m in sys.modules if m == "passctl" or m.startswith("passctl.")]:
        del sys.modules[name]
    import passctl.passes  # noqa: F401
