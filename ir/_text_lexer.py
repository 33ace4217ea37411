"""Tokenizer of the IR text form: values, names, strings, numbers, punctuation, with positions."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Union

from passctl.ir.errors import ParseError

# Token kinds.
VALUE, NAME, STRING, INT, FLOAT = "value", "name", "string", "int", "float"
PUNCT, EOF = "punct", "eof"

_PUNCT2 = ("->", "::")
_PUNCT1 = "(){}[]<>,:=@?*"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_BARE_VALUE = re.compile(r"[A-Za-z0-9_./\-]+")
_NUMBER = re.compile(r"-?(?:[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?"
                     r"|[0-9]+[eE][+-]?[0-9]+|[0-9]+|inf\b)")
_PLAIN = re.compile(r'[^"\\\n]*')
_SIMPLE_ESCAPES = {"\\": 0x5C, '"': 0x22, "n": 0x0A, "t": 0x09, "r": 0x0D}


@dataclass
class Token:
    """One token: ``kind``, its ``value`` (str name, bytes for strings, int, float, punctuation
    text), and 1-based ``line`` / ``column`` of its first character."""

    kind: str
    value: Union[str, bytes, int, float, None]
    line: int
    column: int

    def describe(self) -> str:
        """The token as errors show it: ``value '%x'``, ``name 'Relu'``, ``end of input``."""
        if self.kind == EOF:
            return "end of input"
        if self.kind == VALUE:
            return f"value '%{self.value}'"
        if self.kind == STRING:
            return "string " + repr(self.value.decode("utf-8", "backslashreplace"))[:40]
        if self.kind == PUNCT:
            return f"'{self.value}'"
        return f"{self.kind} '{self.value}'"


def tokenize(text: str, filename: str = "<string>") -> List[Token]:
    """Split IR text into tokens; ``#`` starts a comment that runs to the end of the line.

    Raises:
        ParseError: an unterminated string, a bad escape, or a character that starts no token.
    """
    toks: List[Token] = []
    i, line, line_start, n = 0, 1, 0, len(text)
    while i < n:
        c = text[i]
        col = i - line_start + 1
        if c == "\n":
            line += 1
            line_start = i + 1
            i += 1
        elif c in " \t\r":
            i += 1
        elif c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif c == '"':
            value, i = _string(text, i, filename, line, col)
            toks.append(Token(STRING, value, line, col))
        elif c == "%":
            if i + 1 < n and text[i + 1] == '"':
                value, i = _string(text, i + 1, filename, line, col + 1)
                toks.append(Token(VALUE, value.decode("utf-8", "surrogateescape"), line, col))
            else:
                m = _BARE_VALUE.match(text, i + 1)
                if not m:
                    raise ParseError("expected a value name after '%'", filename, line, col)
                toks.append(Token(VALUE, m.group(), line, col))
                i = m.end()
        elif c.isdigit() or (c in "-." and i + 1 < n and (text[i + 1].isdigit() or
                                                          text.startswith("inf", i + 1))):
            m = _NUMBER.match(text, i)
            if not m:
                raise ParseError(f"malformed number starting with '{c}'", filename, line, col)
            s = m.group()
            if s.lstrip("-").isdigit():
                toks.append(Token(INT, int(s), line, col))
            else:
                toks.append(Token(FLOAT, float(s), line, col))
            i = m.end()
        elif c.isalpha() or c == "_":
            m = _NAME.match(text, i)
            toks.append(Token(NAME, m.group(), line, col))
            i = m.end()
        elif text.startswith(_PUNCT2, i):
            toks.append(Token(PUNCT, text[i:i + 2], line, col))
            i += 2
        elif c in _PUNCT1:
            toks.append(Token(PUNCT, c, line, col))
            i += 1
        else:
            raise ParseError(f"unexpected character {c!r}", filename, line, col)
    toks.append(Token(EOF, None, line, i - line_start + 1))
    return toks


def _string(text: str, i: int, filename: str, line: int, col: int):
    """Read the string literal starting at ``text[i] == '"'``; returns (bytes, index after it)."""
    out = bytearray()
    j = i + 1
    n = len(text)
    while True:
        m = _PLAIN.match(text, j)  # fast path: a run without escapes or the closing quote
        if m.end() > j:
            out += m.group().encode("utf-8", "surrogatepass")
            j = m.end()
        if j >= n or text[j] == "\n":
            raise ParseError("unterminated string (a string must end with '\"' on its line)",
                             filename, line, col)
        ch = text[j]
        if ch == '"':
            return bytes(out), j + 1
        if ch == "\\":
            nxt = text[j + 1] if j + 1 < n else ""
            if nxt in _SIMPLE_ESCAPES:
                out.append(_SIMPLE_ESCAPES[nxt])
                j += 2
            elif nxt == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", text[j + 2:j + 4]):
                out.append(int(text[j + 2:j + 4], 16))
                j += 4
            else:
                raise ParseError(f"bad escape '\\{nxt}' in string (use \\\\, \\\", \\n, \\t, \\r "
                                 "or \\xNN)", filename, line, col + (j - i))
        else:
            out += ch.encode("utf-8", "surrogatepass")
            j += 1
