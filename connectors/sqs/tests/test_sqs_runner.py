"""``acklane run`` on an SQS stream: a runner killed mid-stream loses no message.

The runner is a real process (``python -m acklane.core.cli.app run CONFIG``) with a
SQLite event store; the test kills it with SIGKILL while messages are in
flight, restarts it, and checks that every message produced exactly one stored
trigger event and left the queue.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from acklane.integration.sqs import SqsQueues


def write_config(path: Path, settings: dict[str, Any], queue_url: str) -> Path:
    """A pipeline with one SQS stream; the keys come from the environment."""
    config = path / "pipeline.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            engine:
              ack_timeout: 30
              restart_backoff_initial: 0.2
              restart_backoff_max: 1
              shutdown_timeout: 10
            store:
              url: "sqlite:///{path / "events.db"}"
            streams:
              jobs:
                connector: sqs
                queue_url: "{queue_url}"
                endpoint_url: "{settings["endpoint_url"]}"
                region: "{settings["region"]}"
                aws_access_key_id: "${{TEST_SQS_KEY_ID}}"
                aws_secret_access_key: "${{TEST_SQS_SECRET}}"
                wait_time_seconds: 1
                batch_size: 5
            watchers:
              - name: every-job
                stream: jobs
                asset: jobs
                filter:
                  emit: message
            """
        )
    )
    return config


class RunnerProcess:
    def __init__(self, config: Path, settings: dict[str, Any], log: Path) -> None:
        self.config = config
        self.env = {
            **os.environ,
            "TEST_SQS_KEY_ID": settings["aws_access_key_id"],
            "TEST_SQS_SECRET": settings["aws_secret_access_key"],
        }
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "acklane.core.cli", "run", str(self.config)],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> int | None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return None if process is None else process.returncode
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
            raise


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[list[RunnerProcess]]:
    started: list[RunnerProcess] = []
    yield started
    for r in started:
        r.stop()


def stored(db: Path) -> list[tuple[str, int]]:
    """``(message_id, position)`` of every stored trigger event."""
    if not db.exists():
        return []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        try:
            return list(conn.execute("SELECT message_id, position FROM acklane_trigger_events"))
        except sqlite3.OperationalError:  # the table is not created yet
            return []


async def wait_for(check: Any, what: str, log: Path, timeout: float = 40.0) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not await check():
                await asyncio.sleep(0.1)
    except TimeoutError:
        tail = log_tail(log)
        raise AssertionError(f"not within {timeout}s: {what}\nrunner log:\n{tail}") from None


def log_tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


async def test_runner_killed_mid_stream_and_restarted_loses_no_message(
    tmp_path: Path,
    settings: dict[str, Any],
    queues: SqsQueues,
    runner: list[RunnerProcess],
) -> None:
    url = await queues.create(visibility_timeout=2)  # what the kill left in flight returns fast
    sent = await queues.send(url, [f'{{"job": {i}}}' for i in range(40)])
    db = tmp_path / "events.db"
    log = tmp_path / "runner.log"
    config = write_config(tmp_path, settings, url)

    first = RunnerProcess(config, settings, log)
    runner.append(first)
    first.start()

    async def some_stored() -> bool:
        return len(stored(db)) >= 10

    await wait_for(some_stored, "the first runner stored some events", log)
    first.kill()  # mid-stream: messages in flight, events stored but not yet deleted

    second = RunnerProcess(config, settings, log)
    runner.append(second)
    second.start()
    sent += await queues.send(url, [f'{{"job": {i}}}' for i in range(40, 60)])

    arn = await queues.arn(url)
    expected = {f"{arn}/{m}" for m in sent}  # the store's identity: queue ARN and MessageId

    async def all_done() -> bool:
        return {m for m, _ in stored(db)} == expected and await queues.counts(url) == (0, 0)

    await wait_for(all_done, "every message stored and deleted", log)
    events = stored(db)
    assert len(events) == len(sent)  # one trigger event each: redeliveries were deduplicated
    assert second.stop() == 0
