"""Message bodies written to hurt: a regex that backtracks, JSON nested a thousand deep,
and text that a terminal would take for markup or escape sequences.

Each must neither hang nor jam the engine: a regex filter runs in time linear in the
text (RE2), a body nested too deep is dead-lettered at once with its reason (not
retried as a failing watcher), and the CLI prints what a message holds as text.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from runner_harness import (  # noqa: F401 - filter_path: a fixture
    all_committed,
    both_filter_paths,
    filter_path,
    run_until,
)

from acklane.connectors.memory import MemoryBroker
from acklane.core.config import AcklaneConfig, ConfigError, parse_config
from acklane.core.connectors.deadletter import REJECT_REASON
from acklane.core.events import EventStore
from acklane.core.message import MAX_JSON_DEPTH, BodyDecodeError, RawMessage
from acklane.core.pipeline.filters import compile_filter
from acklane.core.pipeline.runner import Runner

#: The pattern of the issue: nested quantifiers, exponential for a backtracking engine
#: on a long word that does not end the way it asks.
CATASTROPHIC = r"^(\w+\s?)*$"


def _config(db: Path, broker: str, watchers: str) -> AcklaneConfig:
    text = (
        textwrap.dedent(
            f"""\
        engine:
          ack_timeout: 10
          restart_backoff_initial: 0.02
          restart_backoff_max: 0.1
          shutdown_timeout: 5
          max_restarts: 50
        store:
          url: sqlite:///{db}
        streams:
          orders:
            connector: memory
            broker: {broker}
            topics: [orders]
            group_id: g
            partitions: 1
            dead_letter: orders.dlq
            poll_interval: 0.02
            max_attempts: 3
        """
        )
        + "watchers:\n"
        + textwrap.indent(textwrap.dedent(watchers), "  ")
    )
    return parse_config(text, source="hostile.yaml")


@pytest.fixture
def broker() -> Iterator[MemoryBroker]:
    name = f"h-{uuid.uuid4().hex[:8]}"
    b = MemoryBroker.get(name)
    b.create_topic("orders", 1)
    yield b
    MemoryBroker.remove(name)


async def _stored(db: Path) -> dict[str, list[Any]]:
    async with EventStore(f"sqlite:///{db}") as store:
        events = await store.list_events(limit=1000)
    out: dict[str, list[Any]] = {}
    for e in events:
        out.setdefault(e.trigger_id, []).append(e.payload)
    return out


def _deep(depth: int) -> bytes:
    """A JSON body of ``depth`` nested levels: objects and arrays in turn."""
    opening = "".join('{"a":' if i % 2 else "[" for i in range(depth))
    closing = "".join("}" if i % 2 else "]" for i in reversed(range(depth)))
    return f"{opening}1{closing}".encode()


# -- regular expressions ------------------------------------------------------------------


def test_a_catastrophic_regex_is_evaluated_in_linear_time() -> None:
    # In a process of its own: a backtracking engine holds the interpreter for as long
    # as it takes (longer than the universe's age here), which no timeout in this
    # process could interrupt.
    script = textwrap.dedent(
        f"""\
        import json
        from acklane.core.message import RawMessage
        from acklane.core.pipeline.filters import compile_filter

        f = compile_filter({{"match": {{"body.text": {{"regex": {CATASTROPHIC!r}}}}}}})
        for text in ["a" * 100_000 + "!", "a" * 50 + "!", "words and more words", ""]:
            body = json.dumps({{"text": text}}).encode()
            print(f.evaluate(RawMessage(body, message_id="m")) != [])
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=20
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "True", "True"]


def test_regex_conditions_give_the_same_verdicts_as_before() -> None:
    cases = [
        (r"^order\.", "order.created", True),
        (r"^order\.", "refund.order.", False),
        (r"created$", "order.created", True),
        (r"(?i)ORDER", "order", True),
        (r"^\d{3}-\d{4}$", "555-1234", True),
        (r"^[a-z]+$", "ABC", False),
        (r"é+", "café", True),
        (r"^.{4}$", "café", True),  # a character, not a byte
        (r"x", "lone \ud800 surrogate x", True),  # no UnicodeEncodeError
    ]
    for pattern, text, expected in cases:
        f = compile_filter({"match": {"body.t": {"regex": pattern}}})
        message = RawMessage(json.dumps({"t": text}).encode(), message_id="m")
        assert (f.evaluate(message) != []) is expected, (pattern, text)
    # a regex looks at strings only, as before
    f = compile_filter({"match": {"body.t": {"regex": "1"}}})
    assert f.evaluate(RawMessage(b'{"t": 1}')) == []


@pytest.mark.parametrize(
    ("pattern", "said"),
    [
        (r"(a)\1", r"invalid escape sequence: \1"),
        ("^(?=order)", "invalid perl operator: (?="),
        ("(?<!x)y", "invalid perl operator: (?<"),
        ("a++", "bad repetition operator: ++"),
        ("(", "missing )"),
    ],
)
def test_what_re2_cannot_run_is_refused_when_the_configuration_loads(
    tmp_path: Path, pattern: str, said: str
) -> None:
    watchers = f"""\
    - name: fine
      stream: orders
    - name: picky
      stream: orders
      filter:
        match:
          body.type: {{regex: {json.dumps(pattern)}}}
    """
    with pytest.raises(ConfigError) as caught:
        _config(tmp_path / "e.db", "nowhere", watchers)
    text = str(caught.value)
    assert 'hostile.yaml:26: watchers[1].filter.match["body.type"].regex' in text, text
    assert said in text and "RE2" in text, text


async def test_a_catastrophic_regex_does_not_stall_the_engine(
    tmp_path: Path, broker: MemoryBroker
) -> None:
    db = tmp_path / "e.db"
    watchers = f"""\
    - name: words
      stream: orders
      filter:
        match: {{body.text: {{regex: {json.dumps(CATASTROPHIC)}}}}}
        emit: {{id: body.id}}
    """
    for i, text in enumerate(["a" * 200_000 + "!", "just words", "b" * 5000 + "?"]):
        broker.publish("orders", json.dumps({"id": i, "text": text}).encode(), partition=0)
    runner = Runner(_config(db, broker.name, watchers), handle_signals=False)
    await run_until(runner, lambda: all_committed(broker), timeout=10)
    assert await _stored(db) == {"words": [{"id": 1}]}


# -- JSON nested too deep ------------------------------------------------------------------


def test_a_body_nested_deeper_than_the_limit_is_a_body_decode_error() -> None:
    assert RawMessage(_deep(MAX_JSON_DEPTH)).json() is not None
    for depth in (MAX_JSON_DEPTH + 1, 1000, 100_000):
        with pytest.raises(BodyDecodeError, match=f"nested deeper than {MAX_JSON_DEPTH} levels"):
            RawMessage(_deep(depth), message_id="m").json()
    # the standard library's path (NaN is not strict JSON) refuses it the same way
    with pytest.raises(BodyDecodeError, match="nested deeper"):
        RawMessage(b"[" * 2000 + b"NaN" + b"]" * 2000).json()
    with pytest.raises(BodyDecodeError, match="nested deeper"):
        RawMessage(b"[" * 200 + b"NaN" + b"]" * 200).json()
    # brackets inside strings are no nesting
    wide = json.dumps({"text": "[{" * 5000, "items": [[i] for i in range(500)]}).encode()
    assert RawMessage(wide).json()["items"][499] == [499]


DEEP_WATCHERS = """\
- name: declarative
  stream: orders
  filter: {match: {body.amount: {gt: 0}}, emit: {id: body.id}}
- name: function
  stream: orders
  filter: {function: "poison_filters:big_orders"}
- name: schema
  stream: orders
  filter:
    schema: {type: object, required: [id]}
    emit: {id: body.id}
"""


@both_filter_paths
async def test_a_body_nested_a_thousand_deep_is_dead_lettered_at_once(
    tmp_path: Path, broker: MemoryBroker
) -> None:
    db = tmp_path / "e.db"
    broker.publish("orders", json.dumps({"id": 1, "amount": 500}).encode(), partition=0)
    broker.publish("orders", _deep(1000), partition=0)
    broker.publish("orders", b'{"id": 3, "amount": 700, "deep": ' + _deep(300) + b"}", partition=0)
    broker.publish("orders", json.dumps({"id": 4, "amount": 900}).encode(), partition=0)
    runner = Runner(_config(db, broker.name, DEEP_WATCHERS), handle_signals=False)
    await run_until(runner, lambda: all_committed(broker), timeout=10)

    letters = broker.records("orders.dlq")
    assert [letter.headers["acklane.origin.offset"] for letter in letters] == ["1", "2"]
    for letter in letters:
        reasons = letter.headers[REJECT_REASON].split("; ")
        assert [r.split(":")[0] for r in reasons] == [
            "watcher declarative",
            "watcher function",
            "watcher schema",
        ], reasons
        assert all(f"nested deeper than {MAX_JSON_DEPTH} levels" in r for r in reasons), reasons
        assert "poison" not in letter.headers[REJECT_REASON]  # not retried as a failure
    (book,) = runner.poison.streams().values()
    assert (book.failures, book.restarts) == (0, 0)
    stored = await _stored(db)
    assert {k: sorted(p["id"] for p in v) for k, v in stored.items()} == {
        "declarative": [1, 4],
        "function": [1, 4],
        "schema": [1, 4],
    }
