"""Chaos: SIGKILL ``acklane run`` at random moments; no trigger event lost, none stored twice.

For each broker with an emulator (Kafka on tansu, SQS on moto, Pub/Sub on
acklane's own emulator in relaxed mode, Service Bus on acklane's AMQP emulator;
the official images under Docker with ``ACKLANE_EMULATOR_BACKEND=docker``):

1. start the emulator, create the stream's topic/queue and its dead-letter one;
2. write a pipeline (SQLite event store in a temporary directory, three
   watchers sharing one poll, declarative ``match``/``reject``/``emit``
   filters, short session and backoff settings) and start ``acklane run`` on
   it as a subprocess;
3. produce ``--messages`` JSON messages with known ids (``{"id": "m-17", ...}``)
   in ``--kills`` + 1 chunks, some of them poison (a watcher's ``reject`` rule
   dead-letters them); after each chunk but the last, SIGKILL the runner and
   start it again. Each kill is one of:

   - ``commit``: as soon as the event store's row count grows (polled every
     couple of milliseconds): right after a commit, usually before the broker
     is advanced past it;
   - ``commit+jitter``: the same, a random 0-100 ms later (during the advance,
     the dead-letter copy, the next batch);
   - ``random``: a random 0.2-4 s after the chunk (start-up, group join,
     processing or idle);

4. once the last chunk is produced, wait until every expected trigger event is
   stored and the broker is fully advanced (Kafka: the group's committed offset
   of each partition equals the records produced to it; SQS: the queue is empty
   with nothing in flight; Pub/Sub: the subscription has nothing unacked, leased
   or not, read with the emulator's inspection call, not a pull; Service Bus:
   the queue holds no message and no lock, from the emulator's admin counts),
   stop the runner with SIGTERM, and count:

   - ``lost``: expected ``(watcher, id)`` pairs missing from the store (by the
     ``id`` in the payload, not the broker's message id). Expected is what the
     filters say (``watcher_model``), poison messages included: a watcher
     without a reject rule for a poison message still fires for it;
   - ``dup``: ``(watcher, id)`` pairs stored more than once;
   - ``dlq_missing``: poison ids absent from the dead-letter topic/queue
     (extra copies there, from a kill between the copy and the advance, are
     at-least-once and allowed).

With ``--sink webhook`` every watcher also delivers its events to a webhook sink, a
recording receiver in its own process (``acklane.integration.webhook``), so the kills
fall during deliveries too; once the run is done the line also says ``sink_lost``
(stored events the receiver never got: must be 0) and ``sink_redelivered`` (repeated
arrivals of an event id, which a receiver deduping on the Idempotency-Key drops).

It prints one line per broker, ``kafka: kills=3 msgs=60 lost=0 dup=0 dlq_missing=0``,
and exits 1 when any count is not zero (or when something else went wrong: an
event nobody should have fired, a good message dead-lettered, a broker not
advanced in time, a runner that did not stop cleanly; those are explained on
stderr). Every wait is bounded: ``--timeout`` per broker.

    uv run python bench/chaos.py
    uv run python bench/chaos.py --brokers kafka --messages 200 --kills 10 --seed 7
    uv run python bench/chaos.py --brokers sqs --seed 7 --keep /tmp/chaos  # keep store and log

A new connector joins by adding one ``BrokerAdapter`` subclass to ``ADAPTERS``
(create/produce, read back the dead-letter ids, its YAML stream block, "fully
advanced") and an emulator in ``acklane.integration`` (with its pytest fixture
``<broker>_emulator``, which the test asks for by that name).

``tests/test_chaos.py`` (marker ``chaos``) imports this module and runs
:func:`run_broker` with small numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import yaml

from acklane.core.sinks import event_id_for
from acklane.integration.emulator import Emulator, emulator_for
from acklane.integration.kafka import KafkaKit
from acklane.integration.webhook import WebhookReceiver

EVENTS_TABLE = "acklane_trigger_events"
KILL_MODES = ("commit", "commit+jitter", "random")


# -- the messages and what the watchers must make of them --------------------------------


@dataclass(frozen=True)
class Message:
    id: str
    kind: str  # "order" or "refund"
    amount: int
    valid: bool

    def body(self) -> str:
        return json.dumps(
            {"id": self.id, "kind": self.kind, "amount": self.amount, "valid": self.valid}
        )


#: The watchers (all on one stream, so they share one poll), as YAML filters, and the
#: model of each: ``(rejects, fires)`` for a message. Reject rules are checked first;
#: a watcher that rejects a message fires nothing for it, but the others still may.
WATCHERS: dict[str, dict[str, Any]] = {
    # every valid message; ``valid: false`` is poison
    "all-orders": {
        "reject": {"body.valid": False},
        "emit": {"id": "body.id", "kind": "body.kind"},
    },
    # amounts of 50 and more, poison or not (it has no reject rule)
    "big-amounts": {
        "match": {"body.amount": {"gte": 50}},
        "emit": {"id": "body.id", "amount": "body.amount"},
    },
    # refunds; a negative amount is poison (also for messages that are not refunds)
    "refunds": {
        "match": {"body.kind": "refund"},
        "reject": {"body.amount": {"lt": 0}},
        "emit": "body",
    },
}


def watcher_model(name: str, m: Message) -> tuple[bool, bool]:
    """``(rejects, fires)`` of watcher ``name`` for ``m``: the YAML above, in Python."""
    if name == "all-orders":
        rejects = m.valid is False
        return rejects, not rejects
    if name == "big-amounts":
        return False, m.amount >= 50
    if name == "refunds":
        rejects = m.amount < 0
        return rejects, not rejects and m.kind == "refund"
    raise KeyError(name)


def is_poison(m: Message) -> bool:
    return any(watcher_model(w, m)[0] for w in WATCHERS)


def expected_events(messages: Sequence[Message]) -> set[tuple[str, str]]:
    """``(watcher, id)`` of every trigger event that must be stored, once."""
    return {(w, m.id) for m in messages for w in WATCHERS if watcher_model(w, m)[1]}


def make_messages(n: int, rng: random.Random, poison_rate: float = 0.15) -> list[Message]:
    """``n`` messages ``m-0`` ... ; about ``poison_rate`` of them poison, of both kinds."""
    out = []
    for i in range(n):
        kind = rng.choice(("order", "refund"))
        amount, valid = rng.randrange(100), True
        if rng.random() < poison_rate:
            if rng.random() < 0.5:
                valid = False
            else:
                amount = -rng.randrange(1, 50)
        out.append(Message(f"m-{i}", kind, amount, valid))
    return out


# -- broker adapters ----------------------------------------------------------------------


class BrokerAdapter:
    """What the chaos run needs of one broker; one subclass per connector."""

    name: ClassVar[str]
    #: Options of ``emulator_for`` when the command starts the emulator itself.
    emulator_options: ClassVar[dict[str, Any]] = {}

    def __init__(self, emulator: Emulator) -> None:
        self.emulator = emulator

    def prepare(self) -> None:
        """Create the stream's topic/queue and its dead-letter topic/queue."""
        raise NotImplementedError

    def stream_block(self) -> dict[str, Any]:
        """The YAML stream block (``connector`` included), tuned for quick restarts."""
        raise NotImplementedError

    def produce(self, bodies: Sequence[str]) -> None:
        """Send messages, and return once the broker has them all."""
        raise NotImplementedError

    def advanced(self) -> tuple[bool, str]:
        """Whether every produced message was advanced past, and what the broker says."""
        raise NotImplementedError

    def dlq_ids(self, expected: set[str], timeout: float) -> Counter[str]:
        """Ids (from the JSON bodies) of the dead-letter copies, with their number.

        Reads until ``expected`` are all seen or ``timeout`` passed.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Drop clients and throw-away queues (best effort)."""


def _body_id(value: bytes | str | None) -> str:
    try:
        body = json.loads(value or b"")
        return str(body["id"])
    except (ValueError, TypeError, KeyError):
        return f"<not a chaos message: {value!r:.60}>"


class KafkaAdapter(BrokerAdapter):
    name = "kafka"
    PARTITIONS = 3

    def prepare(self) -> None:
        self.kit = KafkaKit.of(self.emulator)
        self.topic = self.kit.new_topic("chaos", partitions=self.PARTITIONS)
        self.dlq = self.kit.new_topic("chaos-dlq", partitions=1)
        self.group = KafkaKit.unique("chaos-group")
        self.produced = [0] * self.PARTITIONS

    def stream_block(self) -> dict[str, Any]:
        return {
            "connector": "kafka",
            **self.emulator.client_settings(),
            "topics": [self.topic],
            "group_id": self.group,
            "dead_letter": self.dlq,
            "poll_timeout": 0.05,
            "batch_size": 8,  # several commits per chunk: more moments to kill at
            # tansu: a join takes about half of session.timeout.ms; a killed member is
            # evicted after it.
            "client": dict(KafkaKit.FAST_GROUP),
        }

    def produce(self, bodies: Sequence[str]) -> None:
        # Round robin with explicit partitions, so the final committed offsets are known.
        base = sum(self.produced)
        for p in range(self.PARTITIONS):
            mine = [b for i, b in enumerate(bodies) if (base + i) % self.PARTITIONS == p]
            if mine:
                self.kit.produce(self.topic, mine, partition=p)
                self.produced[p] += len(mine)

    def advanced(self) -> tuple[bool, str]:
        committed = self.kit.committed(self.group, self.topic, self.PARTITIONS)
        done = all((committed.get(p) or 0) == n for p, n in enumerate(self.produced))
        return done, f"committed {committed}, produced {dict(enumerate(self.produced))}"

    def dlq_ids(self, expected: set[str], timeout: float) -> Counter[str]:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.kit.bootstrap_servers,
                "group.id": KafkaKit.unique("chaos-dlq-reader"),
                "enable.auto.commit": False,
            }
        )
        seen: Counter[str] = Counter()
        try:
            consumer.assign([TopicPartition(self.dlq, 0, OFFSET_BEGINNING)])
            deadline = time.monotonic() + timeout
            while not expected <= seen.keys() and time.monotonic() < deadline:
                for record in consumer.consume(num_messages=100, timeout=0.2):
                    if record.error() is None:
                        seen[_body_id(record.value())] += 1
            # (a moment more for copies beyond the expected ones, to report them)
            for record in consumer.consume(num_messages=1000, timeout=0.5):
                if record.error() is None:
                    seen[_body_id(record.value())] += 1
        finally:
            consumer.close()
        return seen

    def close(self) -> None:
        kit = getattr(self, "kit", None)
        if kit is not None:
            kit.close()


class SqsAdapter(BrokerAdapter):
    """boto3's synchronous client: the chaos driver is a plain loop, not a coroutine."""

    name = "sqs"
    VISIBILITY = 2  # seconds: what a killed runner left in flight comes back quickly

    def prepare(self) -> None:
        from acklane.integration.sqs import sqs_client

        self.client: Any = sqs_client(self.emulator.client_settings())
        suffix = uuid.uuid4().hex[:12]
        self.queue = self._create(f"chaos-{suffix}")
        self.dlq = self._create(f"chaos-dlq-{suffix}")

    def _create(self, name: str) -> str:
        response = self.client.create_queue(
            QueueName=name, Attributes={"VisibilityTimeout": str(self.VISIBILITY)}
        )
        return str(response["QueueUrl"])

    def stream_block(self) -> dict[str, Any]:
        return {
            "connector": "sqs",
            **self.emulator.client_settings(),  # the emulator's dummy keys
            "queue_url": self.queue,
            "dead_letter": self.dlq,
            "wait_time_seconds": 1,
            "batch_size": 5,
        }

    def produce(self, bodies: Sequence[str]) -> None:
        for start in range(0, len(bodies), 10):
            entries = [
                {"Id": str(i), "MessageBody": body}
                for i, body in enumerate(bodies[start : start + 10])
            ]
            response = self.client.send_message_batch(QueueUrl=self.queue, Entries=entries)
            if response.get("Failed"):
                raise RuntimeError(f"send to {self.queue} failed: {response['Failed']}")

    def advanced(self) -> tuple[bool, str]:
        attrs = self.client.get_queue_attributes(
            QueueUrl=self.queue,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        visible = int(attrs.get("ApproximateNumberOfMessages", 0))
        in_flight = int(attrs.get("ApproximateNumberOfMessagesNotVisible", 0))
        return (visible, in_flight) == (0, 0), f"visible {visible}, in flight {in_flight}"

    def dlq_ids(self, expected: set[str], timeout: float) -> Counter[str]:
        seen: Counter[str] = Counter()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            response = self.client.receive_message(
                QueueUrl=self.dlq,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=0 if expected <= seen.keys() else 1,
                VisibilityTimeout=max(int(timeout) + 30, 60),  # read each copy once
            )
            messages = response.get("Messages", [])
            for m in messages:
                seen[_body_id(m["Body"])] += 1
            if not messages and expected <= seen.keys():
                break
        return seen

    def close(self) -> None:
        client = getattr(self, "client", None)
        if client is None:
            return
        for url in (getattr(self, "queue", None), getattr(self, "dlq", None)):
            if url:
                with contextlib.suppress(Exception):
                    client.delete_queue(QueueUrl=url)
        client.close()


class PubSubAdapter(BrokerAdapter):
    """``PubSubKit`` (asyncio) on a loop of the adapter's own: the chaos driver is synchronous.

    "Fully advanced" is read with the emulator's inspection call (``PubSubKit.stats``:
    every message acked, none leased), never by pulling, which would lease messages
    away from the runner. Google's emulator has no such call: there the check pulls
    what is visible and nacks it at once (leased messages cannot be seen).
    """

    name = "pubsub"
    emulator_options: ClassVar[dict[str, Any]] = {"relaxed": True}

    def _run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    def prepare(self) -> None:
        import asyncio

        from acklane.integration.pubsub import PubSubKit

        self.loop = asyncio.new_event_loop()
        self.kit = self._run(PubSubKit(self.emulator.client_settings()).__aenter__())
        # A killed runner's leases lapse after this; 10 s is the service's minimum.
        self.deadline = 2 if getattr(self.emulator, "relaxed", False) else 10
        self.topic = self._run(self.kit.create_topic("chaos"))
        self.dlq = self._run(self.kit.create_topic("chaos-dlq"))
        self.subscription = self._run(
            self.kit.create_subscription(self.topic, "chaos-sub", ack_deadline=self.deadline)
        )
        # Created before anything is dead-lettered: it gets every copy.
        self.dlq_reader = self._run(
            self.kit.create_subscription(self.dlq, "chaos-dlq-reader", ack_deadline=60)
        )
        self.inspectable = True

    def stream_block(self) -> dict[str, Any]:
        return {
            "connector": "pubsub",
            **self.emulator.client_settings(),  # project, emulator_host
            "subscription": self.subscription,
            "dead_letter": self.dlq,
            "batch_size": 8,  # several acks per chunk: more moments to kill at
            "ack_deadline": self.deadline,
        }

    def produce(self, bodies: Sequence[str]) -> None:
        self._run(self.kit.publish(self.topic, bodies))

    def _stats(self, subscription: str) -> dict[str, int] | None:
        if not self.inspectable:
            return None
        try:
            return dict(self._run(self.kit.stats(subscription)))
        except Exception as exc:
            if "UNIMPLEMENTED" not in repr(exc) and "Method not found" not in str(exc):
                raise
            self.inspectable = False
            return None

    def advanced(self) -> tuple[bool, str]:
        stats = self._stats(self.subscription)
        if stats is not None:
            return stats["backlog"] == 0, (
                f"unacked {stats['backlog']} (leased {stats['leased']}, delayed {stats['delayed']})"
            )
        from google.pubsub_v1 import types

        request = types.PullRequest(
            subscription=self.subscription, max_messages=1000, return_immediately=True
        )
        received = self._run(self.kit.subscriber.pull(request=request)).received_messages
        if received:
            self._run(
                self.kit.subscriber.modify_ack_deadline(
                    subscription=self.subscription,
                    ack_ids=[r.ack_id for r in received],
                    ack_deadline_seconds=0,
                )
            )
        return not received, f"visible {len(received)} (leased ones not visible)"

    def dlq_ids(self, expected: set[str], timeout: float) -> Counter[str]:
        seen: Counter[str] = Counter()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if expected <= seen.keys():
                stats = self._stats(self.dlq_reader)
                if stats is not None and stats["backlog"] == 0:
                    break  # nothing more, not even extra copies
            received = self._run(self.kit.pull(self.dlq_reader, max_messages=1000, ack=True))
            for r in received:
                seen[_body_id(r.message.data)] += 1
            if not received and expected <= seen.keys():
                break
        return seen

    def close(self) -> None:
        kit = getattr(self, "kit", None)
        if kit is not None:
            with contextlib.suppress(Exception):
                self._run(kit.__aexit__(None, None, None))
        loop = getattr(self, "loop", None)
        if loop is not None:
            loop.close()


class ServiceBusAdapter(BrokerAdapter):
    """acklane's Service Bus emulator through the official SDK (sync): a queue whose
    dead-letter sub-queue receives the rejects."""

    name = "servicebus"
    LOCK_DURATION = 3  # seconds: what a killed runner left locked comes back quickly
    #: Kills make redeliveries; Service Bus must not dead-letter a message for them.
    MAX_DELIVERY_COUNT = 1000

    def prepare(self) -> None:
        from acklane.integration.servicebus import ServiceBusKit

        self.connection_string = str(self.emulator.client_settings()["connection_string"])
        self.kit = ServiceBusKit(self.connection_string)
        admin: Any = self.emulator  # the local emulator's admin calls
        self.queue = admin.create_queue(
            f"chaos-{uuid.uuid4().hex[:12]}",
            lock_duration=self.LOCK_DURATION,
            max_delivery_count=self.MAX_DELIVERY_COUNT,
        )

    def stream_block(self) -> dict[str, Any]:
        return {
            "connector": "servicebus",
            "connection_string": self.connection_string,
            "queue": self.queue,
            "max_wait_time": 1,
            "batch_size": 10,
            "prefetch": 10,
        }

    def produce(self, bodies: Sequence[str]) -> None:
        from azure.servicebus import ServiceBusClient, ServiceBusMessage

        with (
            ServiceBusClient.from_connection_string(self.connection_string) as client,
            client.get_queue_sender(self.queue) as sender,
        ):
            for start in range(0, len(bodies), 50):
                sender.send_messages([ServiceBusMessage(b) for b in bodies[start : start + 50]])

    def advanced(self) -> tuple[bool, str]:
        admin: Any = self.emulator
        counts = admin.counts(self.queue)
        done = (counts["messages"], counts["locked"]) == (0, 0)
        return done, (
            f"messages {counts['messages']}, locked {counts['locked']}, "
            f"dead-lettered {counts['dead_letter']}"
        )

    def dlq_ids(self, expected: set[str], timeout: float) -> Counter[str]:
        from azure.servicebus import ServiceBusClient

        seen: Counter[str] = Counter()
        deadline = time.monotonic() + timeout
        with (
            ServiceBusClient.from_connection_string(self.connection_string) as client,
            client.get_queue_receiver(self.queue, sub_queue="deadletter") as receiver,
        ):
            while True:
                seen.clear()  # peek reads the whole sub-queue again: count each copy once
                start = 0
                while batch := receiver.peek_messages(max_message_count=250, sequence_number=start):
                    for message in batch:
                        seen[_body_id(b"".join(message.body))] += 1
                    start = max(m.sequence_number or 0 for m in batch) + 1
                if expected <= seen.keys() or time.monotonic() >= deadline:
                    return seen
                time.sleep(0.2)

    def close(self) -> None:
        queue = getattr(self, "queue", None)
        if queue is not None:
            admin: Any = self.emulator
            with contextlib.suppress(Exception):
                admin.delete_entity(queue)


ADAPTERS: dict[str, type[BrokerAdapter]] = {
    a.name: a for a in (KafkaAdapter, SqsAdapter, PubSubAdapter, ServiceBusAdapter)
}


# -- the runner process and the store -----------------------------------------------------


class RunnerProcess:
    """``acklane run CONFIG`` as a child process; its output goes to ``log``."""

    def __init__(self, config: Path, log: Path, *options: str) -> None:
        self.config = config
        self.log = log
        #: More options of ``acklane run`` (``--no-sinks``).
        self.options = options
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        with self.log.open("ab") as out:
            out.write(f"\n===== start {self.starts} =====\n".encode())
            out.flush()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "acklane.core.cli", "run", *self.options, str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.starts += 1

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        process, self.process = self.process, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGKILL)
            process.wait(timeout=10)

    def terminate(self, timeout: float) -> int | None:
        """SIGTERM and wait; SIGKILL after ``timeout``. The exit code (None: killed)."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is not None:
            return process.returncode
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
            return None

    def tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


class StoreReader:
    """Read-only view of the runner's SQLite event store (WAL: never blocks the writer)."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self._conn: sqlite3.Connection | None = None

    def _connection(self) -> sqlite3.Connection | None:
        if self._conn is None and self.db.exists():
            self._conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=10)
        return self._conn

    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        conn = self._connection()
        if conn is None:
            return []
        try:
            return list(conn.execute(sql))
        except sqlite3.OperationalError:  # no table yet (or the file is being created)
            self.close()
            return []

    def count(self) -> int:
        rows = self._query(f"SELECT count(*) FROM {EVENTS_TABLE}")
        return int(rows[0][0]) if rows else 0

    def pairs(self) -> Counter[tuple[str, str]]:
        """``(watcher, payload id)`` of every stored event, with its number of rows."""
        return Counter(
            (str(trigger), _body_id(payload))
            for trigger, payload in self._query(f"SELECT trigger_id, payload FROM {EVENTS_TABLE}")
        )

    def event_ids(self) -> set[str]:
        """The sinks' event id of every stored event (what a sink must deliver)."""
        rows = self._query(
            f"SELECT id, trigger_id, stream_key, message_id, position, created_at "
            f"FROM {EVENTS_TABLE}"
        )
        return {
            event_id_for(
                watcher=str(trigger),
                stream=str(stream),
                message_id=None if message_id is None else str(message_id),
                position=int(position),
                store_id=int(row_id),
                created_at=datetime.fromisoformat(str(created)).replace(tzinfo=UTC),
            )
            for row_id, trigger, stream, message_id, position, created in rows
        }

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


# -- one chaos run ------------------------------------------------------------------------


@dataclass
class Result:
    broker: str
    seed: int
    kills: int = 0
    messages: int = 0
    lost: int = 0
    dup: int = 0
    dlq_missing: int = 0
    #: With ``--sink webhook``: stored events the receiver never got, and repeated
    #: arrivals of an event id (at least once: allowed, and counted).
    sink: str | None = None
    sink_lost: int = 0
    sink_redelivered: int = 0
    #: anything else that went wrong, in words (also fails the run)
    problems: list[str] = field(default_factory=list)
    #: what happened, in order (kill modes and times), for the report
    timeline: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    runner_log: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.dup or self.dlq_missing or self.sink_lost or self.problems)

    def line(self) -> str:
        line = (
            f"{self.broker}: kills={self.kills} msgs={self.messages} "
            f"lost={self.lost} dup={self.dup} dlq_missing={self.dlq_missing}"
        )
        if self.sink is not None:
            line += f" sink_lost={self.sink_lost} sink_redelivered={self.sink_redelivered}"
        return line

    def explain(self, log: bool = True) -> str:
        """Everything needed to look into a run: problems, counts, timeline, runner log."""
        parts = [f"{self.broker}: seed={self.seed}, {self.seconds:.1f}s"]
        parts += [f"  problem: {p}" for p in self.problems]
        parts += [f"  {d}" for d in self.details]
        parts.append("  timeline:")
        parts += [f"    {t}" for t in self.timeline]
        if log:
            parts.append("  runner log (tail):")
            parts += [f"    {line}" for line in self.runner_log.splitlines()]
        return "\n".join(parts)


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self, cap: float | None = None) -> float:
        left = max(self.end - time.monotonic(), 0.0)
        return left if cap is None else min(left, cap)


def wait_until(check: Callable[[], bool], timeout: float, interval: float) -> bool:
    """Poll ``check`` until it holds (True) or ``timeout`` passed (False)."""
    end = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(interval)


def wait_for_growth(store: StoreReader, runner: RunnerProcess, rows: int, timeout: float) -> bool:
    """Poll the store every 2 ms until it holds more than ``rows`` rows (or the runner died)."""
    return wait_until(lambda: store.count() > rows or not runner.alive(), timeout, 0.002)


def write_config(
    workdir: Path, adapter: BrokerAdapter, hook: str | None = None, inline_filters: bool = True
) -> Path:
    """The pipeline; with ``hook`` (a receiver's URL) every watcher also delivers its
    events to a webhook sink there; ``inline_filters`` is ``engine.inline_filters``
    (False: the declarative watchers run as generators, each in its own task)."""
    config: dict[str, Any] = {
        "engine": {
            "ack_timeout": 30,
            "restart_backoff_initial": 0.2,
            "restart_backoff_max": 1.0,
            "shutdown_timeout": 10.0,
            "inline_filters": inline_filters,
        },
        "store": {"url": f"sqlite:///{workdir / 'events.db'}"},
        "streams": {"chaos": adapter.stream_block()},
        "watchers": [
            {"name": name, "stream": "chaos", "asset": name.replace("-", "_"), "filter": filt}
            for name, filt in WATCHERS.items()
        ],
    }
    if hook is not None:
        config["sinks"] = [
            {
                "name": "hook",
                "kind": "webhook",
                "url": hook,
                "ordered": False,
                "concurrency": 4,
                "batch_size": 5,
                "backoff_initial": 0.1,
                "backoff_max": 1.0,
            }
        ]
        for watcher in config["watchers"]:
            watcher["sinks"] = ["hook"]
    path = workdir / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def chunks(items: Sequence[Message], parts: int, rng: random.Random) -> list[list[Message]]:
    """``items`` in ``parts`` consecutive chunks of about equal sizes (+-30%), none empty."""
    n = len(items)
    parts = max(1, min(parts, n))
    step = n / parts
    cuts = [0]
    for i in range(1, parts):
        cut = round(i * step + rng.uniform(-0.3, 0.3) * step)
        cuts.append(min(max(cut, cuts[-1] + 1), n - (parts - i)))
    cuts.append(n)
    return [list(items[a:b]) for a, b in itertools.pairwise(cuts)]


def kill_modes(kills: int, rng: random.Random) -> list[str]:
    """One mode per kill; the first is always right after a commit."""
    return ["commit", *(rng.choice(KILL_MODES) for _ in range(kills - 1))][:kills]


def run_broker(
    broker: str,
    emulator: Emulator,
    *,
    messages: int = 200,
    kills: int = 5,
    seed: int = 0,
    timeout: float = 300.0,
    workdir: Path | None = None,
    sink: str | None = None,
    inline_filters: bool = True,
) -> Result:
    """One chaos run on a started emulator; never raises for what it finds. With
    ``sink="webhook"`` the watchers also deliver to a recording webhook receiver (a
    real HTTP server in its own process), and the kills fall during deliveries too.
    ``inline_filters=False`` runs the watchers on the generator path."""
    started = time.monotonic()
    deadline = Deadline(timeout)
    rng = random.Random(f"{seed}:{broker}")
    result = Result(broker=broker, seed=seed, messages=messages, sink=sink)
    msgs = make_messages(messages, rng)
    poison = {m.id for m in msgs if is_poison(m)}
    expected = expected_events(msgs)
    plan = chunks(msgs, kills + 1, rng)
    modes = kill_modes(len(plan) - 1, rng)

    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chaos-")))
        workdir.mkdir(parents=True, exist_ok=True)
        adapter = ADAPTERS[broker](emulator)
        stack.callback(adapter.close)
        adapter.prepare()
        receiver = None
        if sink is not None:
            if sink != "webhook":
                raise ValueError(f"unknown chaos sink {sink!r} (webhook)")
            receiver = stack.enter_context(WebhookReceiver())
        config = write_config(
            workdir, adapter, None if receiver is None else receiver.url, inline_filters
        )
        runner = RunnerProcess(config, workdir / "runner.log")
        store = StoreReader(workdir / "events.db")
        stack.callback(store.close)
        stack.callback(runner.kill)  # whatever happens, no runner outlives the run

        def note(what: str) -> None:
            result.timeline.append(f"{time.monotonic() - started:6.2f}s {what}")

        runner.start()
        note(f"runner started (pid {runner.process.pid if runner.process else '?'})")
        for chunk, mode in zip(plan, modes, strict=False):
            before = store.count()
            adapter.produce([m.body() for m in chunk])
            note(f"produced {chunk[0].id}..{chunk[-1].id} ({len(chunk)}); store has {before}")
            if mode == "random":
                time.sleep(min(rng.uniform(0.2, 4.0), deadline.left()))
            else:
                grew = wait_for_growth(store, runner, before, deadline.left(30.0))
                if not runner.alive():
                    result.problems.append(
                        f"the runner exited by itself (code {runner.exit_code()}) before a kill"
                    )
                elif not grew:
                    note("the store did not grow in time; killing anyway")
                if mode == "commit+jitter":
                    time.sleep(rng.uniform(0.0, 0.1))
            count = store.count()
            runner.kill()
            result.kills += 1
            note(f"SIGKILL ({mode}); store had {count} rows; broker: {adapter.advanced()[1]}")
            runner.start()
            note("runner restarted")
        last = plan[-1]
        if last:
            adapter.produce([m.body() for m in last])
            note(f"produced {last[0].id}..{last[-1].id} ({len(last)})")

        # Let it finish: every expected event stored and the broker advanced past all.
        state = {"advanced": False, "broker": "", "stored_all": False}

        def finished() -> bool:
            state["stored_all"] = expected <= store.pairs().keys()
            if state["stored_all"]:
                state["advanced"], state["broker"] = adapter.advanced()
            return bool(state["stored_all"] and state["advanced"]) or not runner.alive()

        wait_until(finished, deadline.left(120.0), 0.25)
        if not state["stored_all"]:
            # Perhaps lost for good: is the broker done with them anyway?
            state["advanced"], state["broker"] = adapter.advanced()
        note(f"finished waiting: stored all={state['stored_all']}, broker: {state['broker']}")
        if not runner.alive():
            result.problems.append(f"the runner exited by itself (code {runner.exit_code()})")
        if not state["advanced"]:
            result.problems.append(f"the broker was not fully advanced: {state['broker']}")
        if receiver is not None:
            # every stored event delivered to the receiver (the runner is still running)
            wanted = store.event_ids()
            wait_until(
                lambda: wanted <= receiver.stats(keys=True).keys.keys() or not runner.alive(),
                deadline.left(60.0),
                0.25,
            )
            got = receiver.stats(keys=True)
            result.sink_lost = len(wanted - got.keys.keys())
            result.sink_redelivered = got.repeats
            strangers = got.keys.keys() - wanted
            result.details.append(
                f"webhook: {got.requests} request(s), {got.events} event(s), "
                f"{got.distinct} distinct of {len(wanted)} stored"
            )
            if strangers:
                result.problems.append(
                    f"the receiver got event ids never stored: {sorted(strangers)[:5]}"
                )
            note(f"webhook: {got.distinct}/{len(wanted)} delivered, {got.repeats} repeat(s)")

        code = runner.terminate(timeout=20.0)
        note(f"SIGTERM: exit code {code}")
        if code != 0:
            result.problems.append(f"the runner's exit code after SIGTERM was {code}")

        stored = store.pairs()
        lost = sorted(expected - stored.keys())
        dups = {pair: n for pair, n in stored.items() if n > 1}
        unexpected = sorted(stored.keys() - expected)
        dlq = adapter.dlq_ids(poison, deadline.left(15.0) + 2.0)
        missing = sorted(poison - dlq.keys())
        wrongly_dead = sorted(dlq.keys() - poison)

        result.lost = len(lost)
        result.dup = sum(n - 1 for n in dups.values())
        result.dlq_missing = len(missing)
        result.details += [
            f"expected events: {len(expected)}, stored rows: {sum(stored.values())}, "
            f"poison: {len(poison)}, dead-letter copies: {sum(dlq.values())}",
            f"chunks: {[len(c) for c in plan]}, kill modes: {modes}",
        ]
        if lost:
            result.details.append(f"lost (watcher, id): {lost}")
        if dups:
            result.details.append(f"stored more than once (watcher, id): rows {dups}")
        if missing:
            result.details.append(f"poison ids not dead-lettered: {missing}")
        if unexpected:
            result.problems.append(f"events no watcher should have fired: {unexpected}")
        if wrongly_dead:
            result.problems.append(f"dead-lettered but not poison: {wrongly_dead}")
        result.runner_log = runner.tail()
    result.seconds = time.monotonic() - started
    return result


@contextlib.contextmanager
def started_emulator(broker: str) -> Iterator[Emulator]:
    emulator = emulator_for(broker, **ADAPTERS[broker].emulator_options)
    emulator.start()
    try:
        yield emulator
    finally:
        emulator.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--brokers", nargs="+", default=list(ADAPTERS), choices=list(ADAPTERS))
    parser.add_argument("--messages", type=int, default=200, help="messages per broker")
    parser.add_argument("--kills", type=int, default=5, help="SIGKILLs per broker")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds per broker, every wait included"
    )
    parser.add_argument(
        "--sink",
        choices=["webhook"],
        default=None,
        help="also deliver every event to a webhook sink (a recording receiver) and count "
        "sink_lost and sink_redelivered",
    )
    parser.add_argument("--verbose", action="store_true", help="the timeline of every run")
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep each broker's pipeline, event store and runner log in DIR/BROKER",
    )
    args = parser.parse_args(argv)
    if args.messages < 1 or args.kills < 0:
        parser.error("--messages must be at least 1 and --kills at least 0")
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    print(f"seed={seed}", file=sys.stderr)

    failed = False
    for broker in args.brokers:
        with started_emulator(broker) as emulator:
            result = run_broker(
                broker,
                emulator,
                messages=args.messages,
                kills=args.kills,
                seed=seed,
                timeout=args.timeout,
                workdir=None if args.keep is None else args.keep / broker,
                sink=args.sink,
            )
        print(result.line(), flush=True)
        if args.verbose or not result.ok:
            print(result.explain(log=not result.ok), file=sys.stderr, flush=True)
        failed |= not result.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
