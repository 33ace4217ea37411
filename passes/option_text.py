"""Option text, ``name{key=value,...}``: the one grammar and value typing of pipeline text
(``passes/pipeline_text.py``) and of ``--emit`` text (``targets/registry.py``).

An item is ``name ['{' key '=' value (',' key '=' value)* '}']``; a value is bare text without
``,{}`` or a quoted string (which may hold commas). Values become the option's annotated type
(int, float, bool, str, Enum, Literal, Optional)."""

from __future__ import annotations

import difflib
import enum
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from passctl.ir.errors import UserError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}

class PipelineSyntaxError(UserError):
    """Pipeline text that does not parse or whose option values do not fit the pass's options.

    ``column`` is 1-based; ``str()`` is one line naming the column and what was expected.
    """

    def __init__(self, text: str, column: int, message: str, label: Optional[str] = None):
        self.text, self.column, self.message = text, column, message
        super().__init__(f"{label}: {message}" if label else
                         f"pipeline '{text}', column {column}: {message}")


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


class OptionWords:
    """How option errors read: pipeline text's wording (``pass 'x' has no option 'y'``); the
    emitter registry subclasses it for ``--emit`` text. Each method returns one message."""

    def no_options(self, name: str) -> str:
        return f"pass '{name}' takes no options"

    def expected_key(self, name: str, found: str) -> str:
        return f"expected an option name in '{name}{{...}}', found {found}"

    def unknown_option(self, name: str, key: str, known: Sequence[str], hint: str) -> str:
        return f"pass '{name}' has no option '{key}'; {hint}known options: {', '.join(known)}"

    def twice(self, name: str, key: str) -> str:
        return f"option '{key}' of '{name}' is given twice"

    def no_equals(self, name: str, key: str, found: str) -> str:
        return f"expected '=' after option '{key}', found {found}"

    def bad_value(self, name: str, key: str, expected: str, raw: str) -> str:
        return f"option '{key}' of '{name}' expects {expected}, got '{raw}'"

    def unclosed(self, name: str, key: str, found: str) -> str:
        return f"expected ',' or '}}' after the value of '{key}', found {found}"

    def trailing(self, name: str) -> str:
        return f"unexpected text after '{name}'"

    def convert(self, raw: str, tp: Any) -> Any:
        """``raw`` as a value of type ``tp`` (raises ValueError naming what was expected)."""
        return _convert(raw, tp)


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
    """Reads ``name{key=value,...}`` items: the one parser of pipeline text and ``--emit`` text.

    Args:
        text: the text.
        option_types: ``name -> {option: type}``; raises UserError for an unknown name.
        words: the wording of option errors.
        label: the error prefix instead of ``pipeline 'TEXT', column N`` (``--emit 'TEXT'``).
    """

    def __init__(self, text: str, option_types: Callable[[str], Dict[str, Any]],
                 words: Optional[OptionWords] = None, label: Optional[str] = None):
        self.text, self.pos, self.option_types = text, 0, option_types
        self.words, self.label = words or OptionWords(), label

    def error(self, message: str, pos: Optional[int] = None) -> PipelineSyntaxError:
        return PipelineSyntaxError(self.text, (self.pos if pos is None else pos) + 1, message,
                                   self.label)

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
            types = self.option_types(name)
        except UserError as e:
            raise self.error(str(e), start) from None
        spec = PassSpec(name, {}, start + 1)
        self.skip_ws()
        if self.peek() == "{":
            self.pos += 1
            spec.options = self.options(name, types)
        return spec

    def options(self, name: str, types: Dict[str, Any]) -> Dict[str, Any]:
        words = self.words
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
                raise self.error(words.expected_key(name, self.found()))
            key = m.group(0).replace("-", "_")
            self.pos = m.end()
            if key not in types:
                if not types:
                    raise self.error(words.no_options(name), kstart)
                close = difflib.get_close_matches(key, list(types), n=1)
                hint = f"did you mean '{close[0]}'? " if close else ""
                if not close and prev is not None:
                    hint = self._quote_hint(prev, kstart)
                raise self.error(words.unknown_option(name, key, list(types), hint), kstart)
            if key in opts:
                raise self.error(words.twice(name, key), kstart)
            self.skip_ws()
            if self.peek() != "=":
                raise self.error(words.no_equals(name, key, self.found()))
            self.pos += 1
            self.skip_ws()
            vstart = self.pos
            raw = self.value()
            try:
                opts[key] = words.convert(raw, types[key])
            except ValueError as e:
                raise self.error(words.bad_value(name, key, str(e), raw), vstart) from None
            prev = (key, raw)
            self.skip_ws()
            if self.peek() == "}":
                self.pos += 1
                return opts
            if self.peek() != ",":
                raise self.error(words.unclosed(name, key, self.found()))
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


def parse_item(text: str, option_types: Callable[[str], Dict[str, Any]], words: OptionWords,
               label: str) -> PassSpec:
    """Parse one ``name{key=value,...}`` item with the pipeline-text grammar and value types (the
    ``--emit`` text of the emitter registry).

    Args:
        text: the item text.
        option_types: ``name -> {option: type}``; raises UserError for an unknown name.
        words: the wording of option errors; ``words.trailing(name)`` for text after the item.
        label: the prefix of error messages, e.g. ``--emit 'tvm{...}'``.

    Raises:
        PipelineSyntaxError: (a UserError) bad syntax, unknown name or option, a value of the
            wrong type, or text after the item.
    """
    parser = _Parser(text, option_types, words, label)
    spec = parser.item()
    parser.skip_ws()
    if parser.peek():
        raise parser.error(words.trailing(spec.name))
    return spec


def split_outside_quotes(body: str, sep: str = ",") -> List[str]:
    """Split ``body`` on ``sep`` where it is not inside single or double quotes (the rule pipeline
    text uses for option values such as ``lower-tvm{dims="a=1,b=2"}``). Quotes are kept in the
    parts; a quote opens at a ``'`` or ``"`` and closes at the next same character.

    Args:
        body: the text between the braces, e.g. ``kernels=tvm,key="a,b"``.
        sep: the one-character separator.

    Returns:
        The parts, unstripped (``'a,"b,c"'`` -> ``['a', '"b,c"']``; ``''`` -> ``['']``).

    Raises:
        ValueError: a quote is not closed; the message names the quote and where it opens.
    """
    parts: List[str] = []
    start, quote, opened = 0, "", 0
    for i, ch in enumerate(body):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote, opened = ch, i
        elif ch == sep:
            parts.append(body[start:i])
            start = i + 1
    if quote:
        raise ValueError(f"unterminated {quote}-quoted value at {body[opened:]!r}; close it with {quote}")
    parts.append(body[start:])
    return parts
