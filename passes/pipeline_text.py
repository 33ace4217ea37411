"""Pipeline text (``fold-constants,fuse-conv-bn,amp{dtype=fp16,budget=1e-3}``): parse, type, format."""

from __future__ import annotations

import dataclasses
import difflib
import enum
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type

from passctl.ir.errors import UserError
from passctl.passes.base import Pass
from passctl.passes.registry import expand_alias, get_pass, is_alias

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


class PipelineSyntaxError(UserError):
    """Pipeline text that does not parse or whose option values do not fit the pass's options.

    ``column`` is 1-based; ``str()`` is one line naming the column and what was expected.
    """

    def __init__(self, text: str, column: int, message: str):
        self.text, self.column, self.message = text, column, message
        super().__init__(f"pipeline '{text}', column {column}: {message}")


@dataclass
class PassSpec:
    """One pipeline element: a pass (or alias) name and its typed options.

    Attributes:
        name: the pass or alias name as written.
        options: option name (the Options field name) -> typed value.
        column: 1-based column of the name in the pipeline text (0 when built in code).
    """

    name: str
    options: Dict[str, Any] = field(default_factory=dict)
    column: int = 0


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


def _convert(raw: str, tp: Any) -> Any:
    """Convert option text ``raw`` to type ``tp``; raise ValueError saying what was expected."""
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if raw.lower() in ("none", "null") and len(args) < len(typing.get_args(tp)):
            return None
        errors = []
        for a in args:
            try:
                return _convert(raw, a)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(" or ".join(errors))
    if origin is typing.Literal:
        choices = typing.get_args(tp)
        for c in choices:
            if str(c) == raw:
                return c
        raise ValueError("one of " + ", ".join(str(c) for c in choices))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        for m in tp:
            if raw.lower() in (m.name.lower(), str(m.value).lower()):
                return m
        raise ValueError("one of " + ", ".join(str(m.value) for m in tp))
    if tp is bool:
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise ValueError("true or false")
    if tp is int:
        try:
            return int(raw, 0) if raw.lower().startswith(("0x", "0b", "0o")) else int(raw)
        except ValueError:
            raise ValueError("an integer") from None
    if tp is float:
        try:
            return float(raw)
        except ValueError:
            raise ValueError("a number such as 1e-3") from None
    if tp in (str, Any):
        return raw
    raise ValueError(f"a value of a type pipeline text cannot express ({tp})")


class _Parser:
    def __init__(self, text: str, target: Optional[str], emitter: Optional[str] = None):
        self.text, self.pos, self.target, self.emitter = text, 0, target, emitter

    def error(self, message: str, pos: Optional[int] = None) -> PipelineSyntaxError:
        return PipelineSyntaxError(self.text, (self.pos if pos is None else pos) + 1, message)

    def skip_ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def found(self) -> str:
        return f"'{self.peek()}'" if self.peek() else "the end of the text"

    def parse(self) -> List[PassSpec]:
        specs = []
        self.skip_ws()
        if not self.peek():
            return specs
        while True:
            specs.append(self.item())
            self.skip_ws()
            if not self.peek():
                return specs
            if self.peek() != ",":
                raise self.error(f"expected ',' or '{{' after pass '{specs[-1].name}', found {self.found()}")
            self.pos += 1

    def item(self) -> PassSpec:
        self.skip_ws()
        start = self.pos
        m = _NAME.match(self.text, self.pos)
        if not m:
            raise self.error(f"expected a pass name, found {self.found()}")
        name = m.group(0)
        self.pos = m.end()
        try:
            classes = _option_classes(name, self.target, self.emitter)
        except UserError as e:
            raise PipelineSyntaxError(self.text, start + 1, str(e)) from None
        spec = PassSpec(name, {}, start + 1)
        self.skip_ws()
        if self.peek() == "{":
            self.pos += 1
            spec.options = self.options(name, classes)
        return spec

    def options(self, name: str, classes: List[Type[Pass]]) -> Dict[str, Any]:
        types: Dict[str, Any] = {}
        for c in classes:
            for k, t in _field_types(c).items():
                types.setdefault(k, t)
        opts: Dict[str, Any] = {}
        prev: Optional[Tuple[str, str]] = None  # the last option read and its raw value
        self.skip_ws()
        if self.peek() == "}":
            self.pos += 1
            return opts
        while True:
            self.skip_ws()
            kstart = self.pos
            m = _KEY.match(self.text, self.pos)
            if not m:
                raise self.error(f"expected an option name in '{name}{{...}}', found {self.found()}")
            key = m.group(0).replace("-", "_")
            self.pos = m.end()
            if key not in types:
                if not types:
                    raise self.error(f"pass '{name}' takes no options", kstart)
                close = difflib.get_close_matches(key, list(types), n=1)
                hint = f"did you mean '{close[0]}'? " if close else ""
                if not close and prev is not None:
                    hint = self._quote_hint(prev, kstart)
                raise self.error(f"pass '{name}' has no option '{key}'; {hint}"
                                 f"known options: {', '.join(types)}", kstart)
            if key in opts:
                raise self.error(f"option '{key}' of '{name}' is given twice", kstart)
            self.skip_ws()
            if self.peek() != "=":
                raise self.error(f"expected '=' after option '{key}', found {self.found()}")
            self.pos += 1
            self.skip_ws()
            vstart = self.pos
            raw = self.value()
            try:
                opts[key] = _convert(raw, types[key])
            except ValueError as e:
                raise self.error(f"option '{key}' of '{name}' expects {e}, got '{raw}'", vstart) from None
            prev = (key, raw)
            self.skip_ws()
            if self.peek() == "}":
                self.pos += 1
                return opts
            if self.peek() != ",":
                raise self.error(f"expected ',' or '}}' after the value of '{key}', found {self.found()}")
            self.pos += 1

    def _quote_hint(self, prev: Tuple[str, str], kstart: int) -> str:
        """A hint for ``dims=batch=1,seq=3``: the unknown option at ``kstart`` likely continues the
        previous value (a value holding ',' must be quoted)."""
        key, raw = prev
        end = self.text.find("}", kstart)
        rest = self.text[kstart:end if end >= 0 else len(self.text)].strip()
        if "=" not in raw and "=" not in rest:
            return ""
        return (f"if '{rest}' is part of the value of '{key}', quote the value: "
                f'{key}="{raw},{rest}"; ')

    def value(self) -> str:
        if self.peek() in ("'", '"'):
            quote, start = self.peek(), self.pos
            end = self.text.find(quote, self.pos + 1)
            if end < 0:
                raise self.error(f"unterminated {quote}-quoted value", start)
            self.pos = end + 1
            return self.text[start + 1:end]
        start = self.pos
        while self.peek() and self.peek() not in ",}{":
            self.pos += 1
        raw = self.text[start:self.pos].strip()
        if not raw:
            raise self.error(f"expected a value, found {self.found()}")
        return raw


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
    return _Parser(text, target, emitter).parse()


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
        return cls(cls.Options(**spec.options))
    except TypeError as e:
        raise UserError(f"pass '{spec.name}': {e}; give it as {spec.name}{{key=value}}") from None


def build_pipeline(text: str, target: Optional[str] = None,
                   emitter: Optional[str] = None) -> List[Pass]:
    """Parse ``text``, expand aliases for ``target`` and ``emitter`` and create the passes, in order.

    A pass whose ``Options`` declare a ``target`` field (``mixed-precision``) gets ``target`` there
    unless the text sets it, so target-dependent passes see the CLI's ``--target``.
    """
    specs = expand_specs(parse_pipeline(text, target, emitter), target, emitter)
    if target is not None:
        for s in specs:
            if "target" in _field_types(get_pass(s.name)) and "target" not in s.options:
                s.options = dict(s.options, target=target)
    return [instantiate(s) for s in specs]


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
