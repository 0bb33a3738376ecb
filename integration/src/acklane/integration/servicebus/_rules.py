"""Subscription rules: SQL and correlation filters, and SQL actions, as Service Bus runs them.

A subscription holds named rules (``$Default``, a true filter, unless others are
declared). A message sent to the topic is stored in the subscription when one of its
rules' filters matches; each matching rule with an action gets its own copy, the
action applied to it, and the matching rules without an action share one unmodified
copy.

The SQL filter language (a SQL-92 subset)::

    predicate := predicate AND predicate | predicate OR predicate | NOT predicate
               | ( predicate ) | expr op expr | expr [NOT] IN (expr, ...)
               | expr [NOT] LIKE 'pattern' [ESCAPE 'c'] | property IS [NOT] NULL
               | EXISTS ( property ) | TRUE | FALSE
    op         := = | <> | != | > | >= | < | <=
    expr       := constant | property | expr (+ - * / %) expr | - expr | ( expr )
    property   := [sys. | user.] name | [bracketed name]

System properties (``sys.``) are the message's own: ``MessageId``, ``CorrelationId``,
``To``, ``ReplyTo``, ``Label`` (or ``Subject``), ``SessionId``, ``ReplyToSessionId``,
``ContentType``; names without a prefix are application properties. Keywords and
system names are case-insensitive. A comparison with a missing property, or of
values of types that do not compare, is false (``IS NULL`` tests for missing).

An action is ``SET property = expr`` and ``REMOVE property`` statements, separated
by ``;``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from acklane.core.errors import AcklaneError

from .._tokens import Cursor, Token, tokenize

__all__ = [
    "DEFAULT_RULE",
    "Rule",
    "RuleError",
    "compile_action",
    "compile_sql_filter",
    "correlation_filter",
    "route",
]

DEFAULT_RULE = "$Default"

Filter = Callable[[Any], bool]
Action = Callable[[Any], None]

_SYSTEM = {
    "messageid": "id",
    "correlationid": "correlation_id",
    "to": "address",
    "replyto": "reply_to",
    "label": "subject",
    "subject": "subject",
    "sessionid": "group_id",
    "replytosessionid": "reply_to_group_id",
    "contenttype": "content_type",
}

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<string>'(?:[^']|'')*')
    | (?P<number>\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+(?:[eE][+-]?\d+)?)
    | (?P<bracket>\[[^\]]+\])
    | (?P<op><>|!=|>=|<=|=|<|>|\(|\)|,|\+|-|\*|/|%|;|\.)
    | (?P<word>[A-Za-z_@$][A-Za-z0-9_@$]*)
    )""",
    re.VERBOSE,
)


class RuleError(AcklaneError, ValueError):
    """A filter or action the service would refuse, with the reason."""


class _Missing:
    def __repr__(self) -> str:
        return "NULL"


MISSING: Any = _Missing()


def _tokens(text: str) -> list[Token]:
    try:
        return tokenize(_TOKEN, text)
    except ValueError as exc:
        raise RuleError(str(exc)) from None


# ---------------------------------------------------------------- properties


@dataclass(frozen=True)
class _Prop:
    system: bool
    name: str

    def get(self, message: Any) -> Any:
        if self.system:
            attr = _SYSTEM.get(self.name.lower())
            if attr is None:
                return MISSING
            value = _plain(getattr(message, attr, None))
            return MISSING if value is None else value
        props: Mapping[Any, Any] = message.properties or {}
        if self.name in props:
            return _plain(props[self.name])
        lowered = self.name.lower()
        for key, value in props.items():
            if str(key).lower() == lowered:
                return _plain(value)
        return MISSING

    def set(self, message: Any, value: Any) -> None:
        if self.system:
            attr = _SYSTEM.get(self.name.lower())
            if attr is None or attr in ("id",):
                raise RuleError(f"sys.{self.name} cannot be set by an action")
            setattr(message, attr, None if value is MISSING else value)
            return
        props = dict(message.properties or {})
        if value is MISSING:
            props.pop(self.name, None)
        else:
            props[self.name] = value
        message.properties = props

    def remove(self, message: Any) -> None:
        if self.system:
            self.set(message, MISSING)
            return
        props = dict(message.properties or {})
        props.pop(self.name, None)
        message.properties = props


def _plain(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    return value


# ---------------------------------------------------------------- parser


class _Parser(Cursor):
    def __init__(self, text: str) -> None:
        super().__init__(text, _tokens(text))

    # helpers
    def fail(self, what: str) -> RuleError:
        at = self.peek().at
        seen = self.seen("the end")
        return RuleError(f"expected {what} at offset {at} of {self.text!r}, got {seen}")

    def kw(self, *words: str) -> bool:
        tok = self.peek()
        return tok.kind == "word" and tok.text.upper() in words

    def op(self, *ops: str) -> bool:
        tok = self.peek()
        return tok.kind == "op" and tok.text in ops

    def expect_op(self, op: str) -> None:
        if not self.op(op):
            raise self.fail(repr(op))
        self.take()

    def expect_kw(self, word: str) -> None:
        if not self.kw(word):
            raise self.fail(word)
        self.take()

    def done(self) -> None:
        if self.peek().kind != "end":
            raise self.fail("the end of the expression")

    # predicates
    def predicate(self) -> Filter:
        left = self.conjunction()
        while self.kw("OR"):
            self.take()
            right = self.conjunction()
            left = _or(left, right)
        return left

    def conjunction(self) -> Filter:
        left = self.negation()
        while self.kw("AND"):
            self.take()
            right = self.negation()
            left = _and(left, right)
        return left

    def negation(self) -> Filter:
        if self.kw("NOT"):
            self.take()
            inner = self.negation()
            return lambda m: not inner(m)
        return self.condition()

    def condition(self) -> Filter:
        if self.kw("EXISTS"):
            self.take()
            self.expect_op("(")
            prop = self.prop()
            self.expect_op(")")
            return lambda m: prop.get(m) is not MISSING
        if self.kw("TRUE") and self._standalone():
            self.take()
            return lambda m: True
        if self.kw("FALSE") and self._standalone():
            self.take()
            return lambda m: False
        if self.op("("):
            # a parenthesised predicate, or an expression starting with "("
            mark = self.i
            self.take()
            try:
                inner = self.predicate()
                self.expect_op(")")
            except RuleError:
                self.i = mark
            else:
                if not self._comparison_follows():
                    return inner
                self.i = mark
        left = self.expr()
        negate = False
        if self.kw("IS"):
            self.take()
            if self.kw("NOT"):
                self.take()
                negate = True
            self.expect_kw("NULL")
            return (lambda m: left(m) is not MISSING) if negate else (lambda m: left(m) is MISSING)
        if self.kw("NOT"):
            self.take()
            negate = True
        if self.kw("IN"):
            self.take()
            self.expect_op("(")
            items = [self.expr()]
            while self.op(","):
                self.take()
                items.append(self.expr())
            self.expect_op(")")

            def within(m: Any) -> bool:
                value = left(m)
                return value is not MISSING and any(_equal(value, item(m)) for item in items)

            return (lambda m: _known_not(left, within, m)) if negate else within
        if self.kw("LIKE"):
            self.take()
            pattern = self.take()
            if pattern.kind != "string":
                raise self.fail("a string pattern after LIKE")
            escape = None
            if self.kw("ESCAPE"):
                self.take()
                tok = self.take()
                if tok.kind != "string" or len(_string(tok.text)) != 1:
                    raise self.fail("one escape character")
                escape = _string(tok.text)
            regex = _like(_string(pattern.text), escape)

            def like(m: Any) -> bool:
                value = left(m)
                return isinstance(value, str) and regex.fullmatch(value) is not None

            return (lambda m: _known_not(left, like, m)) if negate else like
        if negate:
            raise self.fail("IN or LIKE after NOT")
        tok = self.peek()
        if tok.kind != "op" or tok.text not in ("=", "<>", "!=", ">", ">=", "<", "<="):
            raise self.fail("a comparison")
        self.take()
        right = self.expr()
        return _compare(tok.text, left, right)

    def _standalone(self) -> bool:
        nxt = self.toks[self.i + 1]
        return nxt.kind == "end" or (nxt.kind == "word" and nxt.text.upper() in ("AND", "OR"))

    def _comparison_follows(self) -> bool:
        tok = self.peek()
        if tok.kind == "op":
            return tok.text in ("=", "<>", "!=", ">", ">=", "<", "<=", "+", "-", "*", "/", "%")
        return tok.kind == "word" and tok.text.upper() in ("IN", "LIKE", "IS", "NOT")

    # expressions
    def expr(self) -> Callable[[Any], Any]:
        left = self.term()
        while self.op("+", "-"):
            op = self.take().text
            right = self.term()
            left = _arith(op, left, right)
        return left

    def term(self) -> Callable[[Any], Any]:
        left = self.unary()
        while self.op("*", "/", "%"):
            op = self.take().text
            right = self.unary()
            left = _arith(op, left, right)
        return left

    def unary(self) -> Callable[[Any], Any]:
        if self.op("-"):
            self.take()
            inner = self.unary()
            return lambda m: _negate(inner(m))
        if self.op("+"):
            self.take()
            return self.unary()
        return self.primary()

    def primary(self) -> Callable[[Any], Any]:
        tok = self.peek()
        if tok.kind == "string":
            self.take()
            value: Any = _string(tok.text)
            return lambda m: value
        if tok.kind == "number":
            self.take()
            number = _number(tok.text)
            return lambda m: number
        if self.op("("):
            self.take()
            inner = self.expr()
            self.expect_op(")")
            return inner
        if self.kw("TRUE", "FALSE"):
            self.take()
            flag = tok.text.upper() == "TRUE"
            return lambda m: flag
        if self.kw("NULL"):
            self.take()
            return lambda m: MISSING
        if self.kw("NEWID"):
            self.take()
            self.expect_op("(")
            self.expect_op(")")
            import uuid

            return lambda m: str(uuid.uuid4())
        prop = self.prop()
        return prop.get

    def prop(self) -> _Prop:
        tok = self.take()
        if tok.kind == "bracket":
            return _Prop(False, tok.text[1:-1])
        if tok.kind != "word":
            self.i -= 1
            raise self.fail("a property name")
        if tok.text.lower() in ("sys", "user") and self.op("."):
            self.take()
            name = self.take()
            if name.kind not in ("word", "bracket"):
                self.i -= 1
                raise self.fail("a property name")
            text = name.text[1:-1] if name.kind == "bracket" else name.text
            if tok.text.lower() == "sys":
                if text.lower() not in _SYSTEM:
                    raise RuleError(f"unknown system property sys.{text}")
                return _Prop(True, text)
            return _Prop(False, text)
        if tok.text.upper() in _KEYWORDS:
            self.i -= 1
            raise self.fail("a property name")
        return _Prop(False, tok.text)

    # actions
    def action(self) -> Action:
        steps: list[Action] = []
        while self.peek().kind != "end":
            if self.op(";"):
                self.take()
                continue
            if self.kw("SET"):
                self.take()
                prop = self.prop()
                self.expect_op("=")
                value = self.expr()
                steps.append(_setter(prop, value))
            elif self.kw("REMOVE"):
                self.take()
                prop = self.prop()
                steps.append(prop.remove)
            else:
                raise self.fail("SET or REMOVE")

        def run(message: Any) -> None:
            for step in steps:
                step(message)

        if not steps:
            raise RuleError("an action needs at least one SET or REMOVE")
        return run


_KEYWORDS = {
    "AND",
    "OR",
    "NOT",
    "IN",
    "LIKE",
    "ESCAPE",
    "IS",
    "NULL",
    "EXISTS",
    "TRUE",
    "FALSE",
    "SET",
    "REMOVE",
}


def _setter(prop: _Prop, value: Callable[[Any], Any]) -> Action:
    return lambda m: prop.set(m, value(m))


def _and(a: Filter, b: Filter) -> Filter:
    return lambda m: a(m) and b(m)


def _or(a: Filter, b: Filter) -> Filter:
    return lambda m: a(m) or b(m)


def _known_not(left: Callable[[Any], Any], test: Filter, m: Any) -> bool:
    return left(m) is not MISSING and not test(m)


def _string(text: str) -> str:
    return text[1:-1].replace("''", "'")


def _number(text: str) -> int | float:
    if re.fullmatch(r"\d+", text):
        return int(text)
    return float(text)


def _like(pattern: str, escape: str | None) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if escape is not None and ch == escape and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _equal(a: Any, b: Any) -> bool:
    if a is MISSING or b is MISSING:
        return False
    if _numeric(a) and _numeric(b):
        return bool(a == b)
    if type(a) is not type(b) and not (isinstance(a, str) and isinstance(b, str)):
        return False
    return bool(a == b)


def _compare(op: str, left: Callable[[Any], Any], right: Callable[[Any], Any]) -> Filter:
    def test(m: Any) -> bool:
        a, b = left(m), right(m)
        if a is MISSING or b is MISSING:
            return False
        if op == "=":
            return _equal(a, b)
        if op in ("<>", "!="):
            comparable = (_numeric(a) and _numeric(b)) or type(a) is type(b)
            return comparable and not _equal(a, b)
        if not ((_numeric(a) and _numeric(b)) or (isinstance(a, str) and isinstance(b, str))):
            return False
        if op == ">":
            return bool(a > b)
        if op == ">=":
            return bool(a >= b)
        if op == "<":
            return bool(a < b)
        return bool(a <= b)

    return test


def _negate(value: Any) -> Any:
    return -value if _numeric(value) else MISSING


def _arith(
    op: str, left: Callable[[Any], Any], right: Callable[[Any], Any]
) -> Callable[[Any], Any]:
    def value(m: Any) -> Any:
        a, b = left(m), right(m)
        if op == "+" and isinstance(a, str) and isinstance(b, str):
            return a + b
        if not (_numeric(a) and _numeric(b)):
            return MISSING
        try:
            if op == "+":
                return a + b
            if op == "-":
                return a - b
            if op == "*":
                return a * b
            if op == "/":
                return a // b if isinstance(a, int) and isinstance(b, int) else a / b
            return a % b
        except ZeroDivisionError:
            return MISSING

    return value


def compile_sql_filter(expression: str) -> Filter:
    if not expression.strip():
        raise RuleError("a SQL filter needs an expression")
    parser = _Parser(expression)
    predicate = parser.predicate()
    parser.done()
    return predicate


def compile_action(expression: str) -> Action:
    return _Parser(expression).action()


_CORRELATION = {
    "correlationid": "correlation_id",
    "messageid": "id",
    "to": "address",
    "replyto": "reply_to",
    "label": "subject",
    "subject": "subject",
    "sessionid": "group_id",
    "replytosessionid": "reply_to_group_id",
    "contenttype": "content_type",
}


def correlation_filter(spec: Mapping[str, Any]) -> Filter:
    """A correlation filter: every given system and application property must be equal."""
    system: list[tuple[str, Any]] = []
    user: dict[str, Any] = {}
    for key, value in spec.items():
        lowered = key.replace("_", "").replace("-", "").lower()
        if lowered in ("properties", "applicationproperties"):
            user.update(value or {})
        elif lowered in _CORRELATION:
            if value is not None:
                system.append((_CORRELATION[lowered], value))
        else:
            raise RuleError(f"unknown correlation filter property {key!r}")
    if not system and not user:
        raise RuleError("a correlation filter needs at least one property")

    def matches(message: Any) -> bool:
        for attr, wanted in system:
            value = _plain(getattr(message, attr, None))
            if value is None or str(value) != str(wanted):
                return False
        props = message.properties or {}
        for key, wanted in user.items():
            if key not in props or not _equal(_plain(props[key]), wanted):
                return False
        return True

    return matches


@dataclass(frozen=True)
class Rule:
    """One named rule: its filter, its action if any, and how it was declared."""

    name: str
    matches: Filter
    action: Action | None = None
    description: Mapping[str, Any] | None = None

    @classmethod
    def true(cls, name: str = DEFAULT_RULE) -> Rule:
        return cls(name, lambda m: True, None, {"filter": {"type": "true"}})

    @classmethod
    def from_json(cls, spec: Mapping[str, Any]) -> Rule:
        """A rule of Microsoft's emulator's ``Config.json`` (``Name`` and ``Properties``
        with ``FilterType``, ``SqlFilter`` / ``CorrelationFilter`` and ``Action``), or
        the snake_case shape of the admin endpoint (``sql`` / ``correlation``, ``action``)."""
        name = str(spec.get("Name") or spec.get("name") or "")
        if not name:
            raise RuleError("a rule needs a name")
        props = spec.get("Properties") or spec
        kind = str(props.get("FilterType") or props.get("filter_type") or "").lower()
        sql = props.get("SqlFilter") or (
            {"SqlExpression": props["sql"]} if "sql" in props else None
        )
        correlation = props.get("CorrelationFilter") or props.get("correlation")
        if not kind:
            kind = "sql" if sql else "correlation" if correlation else "true"
        if kind == "sql":
            expression = str((sql or {}).get("SqlExpression") or "")
            matches = compile_sql_filter(expression)
            description: dict[str, Any] = {"filter": {"type": "sql", "expression": expression}}
        elif kind == "correlation":
            matches = correlation_filter(correlation or {})
            description = {"filter": {"type": "correlation", **(correlation or {})}}
        elif kind in ("true", "truefilter"):
            matches, description = (lambda m: True), {"filter": {"type": "true"}}
        elif kind in ("false", "falsefilter"):
            matches, description = (lambda m: False), {"filter": {"type": "false"}}
        else:
            raise RuleError(f"unknown FilterType {kind!r} (Sql, Correlation, True, False)")
        raw_action = props.get("Action") or props.get("action")
        action_text = (
            str(raw_action.get("SqlExpression") or "")
            if isinstance(raw_action, Mapping)
            else str(raw_action or "")
        )
        action = compile_action(action_text) if action_text.strip() else None
        if action is not None:
            description["action"] = action_text
        return cls(name, matches, action, description)


def route(rules: Mapping[str, Rule], message: Any, copy: Callable[[Any], Any]) -> list[Any]:
    """The copies of ``message`` a subscription with ``rules`` stores (none: no match)."""
    out: list[Any] = []
    plain = False
    for rule in rules.values():
        if not rule.matches(message):
            continue
        if rule.action is None:
            plain = True
            continue
        changed = copy(message)
        rule.action(changed)
        out.append(changed)
    if plain:
        out.insert(0, copy(message))
    return out
