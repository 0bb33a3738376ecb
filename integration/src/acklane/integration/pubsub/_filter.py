"""Pub/Sub's subscription filter language, on message attributes.

The grammar the service accepts (``Subscription.filter``, at most 256 bytes)::

    expr    := term (("AND" term)* | ("OR" term)*)     # AND and OR need parentheses to mix
    term    := ("NOT" | "-") term | "(" expr ")" | atom
    atom    := "attributes:" KEY                        # the attribute is present
             | "attributes." KEY ("=" | "!=") STRING
             | "hasPrefix(" "attributes." KEY "," STRING ")"
    KEY     := an identifier, or a quoted string for keys such as "iana.org/language_tag"

Strings are quoted with ``"`` (or ``'``) and take backslash escapes. A message whose
attributes do not match is never delivered to the subscription: the service
acknowledges it on the subscriber's behalf. ``compile_filter`` raises
``FilterError`` (shown as ``INVALID_ARGUMENT``) for a filter the service refuses.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from acklane.core.errors import AcklaneError

from .._tokens import Cursor, Token, tokenize

__all__ = ["MAX_FILTER_BYTES", "FilterError", "Predicate", "compile_filter"]

MAX_FILTER_BYTES = 256

Predicate = Callable[[Mapping[str, str]], bool]

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    | (?P<op>!=|=|\(|\)|,|:|\.|-)
    | (?P<word>[A-Za-z_][A-Za-z0-9_-]*)
    )""",
    re.VERBOSE,
)


class FilterError(AcklaneError, ValueError):
    """A filter the service would refuse, with the reason."""


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), body)


def _tokens(text: str) -> list[Token]:
    try:
        return tokenize(_TOKEN, text)
    except ValueError as exc:
        raise FilterError(f"Invalid filter: {exc}") from None


class _Parser(Cursor):
    def __init__(self, text: str) -> None:
        super().__init__(text, _tokens(text))

    def fail(self, what: str) -> FilterError:
        seen = self.seen("the end of the filter")
        return FilterError(
            f"Invalid filter: expected {what} at offset {self.peek().at}, got {seen}"
        )

    def expect(self, kind: str, text: str | None = None) -> Token:
        tok = self.peek()
        if tok.kind != kind or (text is not None and tok.text != text):
            raise self.fail(repr(text) if text else kind)
        return self.take()

    def is_word(self, word: str) -> bool:
        tok = self.peek()
        return tok.kind == "word" and tok.text == word

    def parse(self) -> Predicate:
        pred = self.expr()
        if self.peek().kind != "end":
            raise self.fail("AND, OR or the end of the filter")
        return pred

    def expr(self) -> Predicate:
        first = self.term()
        if not (self.is_word("AND") or self.is_word("OR")):
            return first
        joiner = self.peek().text
        parts = [first]
        while self.is_word("AND") or self.is_word("OR"):
            if self.peek().text != joiner:
                raise FilterError(
                    "Invalid filter: AND and OR cannot be mixed without parentheses "
                    f"(offset {self.peek().at})"
                )
            self.take()
            parts.append(self.term())
        if joiner == "AND":
            return lambda attrs: all(p(attrs) for p in parts)
        return lambda attrs: any(p(attrs) for p in parts)

    def term(self) -> Predicate:
        tok = self.peek()
        if self.is_word("NOT") or (tok.kind == "op" and tok.text == "-"):
            self.take()
            inner = self.term()
            return lambda attrs: not inner(attrs)
        if tok.kind == "op" and tok.text == "(":
            self.take()
            inner = self.expr()
            self.expect("op", ")")
            return inner
        if self.is_word("hasPrefix"):
            self.take()
            self.expect("op", "(")
            key = self.attribute(".")
            self.expect("op", ",")
            prefix = _unquote(self.expect("string").text)
            self.expect("op", ")")
            return lambda attrs: key in attrs and attrs[key].startswith(prefix)
        if self.is_word("attributes"):
            self.take()
            sep = self.peek()
            if sep.kind != "op" or sep.text not in (":", "."):
                raise self.fail("':' or '.' after attributes")
            self.take()
            key = self.key()
            if sep.text == ":":
                return lambda attrs: key in attrs
            op = self.peek()
            if op.kind != "op" or op.text not in ("=", "!="):
                raise self.fail("'=' or '!='")
            self.take()
            value = _unquote(self.expect("string").text)
            if op.text == "=":
                return lambda attrs: attrs.get(key) == value
            return lambda attrs: key in attrs and attrs[key] != value
        raise self.fail("attributes, hasPrefix, NOT or '('")

    def attribute(self, sep: str) -> str:
        self.expect("word", "attributes")
        self.expect("op", sep)
        return self.key()

    def key(self) -> str:
        tok = self.peek()
        if tok.kind == "string":
            self.take()
            return _unquote(tok.text)
        if tok.kind == "word":
            self.take()
            return tok.text
        raise self.fail("an attribute key")


def compile_filter(text: str) -> Predicate | None:
    """The predicate of a filter; ``None`` for the empty filter (every message)."""
    if not text.strip():
        return None
    if len(text.encode()) > MAX_FILTER_BYTES:
        raise FilterError(
            f"Invalid filter: it is {len(text.encode())} bytes long; at most "
            f"{MAX_FILTER_BYTES} bytes are allowed."
        )
    return _Parser(text).parse()
