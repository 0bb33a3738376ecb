"""What bench/latency.py and bench/runner.py share: a real ``acklane run`` on an emulator.

- broker adapters (create the topic/queue, produce, the YAML stream block), from
  bench/chaos.py, with stream settings for throughput instead of kill points;
- the event store: SQLite in a temporary directory or PostgreSQL in a fresh schema
  (``ACKLANE_BENCH_PG_URL``, default ``postgresql://postgres@127.0.0.1:5432/test``),
  and a reader of its rows (``created_at``: the time of the transaction that wrote
  the row, taken just before its INSERT, so a commit time to within one transaction);
- the pipeline file and ``acklane run`` as a subprocess, with its peak RSS.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from acklane.integration.chaos import (
    ADAPTERS,
    BrokerAdapter,
    KafkaAdapter,
    PubSubAdapter,
    RunnerProcess,
    ServiceBusAdapter,
    SqsAdapter,
    started_emulator,
)

__all__ = [
    "BROKERS",
    "EVENTS_TABLE",
    "PG_URL",
    "BrokerAdapter",
    "EventsReader",
    "Runner",
    "adapter_for",
    "percentile",
    "started_emulator",
    "store_for",
    "wait_for",
    "write_config",
]

EVENTS_TABLE = "acklane_trigger_events"
PG_URL = os.environ.get("ACKLANE_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


# -- brokers: chaos's adapters, tuned for throughput ----------------------------------------


class FastKafka(KafkaAdapter):
    PARTITIONS = 4
    #: The consumer's fetch.wait.max.ms (env FETCH_WAIT_MS): tansu holds a fetch for all of
    #: it even when records come (a Kafka broker answers as soon as fetch.min.bytes is
    #: there), which would add up to that much to every latency measured here.
    FETCH_WAIT_MS = int(os.environ.get("FETCH_WAIT_MS", "5"))

    def stream_block(self) -> dict[str, Any]:
        block = super().stream_block()
        block.update(batch_size=500, poll_timeout=0.1)
        block["client"] = {**block["client"], "fetch.wait.max.ms": self.FETCH_WAIT_MS}
        block.pop("dead_letter", None)
        return block

    def produce(self, bodies: Sequence[str]) -> None:
        # one flush for all (the default partitioner spreads them), not one per partition
        self.kit.produce(self.topic, bodies)


class FastSqs(SqsAdapter):
    VISIBILITY = 30

    def stream_block(self) -> dict[str, Any]:
        block = super().stream_block()
        block.update(wait_time_seconds=1, batch_size=10)
        return block


class FastPubSub(PubSubAdapter):
    def stream_block(self) -> dict[str, Any]:
        block = super().stream_block()
        block.update(batch_size=100)
        return block


class FastServiceBus(ServiceBusAdapter):
    def stream_block(self) -> dict[str, Any]:
        block = super().stream_block()
        block.update(batch_size=50, prefetch=100, max_wait_time=1)
        return block

    def produce(self, bodies: Sequence[str]) -> None:
        # One client and sender for the whole run (chaos's adapter connects per call,
        # some 0.7 s that a publish timestamp taken before the call would count).
        from azure.servicebus import ServiceBusClient, ServiceBusMessage

        sender = getattr(self, "sender", None)
        if sender is None:
            self.client = ServiceBusClient.from_connection_string(self.connection_string)
            sender = self.sender = self.client.get_queue_sender(self.queue)
        for start in range(0, len(bodies), 50):
            sender.send_messages([ServiceBusMessage(b) for b in bodies[start : start + 50]])

    def close(self) -> None:
        sender = getattr(self, "sender", None)
        if sender is not None:
            with contextlib.suppress(Exception):
                sender.close()
                self.client.close()
        super().close()


_FAST: dict[str, type[BrokerAdapter]] = {
    "kafka": FastKafka,
    "sqs": FastSqs,
    "pubsub": FastPubSub,
    "servicebus": FastServiceBus,
}
BROKERS = tuple(ADAPTERS)


def adapter_for(broker: str, emulator: Any) -> BrokerAdapter:
    adapter = _FAST[broker](emulator)
    adapter.prepare()
    return adapter


# -- the event store ------------------------------------------------------------------------


def _epoch(value: Any) -> float:
    """A stored ``created_at`` as seconds since the epoch (SQLite keeps naive UTC text)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return float(value.timestamp())


class EventsReader:
    """Reads the rows ``acklane run`` commits (SQLite or PostgreSQL), without writing."""

    kind: str
    url: str  # what the pipeline's store.url says

    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def count(self) -> int:
        rows = self._query(f"SELECT count(*) FROM {EVENTS_TABLE}")
        return int(rows[0][0]) if rows else 0

    def rows(self) -> list[tuple[dict[str, Any], float]]:
        """Every row's payload (decoded) and ``created_at`` (epoch seconds)."""
        return [
            (json.loads(payload), _epoch(created))
            for payload, created in self._query(f"SELECT payload, created_at FROM {EVENTS_TABLE}")
        ]

    def span(self) -> tuple[int, float]:
        """Rows, and seconds between the first and the last commit."""
        rows = self._query(f"SELECT count(*), min(created_at), max(created_at) FROM {EVENTS_TABLE}")
        if not rows or not rows[0][0]:
            return 0, 0.0
        n, first, last = rows[0]
        return int(n), _epoch(last) - _epoch(first)

    def close(self) -> None:
        pass


class SqliteReader(EventsReader):
    kind = "sqlite"

    def __init__(self, workdir: Path) -> None:
        self.db = workdir / "events.db"
        self.url = f"sqlite:///{self.db}"
        self._conn: sqlite3.Connection | None = None

    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        if self._conn is None:
            if not self.db.exists():
                return []
            self._conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=10)
        try:
            return list(self._conn.execute(sql))
        except sqlite3.OperationalError:  # no table yet
            self.close()
            return []

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class PostgresReader(EventsReader):
    """A fresh schema per run, so that every row is a real insert; dropped on close."""

    kind = "postgres"

    def __init__(self) -> None:
        import psycopg

        self.schema = f"bench_{uuid.uuid4().hex[:12]}"
        self._conn = psycopg.connect(PG_URL, autocommit=True)
        self._conn.execute(f'CREATE SCHEMA "{self.schema}"')
        self._conn.execute(f'SET search_path TO "{self.schema}"')
        sep = "&" if "?" in PG_URL else "?"
        self.url = f"{PG_URL}{sep}options={quote(f'-csearch_path={self.schema}', safe='')}"

    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        import psycopg

        try:
            return list(self._conn.execute(sql))
        except psycopg.errors.UndefinedTable:
            return []

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        self._conn.close()


def store_for(kind: str, workdir: Path) -> EventsReader:
    if kind == "sqlite":
        return SqliteReader(workdir)
    if kind == "postgres":
        return PostgresReader()
    raise ValueError(f"unknown store {kind!r} (sqlite, postgres)")


# -- the pipeline and the runner ------------------------------------------------------------


def write_config(
    workdir: Path,
    stream: dict[str, Any],
    store_url: str,
    watchers: Sequence[dict[str, Any]],
    metrics_port: int | None = None,
) -> Path:
    """A pipeline with one stream, ``watchers`` on it, and the given store."""
    config: dict[str, Any] = {
        "engine": {"ack_timeout": 120, "shutdown_timeout": 20.0, "progress_interval": 0},
        "store": {"url": store_url, "retention": None},
        "streams": {"bench": stream},
        "watchers": [{"stream": "bench", **w} for w in watchers],
    }
    if metrics_port is not None:
        config["metrics"] = {"port": metrics_port}
    path = workdir / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@dataclass
class Runner:
    """``acklane run`` (the real CLI, ``python -m acklane.core.cli run``) as a subprocess."""

    config: Path
    log: Path

    def __post_init__(self) -> None:
        self.process = RunnerProcess(self.config, self.log)

    def start(self) -> None:
        self.process.start()

    @property
    def pid(self) -> int:
        assert self.process.process is not None
        return self.process.process.pid

    def alive(self) -> bool:
        return self.process.alive()

    def peak_rss_mb(self) -> float:
        """The process's peak resident set (VmHWM), in MiB."""
        return self._status_mb("VmHWM:")

    def rss_mb(self) -> float:
        """The process's resident set now (VmRSS), in MiB."""
        return self._status_mb("VmRSS:")

    def _status_mb(self, field: str) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> int | None:
        return self.process.terminate(30)

    def tail(self) -> str:
        return self.process.tail()


@contextlib.contextmanager
def running(runner: Runner) -> Iterator[Runner]:
    runner.start()
    try:
        yield runner
    finally:
        runner.stop()


def wait_for(
    store: EventsReader,
    rows: int,
    runner: Runner,
    timeout: float,
    each: Callable[[int], None] | None = None,
) -> None:
    """Until the store holds ``rows`` rows; raises with the runner's log tail otherwise.

    ``each`` is called with the row count at every look (every 50 ms).
    """
    deadline = time.monotonic() + timeout
    while (count := store.count()) < rows:
        if each is not None:
            each(count)
        if not runner.alive():
            raise RuntimeError(f"acklane run exited early:\n{runner.tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"only {store.count()} of {rows} rows after {timeout:.0f}s:\n{runner.tail()}"
            )
        time.sleep(0.05)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
