"""passctl: a compiler framework for trained neural networks (graph IR, passes, target emitters).

The Python API mirrors the CLI (``docs/python-api.md``)::

    import passctl
    result = passctl.compile("model.onnx", pipeline="cleanup,fuse", target="cpu", check=True)
    outputs = passctl.run(result.artifact, {"input": array})

``compile``, ``load``, ``save`` and ``run`` live in :mod:`passctl.tools.api`; the error classes in
:mod:`passctl.support.errors`; ``Generator`` (LLM generation, ``docs/generate.md``) in
:mod:`passctl.targets.onnxruntime.generate`. They are imported on first use, so ``import passctl`` stays cheap
(no onnx, numpy or torch import).
"""

__version__ = "0.1.0"

_LAZY = {
    "compile": "passctl.tools.api", "load": "passctl.tools.api", "save": "passctl.tools.api",
    "run": "passctl.tools.api", "CompileResult": "passctl.tools.api",
    "UserError": "passctl.support.errors", "InternalError": "passctl.support.errors",
    "CheckFailed": "passctl.support.errors", "PassctlError": "passctl.support.errors",
    "Model": "passctl.ir", "Generator": "passctl.targets.onnxruntime.generate",
}

__all__ = ["CheckFailed", "CompileResult", "Generator", "InternalError", "Model", "PassctlError",
           "UserError", "compile", "load", "run", "save"]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'passctl' has no attribute '{name}'")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
