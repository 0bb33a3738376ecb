"""Tokens and a cursor over them, for the small expression languages the emulators
parse (Pub/Sub's subscription filters, Service Bus's SQL filters and actions)."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Cursor", "Token", "tokenize"]


@dataclass(frozen=True)
class Token:
    kind: str  # a group name of the language's pattern, or "end"
    text: str
    at: int


def tokenize(pattern: re.Pattern[str], text: str) -> list[Token]:
    """``text`` as the tokens of ``pattern`` (one named group per kind, leading spaces
    skipped), ended by an ``end`` token; ``ValueError`` names the first character that
    starts no token (each language raises it as its own error)."""
    out: list[Token] = []
    pos = 0
    while pos < len(text) and text[pos:].strip():
        match = pattern.match(text, pos)
        if match is None or match.end() == pos:
            raise ValueError(f"unexpected character at offset {pos}: {text[pos:]!r}")
        kind = match.lastgroup or "op"
        out.append(Token(kind, match.group(kind), match.start(kind)))
        pos = match.end()
    out.append(Token("end", "", len(text)))
    return out


class Cursor:
    """A parser's position in its tokens."""

    def __init__(self, text: str, tokens: list[Token]) -> None:
        self.text = text
        self.toks = tokens
        self.i = 0

    def peek(self) -> Token:
        return self.toks[self.i]

    def take(self) -> Token:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def seen(self, end: str) -> str:
        """The current token as an error message shows it (``end`` at the end)."""
        tok = self.peek()
        return repr(tok.text) if tok.kind != "end" else end
