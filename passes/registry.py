"""The pass registry: names to Pass classes, group aliases, suggestions, plugin files and entry points."""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import logging
import sys
from pathlib import Path
from typing import Dict, List, Optional, Type

from passctl.ir.errors import UserError
from passctl.passes.base import Pass
from passctl.passes.pipelines import ALIASES, NOT_YET, alias_passes

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "passctl.passes"

# Modules holding the built-in passes; imported on the first lookup so that importing the registry
# stays cheap and a pass module may itself import the registry.
_builtin_modules: List[str] = [
    "passctl.passes.common.infer_shapes",
    "passctl.passes.common.eliminate_identity",
    "passctl.passes.common.fold_constants",
    "passctl.passes.common.cse",
    "passctl.passes.common.dce",
    "passctl.passes.fusion.fold_batchnorm",
    "passctl.passes.fusion.conv_activation",
    "passctl.passes.fusion.gemm",
    "passctl.passes.fusion.reshape_chain",
    # Normalization / activation fusion families and target lowering (issue 4, H8).
    "passctl.passes.fusion.layernorm",
    "passctl.passes.fusion.skip_rmsnorm",
    "passctl.passes.fusion.gelu",
    "passctl.passes.fusion.activations",
    "passctl.passes.lowering.lower_onnxruntime",
    "passctl.passes.lowering.lower_standard",
    # Static shapes and TVM frontend legalizations (issue 5, H12).
    "passctl.passes.lowering.lower_tvm",
    # Structural re-parameterization (issue 7, H11).
    "passctl.passes.reparam.merge_branches",
    # Attention fusion and its lowerings (issue 6, H14).
    "passctl.passes.attention.fuse",
    "passctl.passes.attention.lower",
    # Rotary embedding as one canonical op (issue 17).
    "passctl.passes.attention.fuse_rotary",
    "passctl.passes.attention.lower_rotary",
    "passctl.passes.attention.fuse_past",
    "passctl.passes.attention.lower_past",
    "passctl.passes.fusion.projections",
    # Layer-wise mixed precision (issue 8, H13).
    "passctl.passes.precision.amp",
    "passctl.passes.quantize.quantize_int8",
    # Weight-only int8/int4 and dynamic int8 MatMuls (issue 18).
    "passctl.passes.quantize.weights",
    "passctl.passes.quantize.dynamic",
]

_PASSES: Dict[str, Type[Pass]] = {}
_builtins_loaded = False
_entry_points_loaded = False


class UnknownPassError(UserError):
    """A pipeline names a pass or alias that is not registered."""


def register_pass(cls: Optional[Type[Pass]] = None, *, replace: bool = False):
    """Class decorator adding a :class:`Pass` subclass to the registry under ``cls.name``.

    Usable as ``@register_pass`` or ``@register_pass(replace=True)``.

    Args:
        cls: The pass class; it must set a non-empty kebab-case ``name``.
        replace: Allow replacing a different class registered under the same name (plugins
            overriding a built-in pass).

    Returns:
        The class itself (unchanged), or a decorator when called with keywords only.

    Raises:
        TypeError: ``cls`` is not a Pass subclass or has no name.
        ValueError: the name is an alias, or is taken by another class and ``replace`` is false.
    """

    def _register(c: Type[Pass]) -> Type[Pass]:
        if not (isinstance(c, type) and issubclass(c, Pass)):
            raise TypeError(f"register_pass: {c!r} is not a subclass of passctl.passes.base.Pass")
        name = c.name
        if not name or name != name.strip() or name.lower() != name or " " in name or "_" in name:
            raise TypeError(f"register_pass: {c.__qualname__}.name must be a kebab-case name, got {name!r}")
        if name in ALIASES:
            raise ValueError(f"register_pass: '{name}' is a pass group alias; pick another name")
        old = _PASSES.get(name)
        if old is not None and old is not c and not replace and not _same_class(old, c):
            raise ValueError(f"register_pass: pass '{name}' is already registered by "
                             f"{old.__module__}.{old.__qualname__}; use register_pass(replace=True)")
        _PASSES[name] = c
        return c

    if cls is None:
        return _register
    return _register(cls)


def _same_class(a: type, b: type) -> bool:
    # The same module imported twice (e.g. a plugin file loaded again) defines an equal class.
    return a.__module__ == b.__module__ and a.__qualname__ == b.__qualname__


def unregister_pass(name: str) -> None:
    """Remove ``name`` from the registry (tests and plugin reloads); a missing name is ignored."""
    _PASSES.pop(name, None)


def _ensure_loaded() -> None:
    global _builtins_loaded, _entry_points_loaded
    if not _builtins_loaded:
        # Set first: a built-in module may look passes up while it is being imported.
        _builtins_loaded = True
        try:
            for module in _builtin_modules:
                importlib.import_module(module)
        except BaseException:
            _builtins_loaded = False
            raise
    if not _entry_points_loaded:
        _entry_points_loaded = True
        load_entry_points()


def load_entry_points() -> List[str]:
    """Import every module of the ``passctl.passes`` entry-point group so its passes register.

    Returns:
        The names of the entry points loaded.

    Raises:
        UserError: an entry point fails to import (names the distribution and the entry point).
    """
    loaded = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as e:  # a broken plugin must not look like a passctl bug
            raise UserError(f"entry point '{ep.name} = {ep.value}' (group {ENTRY_POINT_GROUP}) failed "
                            f"to import: {type(e).__name__}: {e}; fix or uninstall that plugin") from e
        if isinstance(obj, type) and issubclass(obj, Pass):
            register_pass(obj)
        loaded.append(ep.name)
    return loaded


def load_plugin_file(path) -> List[str]:
    """Import a Python file whose ``@register_pass`` classes register (the CLI's ``--load FILE.py``).

    Args:
        path: Path of a ``.py`` file.

    Returns:
        The names of the passes the file registered (new or replaced), in registration order.

    Raises:
        UserError: the file is missing, is not ``.py``, or raises while being imported.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: plugin file not found; give the path of a .py file to --load")
    if path.suffix != ".py":
        raise UserError(f"{path}: plugin file must be a .py file")
    _ensure_loaded()
    before = dict(_PASSES)
    module_name = f"passctl_plugin_{abs(hash(str(path.resolve()))):x}_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except UserError:
        sys.modules.pop(module_name, None)
        raise
    except Exception as e:
        sys.modules.pop(module_name, None)
        raise UserError(f"{path}: plugin file raised {type(e).__name__} while being imported: {e}") from e
    return [n for n, c in _PASSES.items() if before.get(n) is not c]


def _suggest(name: str) -> str:
    known = sorted(set(_PASSES) | set(ALIASES))
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    if close:
        return "did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
    return "run `passctl list-passes` for the known names"


def get_pass(name: str) -> Type[Pass]:
    """The pass class registered as ``name``.

    Raises:
        UnknownPassError: no such pass; the message suggests the closest known names (difflib).
            An alias name is refused here too, with a hint to use :func:`expand_names`.
    """
    _ensure_loaded()
    cls = _PASSES.get(name)
    if cls is not None:
        return cls
    if name in ALIASES:
        raise UnknownPassError(f"'{name}' is a pass group, not a single pass; expand it with the pipeline")
    raise UnknownPassError(f"unknown pass '{name}'; {_suggest(name)}")


def list_passes() -> List[Type[Pass]]:
    """All registered pass classes, sorted by name."""
    _ensure_loaded()
    return [_PASSES[n] for n in sorted(_PASSES)]


def is_alias(name: str) -> bool:
    """Whether ``name`` is a pass group alias (``cleanup``, ``fuse``...)."""
    return name in ALIASES


def list_aliases() -> List[str]:
    """The alias names, sorted."""
    return sorted(ALIASES)


def expand_alias(name: str, target: Optional[str] = None, emitter: Optional[str] = None) -> List[str]:
    """The ordered pass names of alias ``name`` for ``target`` and ``emitter``.

    Raises:
        UnknownPassError: ``name`` is not an alias (with suggestions).
        UserError: the alias has no passes yet in this version (says which feature is missing).
    """
    names = alias_passes(name, target, emitter)
    if names is None:
        raise UnknownPassError(f"unknown pass group '{name}'; {_suggest(name)}")
    if not names:
        why = NOT_YET.get(name, "no passes are registered for it")
        raise UserError(f"`{name}` has no passes yet: {why}")
    return names


def expand_names(names: List[str], target: Optional[str] = None,
                 emitter: Optional[str] = None) -> List[str]:
    """Expand aliases in ``names`` (in place order) and check every resulting pass exists.

    Raises:
        UnknownPassError / UserError: as :func:`get_pass` and :func:`expand_alias`.
    """
    out: List[str] = []
    for n in names:
        if is_alias(n):
            out.extend(expand_alias(n, target, emitter))
        else:
            get_pass(n)
            out.append(n)
    return out
