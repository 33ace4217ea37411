"""Pipeline text (``fold-constants,fuse-conv-bn,amp{dtype=fp16,budget=1e-3}``): parse, type, format.

The grammar and the typed values are :mod:`passctl.passes.option_text`, shared with ``--emit``."""

from __future__ import annotations

import dataclasses
import enum
import typing
from typing import Any, Callable, Dict, List, Optional, Sequence, Type

from passctl.ir.errors import UserError
from passctl.passes.base import Pass
from passctl.passes.option_text import (OptionWords, PassSpec, PipelineSyntaxError, _Parser,
                                        parse_item, split_outside_quotes)
from passctl.passes.registry import expand_alias, get_pass, is_alias
from passctl.support.context import CompileContext

__all__ = ["OptionWords", "PassSpec", "PipelineSyntaxError", "build_pipeline", "expand_specs",
           "format_pass", "format_pipeline", "instantiate", "parse_item", "parse_pipeline",
           "split_outside_quotes"]


def _option_classes(name: str, target: Optional[str],
                    emitter: Optional[str] = None) -> List[Type[Pass]]:
    if is_alias(name):
        return [get_pass(n) for n in expand_alias(name, target, emitter)]
    return [get_pass(name)]


def _field_types(cls: Type[Pass]) -> Dict[str, Any]:
    if cls.Options is None:
        return {}
    hints = typing.get_type_hints(cls.Options)
    return {f.name: hints.get(f.name, str) for f in dataclasses.fields(cls.Options)}


def _pass_option_types(target: Optional[str], emitter: Optional[str]) -> Callable[[str], Dict[str, Any]]:
    """The option types of a pass or alias name (an alias takes the options of all its passes)."""
    def types(name: str) -> Dict[str, Any]:
        merged: Dict[str, Any] = {}
        for c in _option_classes(name, target, emitter):
            for k, t in _field_types(c).items():
                merged.setdefault(k, t)
        return merged
    return types


def parse_pipeline(text: str, target: Optional[str] = None,
                   emitter: Optional[str] = None) -> List[PassSpec]:
    """Parse pipeline text into pass specs with typed options (aliases are kept, not expanded).

    Grammar: ``item (',' item)*``; ``item := name ['{' key '=' value (',' key '=' value)* '}']``;
    a value is bare text without ``,{}`` or a quoted string. Values are converted to the type of
    the pass's ``Options`` field (int, float, bool, str, Enum, Literal, Optional). For an alias,
    the options of all its passes (for ``target``) are accepted.

    Args:
        text: The pipeline text; blank text is an empty pipeline.
        target: The target profile used to expand aliases (default target when None).
        emitter: The emitter the pipeline feeds; aliases may differ per emitter (``fuse``).

    Returns:
        One :class:`PassSpec` per element, in order.

    Raises:
        PipelineSyntaxError: (a UserError) bad syntax, unknown pass/alias, alias with no passes yet,
            unknown option (with the known ones), or a value of the wrong type; names the column.
    """
    return _Parser(text, _pass_option_types(target, emitter)).parse()


def expand_specs(specs: Sequence[PassSpec], target: Optional[str] = None,
                 emitter: Optional[str] = None) -> List[PassSpec]:
    """Replace alias specs by their passes (for ``target`` and ``emitter``), handing each the options
    it declares."""
    out: List[PassSpec] = []
    for s in specs:
        if not is_alias(s.name):
            out.append(s)
            continue
        for n in expand_alias(s.name, target, emitter):
            fields = _field_types(get_pass(n))
            out.append(PassSpec(n, {k: v for k, v in s.options.items() if k in fields}, s.column))
    return out


def instantiate(spec: PassSpec) -> Pass:
    """Create the pass object of ``spec`` (defaults for options not given).

    Raises:
        UserError: a required option (a field without default) is missing.
    """
    cls = get_pass(spec.name)
    if cls.Options is None:
        return cls()
    try:
        p = cls(cls.Options(**spec.options))
    except TypeError as e:
        raise UserError(f"pass '{spec.name}': {e}; give it as {spec.name}{{key=value}}") from None
    p.given_options = frozenset(spec.options)
    return p


def build_pipeline(text: str, target: Optional[str] = None, emitter: Optional[str] = None,
                   context: Optional[CompileContext] = None) -> List[Pass]:
    """Parse ``text``, expand aliases for ``target`` and ``emitter``, create the passes, in order,
    and let each take what it needs from the compile context (:meth:`Pass.configure`; options
    the text gives win).

    Args:
        text: the pipeline text.
        target: the target profile name (aliases differ per target).
        emitter: the emitter name (aliases differ per emitter).
        context: the compile context; default: one for ``target`` and ``emitter``
            (:meth:`CompileContext.for_target`).

    Raises:
        PipelineSyntaxError / UserError: as :func:`parse_pipeline` and :func:`instantiate`.
    """
    specs = expand_specs(parse_pipeline(text, target, emitter), target, emitter)
    if context is None:
        context = CompileContext.for_target(target, emitter)
    passes = [instantiate(s) for s in specs]
    for p in passes:
        p.configure(context)
    return passes


def format_pass(p: Pass) -> str:
    """Pipeline text of one pass: its name plus the options that differ from their defaults."""
    if p.options is None or not dataclasses.is_dataclass(p.options):
        return p.name
    parts = []
    for f in dataclasses.fields(p.options):
        v = getattr(p.options, f.name)
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        if v == default:
            continue
        if isinstance(v, enum.Enum):
            v = v.value
        if isinstance(v, bool):
            v = str(v).lower()
        text = str(v)
        if any(c in text for c in ",{}") or text != text.strip():
            text = f'"{text}"'
        parts.append(f"{f.name}={text}")
    return f"{p.name}{{{','.join(parts)}}}" if parts else p.name


def format_pipeline(passes: Sequence[Pass]) -> str:
    """Pipeline text that :func:`build_pipeline` turns back into equal passes."""
    return ",".join(format_pass(p) for p in passes)
