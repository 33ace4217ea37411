"""The emitter registry: names to Emitter classes, the ``passctl.emitters`` entry points, and
``--emit`` text (``tvm{kernels=triton,cuda_graph=false}``) parsed by the pipeline-text parser."""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import inspect
import typing
from typing import Any, Dict, List, Optional, Type

from passctl.ir.errors import UserError
from passctl.passes.option_text import OptionWords, parse_item
from passctl.targets.base import Emitter

ENTRY_POINT_GROUP = "passctl.emitters"

# Modules holding the built-in emitters, imported on the first lookup (as the pass registry does),
# so importing passctl.targets stays cheap and an emitter module may import this registry.
_builtin_modules: List[str] = [
    "passctl.targets.onnxruntime.emit",
    "passctl.targets.tvm.emit",
    "passctl.targets.tensorrt.emit",
]

_EMITTERS: Dict[str, Type[Emitter]] = {}
_loaded = False


def register_emitter(cls: Optional[Type[Emitter]] = None, *, replace: bool = False):
    """Class decorator adding an :class:`Emitter` subclass to the registry under ``cls.name``.

    Usable as ``@register_emitter`` or ``@register_emitter(replace=True)``. The constructor's
    keyword arguments, with their annotated types, are the emitter's ``--emit`` options.

    Raises:
        TypeError: ``cls`` is not an Emitter subclass or has no lower-case name.
        ValueError: the name is taken by another class and ``replace`` is false.
    """

    def _register(c: Type[Emitter]) -> Type[Emitter]:
        if not (isinstance(c, type) and issubclass(c, Emitter)):
            raise TypeError(f"register_emitter: {c!r} is not a subclass of "
                            "passctl.targets.base.Emitter")
        if not c.name or c.name != c.name.strip().lower():
            raise TypeError(f"register_emitter: {c.__qualname__}.name must be a lower-case name, "
                            f"got {c.name!r}")
        old = _EMITTERS.get(c.name)
        if old is not None and old is not c and not replace and not (
                old.__module__ == c.__module__ and old.__qualname__ == c.__qualname__):
            raise ValueError(f"register_emitter: emitter '{c.name}' is already registered by "
                             f"{old.__module__}.{old.__qualname__}; use register_emitter(replace=True)")
        _EMITTERS[c.name] = c
        return c

    return _register if cls is None else _register(cls)


def _ensure_loaded() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True  # first: a built-in module registers while it is imported
    try:
        for module in _builtin_modules:
            importlib.import_module(module)
        load_entry_points()
    except BaseException:
        _loaded = False
        raise


def load_entry_points() -> List[str]:
    """Import every entry point of the ``passctl.emitters`` group; an entry point that is an
    Emitter class is registered (a module registers its own with :func:`register_emitter`).

    Returns:
        The names of the entry points loaded.

    Raises:
        UserError: an entry point fails to import (names it and the group).
    """
    loaded = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as e:  # a broken plugin must not look like a passctl bug
            raise UserError(f"entry point '{ep.name} = {ep.value}' (group {ENTRY_POINT_GROUP}) "
                            f"failed to import: {type(e).__name__}: {e}; fix or uninstall that "
                            "plugin") from e
        if isinstance(obj, type) and issubclass(obj, Emitter):
            register_emitter(obj)
        loaded.append(ep.name)
    return loaded


def emitter_names() -> List[str]:
    """Names accepted by ``--emit``: the built-in emitters in :data:`_builtin_modules` order,
    then the others in registration order."""
    _ensure_loaded()
    order = {module: i for i, module in enumerate(_builtin_modules)}
    names = list(_EMITTERS)
    return sorted(names, key=lambda n: (order.get(_EMITTERS[n].__module__, len(order)),
                                        names.index(n)))


def emitter_class(name: str) -> Type[Emitter]:
    """The emitter class registered as ``name`` (case-insensitive).

    Raises:
        UserError: unknown name; the closest names are suggested.
    """
    _ensure_loaded()
    cls = _EMITTERS.get(name.strip().lower())
    if cls is None:
        close = difflib.get_close_matches(name.lower(), list(_EMITTERS), n=2, cutoff=0.4)
        hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
        raise UserError(f"unknown emitter '{name}': {hint}known emitters: {', '.join(emitter_names())}")
    return cls


def emitter_options(cls: Type[Emitter]) -> Dict[str, Any]:
    """The ``--emit`` options of ``cls``: its constructor's keyword arguments and their annotated
    types, in order."""
    hints = typing.get_type_hints(cls.__init__)
    return {p: hints.get(p, str) for p in inspect.signature(cls.__init__).parameters if p != "self"}


class _EmitWords(OptionWords):
    """How ``--emit`` option errors read (the pipeline-text parser's messages, for an emitter)."""

    def no_options(self, name: str) -> str:
        return f"the {name} emitter takes no options"

    def unknown_option(self, name, key, known, hint) -> str:
        more = f"; {hint.strip()}" if hint else ""
        return (f"unknown {name} emitter option '{key}'; known: {', '.join(known)} "
                f"(as key=value){more}")

    def twice(self, name: str, key: str) -> str:
        return f"option '{key}' is given twice"

    def no_equals(self, name: str, key: str, found: str) -> str:
        return f"option '{key}' needs a value ({key}=VALUE)"

    def bad_value(self, name: str, key: str, expected: str, raw: str) -> str:
        return f"option {key}='{raw}' must be {expected}"

    def unclosed(self, name: str, key: str, found: str) -> str:
        return self.trailing(name)

    def trailing(self, name: str) -> str:
        return f"options go in one pair of braces at the end, e.g. '{name}{{key=value,key=value}}'"

    def convert(self, raw: str, tp: Any) -> Any:
        if raw.lower() == "auto" and type(None) in typing.get_args(tp):
            return None  # an Optional option's None means "decide automatically"
        return super().convert(raw, tp)


def get_emitter(text: str) -> Emitter:
    """The emitter ``text`` names, with options in braces as in pipeline text:
    ``tvm{kernels=triton,fp32_precision=tf32x3,cuda_graph=false}`` (the options are the emitter
    class's constructor arguments, converted to their annotated types by the pipeline-text
    parser; a quoted value may hold commas; ``auto`` gives an Optional option None).

    Raises:
        UserError: unknown name (closest names suggested), an unknown option (the known ones
            listed), a value of the wrong type, an unterminated quote, text after the braces, or
            options the emitter refuses; one line starting ``--emit 'TEXT':``.
    """
    text = text.strip()
    label = f"--emit '{text}'"
    spec = parse_item(text, lambda name: emitter_options(emitter_class(name)), _EmitWords(), label)
    try:
        return emitter_class(spec.name)(**spec.options)
    except UserError as e:
        raise UserError(f"{label}: {e}") from None


__all__ = ["ENTRY_POINT_GROUP", "emitter_class", "emitter_names", "emitter_options",
           "get_emitter", "load_entry_points", "register_emitter"]
