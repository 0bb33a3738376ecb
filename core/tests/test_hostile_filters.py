"""Message bodies written to hurt: a regex that backtracks, JSON nested a thousand deep,
and text that a terminal would take for markup or escape sequences.

Each must neither hang nor jam the engine: a regex filter runs in time linear in the
text (RE2), a body nested too deep is dead-lettered at once with its reason (not
retried as a failing watcher), and the CLI prints what a message holds as text.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from runner_harness import all_committed, both_filter_paths, run_until

from acklane.connectors.memory import MemoryBroker
from acklane.core.config import AcklaneConfig, ConfigError, parse_config
from acklane.core.connectors.deadletter import ORIGIN_MESSAGE_ID, ORIGIN_TOPIC, REJECT_REASON
from acklane.core.events import EventRecord, EventStore
from acklane.core.message import MAX_JSON_DEPTH, BodyDecodeError, RawMessage
from acklane.core.pipeline.filters import compile_filter
from acklane.core.pipeline.runner import Runner
from acklane.integration.kafka import KafkaKit

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
        assert (f.evaluate(message) != []) is expected, (pattern, text)  # remembered
    # past the verdicts it remembers, it still answers each text on its own
    f = compile_filter({"match": {"body.t": {"regex": "7$"}}})
    for n in range(3000):
        assert (f.evaluate(RawMessage(b'{"t": "%d"}' % n)) != []) is (n % 10 == 7), n
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


# -- untrusted text in the terminal ------------------------------------------------------

#: What a body, a reason or an id may hold: Rich markup (a closing tag with nothing
#: open made ``dlq list`` exit 1), a window title, a screen clear, a cursor move back
#: over what was printed, a bell, and a right-to-left override.
HOSTILE = "[/x] closing [bold]loud\x1b]0;pwned\x07\x1b[2J\x1b[1A\x9b31m\u202edesrever"
#: The same, as the CLI must print it: markup as text, every control as an escape.
SHOWN = r"[/x] closing [bold]loud\x1b]0;pwned\x07\x1b[2J\x1b[1A\x9b31m\u202edesrever"
#: What must not reach the terminal raw (a style of the CLI's own may start with ESC [).
RAW = ["\x1b]0;", "\x1b[2J", "\x1b[1A", "\x07", "\x9b", "\u202e"]


def _acklane(*args: str, terminal: bool = False) -> subprocess.CompletedProcess[str]:
    """The real ``acklane`` command, as a terminal sees it (``terminal``) or piped."""
    env = {**os.environ, "COLUMNS": "400"}
    env.pop("NO_COLOR", None)
    if terminal:
        env["FORCE_COLOR"] = "1"  # Rich's tables and colours, as on a terminal
    else:
        env.pop("FORCE_COLOR", None)
    return subprocess.run(
        [sys.executable, "-m", "acklane.core.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def _printed_as_text(output: str) -> None:
    assert not [raw for raw in RAW if raw in output], repr(output)


def test_dlq_list_prints_bodies_reasons_and_ids_as_text(
    tmp_path: Path, kafka_kit: KafkaKit
) -> None:
    topic = kafka_kit.new_topic("hostile")
    dead = kafka_kit.new_topic("hostile-dlq")
    kafka_kit.produce(
        dead,
        [json.dumps({"note": HOSTILE}, ensure_ascii=False).encode()],
        headers=[
            (ORIGIN_TOPIC, topic),
            (ORIGIN_MESSAGE_ID, f"id-{HOSTILE}"),
            (REJECT_REASON, f"watcher w: {HOSTILE}"),
        ],
    )
    config = tmp_path / "p.yaml"
    config.write_text(
        f"store: {{url: 'sqlite:///{tmp_path}/e.db'}}\n"
        "streams:\n  orders:\n    connector: kafka\n"
        f"    bootstrap_servers: {kafka_kit.bootstrap_servers}\n"
        f"    topics: [{topic}]\n    group_id: g\n    dead_letter: {dead}\n"
        "watchers: [{name: w, stream: orders}]\n"
    )
    for terminal in (True, False):
        done = _acklane("dlq", "list", str(config), "orders", terminal=terminal)
        assert done.returncode == 0, done.stdout + done.stderr
        _printed_as_text(done.stdout + done.stderr)
        flat = done.stdout.replace("\n", "")
        assert "[/x] closing [bold]loud" in flat, done.stdout
        assert r"\x1b]0;pwned\x07" in flat and r"\u202edesrever" in flat, done.stdout


def test_events_list_prints_payloads_and_ids_as_text(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/events.db"

    async def fill() -> None:
        async with EventStore(url, on_confirmed=lambda seqs: None) as store:
            record = EventRecord("w", '["memory","orders"]', {"note": HOSTILE}, HOSTILE, 0)
            await store.put(record, seq=0)
            await store.flush()

    asyncio.run(fill())
    for terminal in (True, False):
        done = _acklane("events", "list", "--url", url, terminal=terminal)
        assert done.returncode == 0, done.stdout + done.stderr
        _printed_as_text(done.stdout + done.stderr)
        assert "[/x] closing" in done.stdout, done.stdout
    # piped, each event is one line: the message id in full
    assert SHOWN in done.stdout.splitlines()[1].split("\t")[4], done.stdout


def test_top_prints_what_the_service_answers_as_text() -> None:
    # a service (or whatever answers at the URL) names the streams, their states and
    # the problems: a real HTTP server answering hostile text
    ready = {
        "ready": False,
        "problems": [f"stream broken: {HOSTILE}"],
        "streams": {f"s-{HOSTILE}": {"state": HOSTILE, "key": "k"}},
    }

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(ready).encode() if self.path == "/readyz" else b""
            self.send_response(503 if self.path == "/readyz" else 200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        done = _acklane("top", "--once", "--url", url, terminal=True)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stdout + done.stderr
    _printed_as_text(done.stdout + done.stderr)
    assert "s-[/x] closing" in done.stdout and "stream broken: [/x]" in done.stdout, done.stdout


async def test_sinks_parked_prints_a_receivers_reason_as_text(tmp_path: Path) -> None:
    # the reason quotes what the receiver answered; the sink is the dispatcher tests'
    # recording double, refusing the event as a receiver's HTTP 400 would
    from test_sink_dispatch import Recording, put, running

    from acklane.core.sinks import RefusedDelivery, parked_events
    from acklane.core.sql import async_engine
    from acklane.core.testing import eventually

    url = f"sqlite:///{tmp_path}/e.db"
    sink = Recording("hook", behave=lambda d: RefusedDelivery(f"HTTP 400: {HOSTILE}"))
    async with running(url, sink) as (store, _):
        await put(store, [1])
        engine = async_engine(url)
        try:

            async def parked() -> bool:
                return bool(await parked_events(engine, "hook"))

            await eventually(parked, "the event parked", within=10)
        finally:
            await engine.dispose()
    config = tmp_path / "p.yaml"
    config.write_text(
        f"store: {{url: '{url}'}}\n"
        "streams: {m: {connector: memory, broker: hostile, topics: [t]}}\n"
        "sinks: [{name: hook, kind: webhook, url: 'http://127.0.0.1:1/hook'}]\n"
        "watchers: [{name: w, stream: m, sinks: [hook]}]\n"
    )
    for terminal in (True, False):
        done = await asyncio.to_thread(
            _acklane, "sinks", "parked", str(config), "hook", terminal=terminal
        )
        assert done.returncode == 0, done.stdout + done.stderr
        _printed_as_text(done.stdout + done.stderr)
        assert "HTTP 400: [/x] closing" in done.stdout, done.stdout
