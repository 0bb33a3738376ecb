"""Test cases of a pipeline (``acklane test``): the files, their cases, and how a result is judged.

A pipeline's cases live beside it: for ``orders.yaml``, the file
``orders.tests.yaml`` and every ``*.yaml`` of the directory ``orders.tests/``
(found automatically; other files may be named on the command line). A file is::

    stream: orders                  # the cases' stream (optional with one stream)
    cases:
      - name: a big order fires
        message:
          body: {type: order.created, id: 1, amount: 150}   # JSON (or text:, base64:)
          key: c-1
          attributes: {source: web}                         # headers, attributes
        expect:
          big-orders: {fire: [{order_id: 1, amount: 150}]}  # exactly these payloads
          online-orders: {fire: [{body: {id: 1}}], compare: subset}
          order-audit: nothing
        dead_letter: nothing
      - name: a negative amount is dead-lettered
        message: {body: {type: order.created, id: 4, amount: -5}}
        expect:
          big-orders: {reject: "body.amount lt 0"}          # a regular expression
        dead_letter: {reason: "reject rule matched"}

Watchers a case does not name are not checked; ``dead_letter`` unset is not
checked either. Problems of a file are reported as the configuration's are:
``file:line: cases[0].expect.big-orders.fire: ...``, all at once.
:mod:`acklane.core.harness.run` runs the cases.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ..config import ConfigError, ConfigProblem, Loc
from ..config._yaml import _Reader
from ..observe.redact import remember

if TYPE_CHECKING:
    from ..config import AcklaneConfig

__all__ = [
    "Actual",
    "Case",
    "CaseResult",
    "DeadLetter",
    "Expectation",
    "TestMessage",
    "case_files",
    "judge",
    "load_cases",
]

#: What a watcher may be expected to do with a case's message.
_EXPECT_KEYS: Final = ("fire", "compare", "reject")
_MESSAGE_KEYS: Final = (
    "body",
    "text",
    "base64",
    "key",
    "attributes",
    "headers",
    "stream",
    "source",
)
_CASE_KEYS: Final = ("name", "stream", "message", "expect", "dead_letter")


@dataclass(frozen=True, slots=True)
class TestMessage:
    """The message a case sends: the raw body bytes and what comes with them."""

    __test__ = False  # not a pytest class

    stream: str
    body: bytes
    key: str | None = None
    attributes: Mapping[str, str] = field(default_factory=dict)
    source: str | None = None


@dataclass(frozen=True, slots=True)
class Expectation:
    """What one watcher must do: ``nothing``, ``fire`` payloads, or ``reject``."""

    kind: str  # "nothing" | "fire" | "reject"
    payloads: tuple[Any, ...] = ()
    subset: bool = False
    pattern: str | None = None

    def document(self) -> Any:
        if self.kind == "nothing":
            return "nothing"
        if self.kind == "reject":
            return {"reject": self.pattern}
        doc: dict[str, Any] = {"fire": list(self.payloads)}
        if self.subset:
            doc["compare"] = "subset"
        return doc


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """What the dead-letter destination must get: ``nothing``, ``dropped``, or a copy
    whose reason matches ``pattern``."""

    kind: str  # "nothing" | "dropped" | "reason"
    pattern: str | None = None

    def document(self) -> Any:
        return {"reason": self.pattern} if self.kind == "reason" else self.kind


@dataclass(frozen=True, slots=True)
class Case:
    """One test case: a message and what the watchers and the dead-letter destination do."""

    name: str
    file: str
    line: int | None
    message: TestMessage
    expect: Mapping[str, Expectation]
    dead_letter: DeadLetter | None = None

    @property
    def id(self) -> str:
        """``file::name``, as pytest names a test."""
        return f"{self.file}::{self.name}"


@dataclass(slots=True)
class Actual:
    """What one watcher did with the message: the payloads it fired, its rejection."""

    fired: list[Any] = field(default_factory=list)
    rejected: str | None = None

    def document(self) -> Any:
        if self.rejected is not None:
            doc: dict[str, Any] = {"reject": self.rejected}
            if self.fired:
                doc["fire"] = self.fired
            return doc
        if self.fired:
            return {"fire": self.fired}
        return "nothing"


@dataclass(slots=True)
class CaseResult:
    """A case's outcome: passed, or the reasons and a diff of expected and actual."""

    case: Case
    watchers: dict[str, Actual]
    #: ``nothing``, ``dropped``, or the reason of the dead-letter copy.
    dead_letter: str
    #: Why it failed (one line each); empty when it passed.
    failures: list[str] = field(default_factory=list)
    diff: str = ""
    #: An error that kept the case from running to the end (a timeout, a broken run).
    error: str | None = None
    seconds: float = 0.0
    #: Log lines (WARNING and above) of the pipeline while the case ran.
    logs: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures and self.error is None


# -- finding and reading the files -----------------------------------------------------


def case_files(config_path: str | os.PathLike[str]) -> list[Path]:
    """The case files of a pipeline: ``<stem>.tests.yaml`` (or ``.yml``) beside it, and
    every ``*.yaml``/``*.yml`` of the directory ``<stem>.tests/``, sorted."""
    path = Path(config_path)
    stem = path.name.rsplit(".", 1)[0] if path.suffix in (".yaml", ".yml") else path.name
    found = [path.with_name(f"{stem}.tests{ext}") for ext in (".yaml", ".yml")]
    files = [p for p in found if p.is_file()]
    folder = path.with_name(f"{stem}.tests")
    if folder.is_dir():
        inside = [p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file()]
        files += sorted(inside)
    return files


def load_cases(
    files: Sequence[str | os.PathLike[str]],
    config: AcklaneConfig,
    *,
    env: Mapping[str, str] | None = None,
) -> list[Case]:
    """Every case of ``files``, checked against ``config``; raises :class:`ConfigError`
    with every problem of every file (file, line and field)."""
    cases: list[Case] = []
    problems: list[ConfigProblem] = []
    for file in files:
        source = os.fspath(file)
        try:
            text = Path(source).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            problems.append(ConfigProblem(source, None, "", f"cannot read the cases: {reason}"))
            continue
        reader = _Reader(text, source, os.environ if env is None else env)
        data = reader.read()
        remember(reader.secrets)  # ${SECRET_NAME} in a case: masked in all output too
        if not reader.problems:
            cases += _cases(reader, data, config)
        problems += reader.problems
    if problems:
        raise ConfigError(problems)
    return cases


def _got(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "a mapping" if isinstance(value, dict) else type(value).__name__


def _unknown_keys(reader: _Reader, data: Mapping[Any, Any], known: Sequence[str], loc: Loc) -> None:
    for key in data:
        if key not in known:
            hint = difflib.get_close_matches(str(key), known, n=1)
            also = f"did you mean {hint[0]!r}? " if hint else ""
            reader.problem((*loc, key), f"unknown field; {also}expected one of: {', '.join(known)}")


def _cases(reader: _Reader, data: Any, config: AcklaneConfig) -> list[Case]:
    if data is None:
        reader.problem((), "the file is empty; expected a mapping with cases")
        return []
    if not isinstance(data, dict):
        reader.problem((), f"expected a mapping with cases (and stream), got {_got(data)}")
        return []
    _unknown_keys(reader, data, ("stream", "cases"), ())
    default_stream = data.get("stream")
    if default_stream is not None and not _known_stream(
        reader, default_stream, config, ("stream",)
    ):
        default_stream = None
    raw = data.get("cases")
    if not isinstance(raw, list) or not raw:
        reader.problem(("cases",), f"expected a list of test cases, got {_got(raw)}")
        return []
    cases: list[Case] = []
    names: dict[str, int | None] = {}
    for index, item in enumerate(raw):
        loc: Loc = ("cases", index)
        if not isinstance(item, dict):
            reader.problem(loc, f"expected a mapping (name, message, expect), got {_got(item)}")
            continue
        before = len(reader.problems)
        _unknown_keys(reader, item, _CASE_KEYS, loc)
        name = item.get("name")
        if not isinstance(name, str) or not name.strip():
            reader.problem((*loc, "name"), "expected the case's name (a non-empty string)")
            name = f"case {index}"
        elif name in names:
            reader.problem(
                (*loc, "name"), f"duplicate case name {name!r} (first at line {names[name]})"
            )
        else:
            names[name] = reader.line_of((*loc, "name"))
        stream = _case_stream(reader, item, default_stream, config, loc)
        message = _message(reader, item.get("message"), stream, config, (*loc, "message"))
        expect = _expect(reader, item.get("expect"), stream, config, (*loc, "expect"))
        dead_letter = _dead_letter(reader, item.get("dead_letter"), (*loc, "dead_letter"))
        if "expect" not in item and "dead_letter" not in item:
            reader.problem(loc, "the case checks nothing: give expect, dead_letter, or both")
        if len(reader.problems) == before and message is not None:
            cases.append(
                Case(name, reader.source, reader.line_of(loc), message, expect, dead_letter)
            )
    return cases


def _known_stream(reader: _Reader, stream: Any, config: AcklaneConfig, loc: Loc) -> bool:
    if isinstance(stream, str) and stream in config.streams:
        return True
    known = list(config.streams)
    hint = difflib.get_close_matches(str(stream), known, n=1)
    also = f"did you mean {hint[0]!r}? " if hint else ""
    reader.problem(loc, f"unknown stream {stream!r}; {also}the pipeline's: {', '.join(known)}")
    return False


def _case_stream(
    reader: _Reader, item: Mapping[str, Any], default: Any, config: AcklaneConfig, loc: Loc
) -> str | None:
    message = item.get("message")
    for where, value in (
        ((*loc, "message", "stream"), message.get("stream") if isinstance(message, dict) else None),
        ((*loc, "stream"), item.get("stream")),
    ):
        if value is not None:
            return value if _known_stream(reader, value, config, where) else None
    if default is not None:
        return str(default)
    if len(config.streams) == 1:
        return next(iter(config.streams))
    reader.problem(
        (*loc, "stream"),
        f"the pipeline has several streams ({', '.join(config.streams)}): name the case's "
        "stream (here, in message, or once at the top of the file)",
    )
    return None


def _message(
    reader: _Reader, raw: Any, stream: str | None, config: AcklaneConfig, loc: Loc
) -> TestMessage | None:
    if not isinstance(raw, dict):
        reader.problem(
            loc,
            "required field is missing"
            if raw is None
            else f"expected a mapping (body, key, attributes), got {_got(raw)}",
        )
        return None
    _unknown_keys(reader, raw, _MESSAGE_KEYS, loc)
    given = [k for k in ("body", "text", "base64") if k in raw]
    body = b""
    if len(given) > 1:
        both = " and ".join(given)
        reader.problem((*loc, given[1]), f"give one of body, text or base64, not {both}")
    elif not given:
        reader.problem(loc, "expected a body: body (any value, sent as JSON), text or base64")
    elif given[0] == "body":
        body = json.dumps(raw["body"], ensure_ascii=False).encode("utf-8")
    elif given[0] == "text":
        if not isinstance(raw["text"], str):
            got = _got(raw["text"])
            reader.problem((*loc, "text"), f"expected a string (sent as written), got {got}")
        else:
            body = raw["text"].encode("utf-8")
    else:
        try:
            body = base64.b64decode(str(raw["base64"]), validate=True)
        except (binascii.Error, ValueError) as exc:
            reader.problem((*loc, "base64"), f"not base64: {exc}")
    key = raw.get("key")
    if key is not None and not isinstance(key, str | int):
        reader.problem((*loc, "key"), f"expected a string, got {_got(key)}")
    if "attributes" in raw and "headers" in raw:
        reader.problem((*loc, "headers"), "headers is another name of attributes: give one")
    name = "headers" if "headers" in raw else "attributes"
    attributes = _attributes(reader, raw.get(name), (*loc, name))
    source = raw.get("source")
    if source is not None and not (isinstance(source, str) and source):
        reader.problem((*loc, "source"), f"expected a topic or queue name, got {_got(source)}")
    if stream is None:
        return None
    return TestMessage(
        stream, body, None if key is None else str(key), attributes, source if source else None
    )


def _attributes(reader: _Reader, raw: Any, loc: Loc) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        reader.problem(loc, f"expected a mapping of name: value, got {_got(raw)}")
        return {}
    out: dict[str, str] = {}
    for name, value in raw.items():
        if isinstance(value, bool):
            out[str(name)] = "true" if value else "false"
        elif isinstance(value, str | int | float):
            out[str(name)] = str(value)
        else:
            got = _got(value)
            reader.problem((*loc, name), f"expected a string (attributes are text), got {got}")
    return out


def _pattern(reader: _Reader, raw: Any, loc: Loc) -> str | None:
    if not isinstance(raw, str):
        reader.problem(loc, f"expected a regular expression (a string), got {_got(raw)}")
        return None
    try:
        re.compile(raw)
    except re.error as exc:
        reader.problem(loc, f"invalid regular expression {raw!r}: {exc}")
        return None
    return raw


def _expect(
    reader: _Reader, raw: Any, stream: str | None, config: AcklaneConfig, loc: Loc
) -> dict[str, Expectation]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        reader.problem(loc, f"expected a mapping of watcher: what it does, got {_got(raw)}")
        return {}
    on_stream = [w.name for w in config.watchers if w.stream == stream]
    out: dict[str, Expectation] = {}
    for watcher, spec in raw.items():
        where: Loc = (*loc, watcher)
        if stream is not None and watcher not in on_stream:
            others = [w.name for w in config.watchers]
            why = (
                f"watcher {watcher!r} reads stream "
                f"{config.watcher(watcher).stream!r}, not {stream!r}"
                if watcher in others
                else f"no watcher {watcher!r}"
            )
            hint = difflib.get_close_matches(str(watcher), on_stream, n=1)
            also = f"; did you mean {hint[0]!r}?" if hint else ""
            reader.problem(where, f"{why}{also} (watchers of {stream}: {', '.join(on_stream)})")
            continue
        expectation = _expectation(reader, spec, where)
        if expectation is not None:
            out[str(watcher)] = expectation
    return out


def _expectation(reader: _Reader, spec: Any, loc: Loc) -> Expectation | None:
    if spec == "nothing":
        return Expectation("nothing")
    if not isinstance(spec, dict):
        reader.problem(
            loc, f"expected nothing, {{fire: [payloads]}} or {{reject: pattern}}, got {_got(spec)}"
        )
        return None
    _unknown_keys(reader, spec, _EXPECT_KEYS, loc)
    if "fire" in spec and "reject" in spec:
        reader.problem((*loc, "reject"), "expect fire or reject, not both")
        return None
    if "reject" in spec:
        if "compare" in spec:
            reader.problem((*loc, "compare"), "applies to fire only")
        pattern = _pattern(reader, spec["reject"], (*loc, "reject"))
        return None if pattern is None else Expectation("reject", pattern=pattern)
    if "fire" not in spec:
        reader.problem(loc, "expected fire: [payloads] or reject: pattern (or the word nothing)")
        return None
    payloads = spec["fire"]
    if not isinstance(payloads, list):
        reader.problem(
            (*loc, "fire"),
            f"expected a list of payloads, one per event (write [x] for one), got {_got(payloads)}",
        )
        return None
    compare = spec.get("compare", "exact")
    if compare not in ("exact", "subset"):
        reader.problem((*loc, "compare"), f"expected exact or subset, got {compare!r}")
        return None
    return Expectation("fire", tuple(payloads), subset=compare == "subset")


def _dead_letter(reader: _Reader, raw: Any, loc: Loc) -> DeadLetter | None:
    if raw is None:
        return None
    if raw in ("nothing", "dropped"):
        return DeadLetter(raw)
    if isinstance(raw, dict) and set(raw) == {"reason"}:
        pattern = _pattern(reader, raw["reason"], (*loc, "reason"))
        return None if pattern is None else DeadLetter("reason", pattern)
    reader.problem(loc, f"expected nothing, dropped or {{reason: pattern}}, got {_got(raw)}")
    return None


# -- judging ---------------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """JSON equality: booleans are not numbers, 1 == 1.0, containers compare deeply."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return bool(a == b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and bool(a == b)


def subset(expected: Any, actual: Any) -> bool:
    """``expected`` is found in ``actual``: mappings may have more keys, at any depth;
    lists have the same length, item by item; other values are equal."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and subset(v, actual[k]) for k, v in expected.items()
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(expected) == len(actual)
            and all(subset(e, a) for e, a in zip(expected, actual, strict=True))
        )
    return same(expected, actual)


def _holds(expectation: Expectation, actual: Actual) -> str | None:
    """None when ``actual`` meets ``expectation``, else why not (one line)."""
    if expectation.kind == "nothing":
        if actual.rejected is not None:
            return f"expected nothing, but it rejected the message: {actual.rejected}"
        if actual.fired:
            return f"expected nothing, but it fired {len(actual.fired)} event(s)"
        return None
    if expectation.kind == "reject":
        assert expectation.pattern is not None
        if actual.rejected is None:
            did = f"fired {len(actual.fired)} event(s)" if actual.fired else "did nothing"
            return f"expected a rejection matching {expectation.pattern!r}, but it {did}"
        if re.search(expectation.pattern, actual.rejected) is None:
            return (
                f"rejected, but the reason does not match {expectation.pattern!r}: "
                f"{actual.rejected}"
            )
        return None
    if actual.rejected is not None:
        return f"expected {len(expectation.payloads)} event(s), but it rejected: {actual.rejected}"
    wanted, got = list(expectation.payloads), actual.fired
    check = subset if expectation.subset else same
    if len(wanted) != len(got):
        return f"expected {len(wanted)} event(s), it fired {len(got)}"
    for index, (e, a) in enumerate(zip(wanted, got, strict=True)):
        if not check(e, a):
            how = "is not a subset of" if expectation.subset else "differs from"
            return f"event {index}: the expected payload {how} the one fired"
    return None


def _dead_letter_holds(expected: DeadLetter, actual: str) -> str | None:
    if expected.kind in ("nothing", "dropped"):
        return None if actual == expected.kind else f"expected {expected.kind}, got: {actual}"
    assert expected.pattern is not None
    if actual in ("nothing", "dropped"):
        return f"expected a copy whose reason matches {expected.pattern!r}, got {actual}"
    if re.search(expected.pattern, actual) is None:
        return f"the reason does not match {expected.pattern!r}: {actual}"
    return None


def _yaml(document: Any) -> list[str]:
    import yaml

    text: str = yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=100)
    return text.splitlines()


def judge(result: CaseResult) -> CaseResult:
    """Fill in the result's failures and, when it failed, its diff (expected vs actual)."""
    case = result.case
    expected_doc: dict[str, Any] = {}
    actual_doc: dict[str, Any] = {}
    for watcher, expectation in case.expect.items():
        actual = result.watchers.get(watcher, Actual())
        why = _holds(expectation, actual)
        if why is None:
            # met: both sides show the expectation, so the diff shows only what differs
            expected_doc[watcher] = actual_doc[watcher] = expectation.document()
        else:
            result.failures.append(f"watcher {watcher}: {why}")
            expected_doc[watcher] = expectation.document()
            actual_doc[watcher] = actual.document()
    if case.dead_letter is not None:
        why = _dead_letter_holds(case.dead_letter, result.dead_letter)
        expected = case.dead_letter.document()
        if why is None:
            expected_doc["dead_letter"] = actual_doc["dead_letter"] = expected
        else:
            result.failures.append(f"dead_letter: {why}")
            expected_doc["dead_letter"] = expected
            shown = result.dead_letter
            plain = shown in ("nothing", "dropped")
            actual_doc["dead_letter"] = shown if plain else {"reason": shown}
    if result.failures:
        lines = difflib.unified_diff(
            _yaml(expected_doc), _yaml(actual_doc), "expected", "actual", lineterm="", n=20
        )
        result.diff = "\n".join(lines)
    return result


def describe_failure(result: CaseResult) -> str:
    """A failed case as text: where it is, why it failed, the diff, its log lines."""
    case = result.case
    where = f"{case.file}:{case.line}" if case.line is not None else case.file
    lines = [f"{where}: {case.name}"]
    if result.error is not None:
        lines.append(f"error: {result.error}")
    lines += result.failures
    if result.diff:
        lines += ["", result.diff]
    if result.logs:
        lines += ["", "captured log:", *(f"  {line}" for line in result.logs)]
    return "\n".join(lines)
