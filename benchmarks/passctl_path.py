"""Make ``import passctl`` work in the GPU benchmarks when passctl is not installed (the GPU machine)."""

from __future__ import annotations

import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ensure_passctl_importable() -> None:
    """Import passctl, or expose this checkout as ``passctl`` through a symlink in a temporary
    folder put first on ``sys.path`` (the repository root is the package: setup maps ir/, passes/,
    targets/, tools/ to passctl.*)."""
    try:
        import passctl.passes  # noqa: F401
        return
    except ImportError:
        pass
    shim = tempfile.mkdtemp(prefix="passctl-shim-")
    os.symlink(REPO, os.path.join(shim, "passctl"))
    sys.path.insert(0, shim)
    for name in [m for m in sys.modules if m == "passctl" or m.startswith("passctl.")]:
        del sys.modules[name]
    import passctl.passes  # noqa: F401
