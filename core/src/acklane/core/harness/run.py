"""Runs a pipeline's test cases through the real engine on the in-process memory broker.

Each stream of the configuration becomes a memory stream (its ``max_attempts``
kept, a dead-letter topic of its own), the event store a SQLite file in a
temporary directory, and the pipeline runs in a :class:`~acklane.core.pipeline.runner.Runner`
as ``acklane run`` would: the same compiled filters, the same engine, the same
reject and poison rules (a filter that raises fails the cohort, the message comes
again, and after ``max_attempts`` it is dead-lettered with the last error). Sinks
are not delivered, and the restart backoff is shortened, so a poison case takes
milliseconds, not minutes.

The cases run one after the other: a case's message is published, and once the
engine has advanced past it (every watcher done, its events stored) the harness
reads what each watcher fired (from the event store), which rejections came with
it, and what the dead-letter topic got. A case whose message is not resolved
within ``timeout`` fails, and the pipeline is started afresh for the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import tempfile
import time
import uuid
from collections.abc import Hashable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ..config import StreamConfig
from ..connectors.deadletter import ORIGIN_OFFSET, ORIGIN_PARTITION, ORIGIN_TOPIC, REJECT_REASON
from ..pipeline.runner import Runner, RunObserver
from ..producer import AdvanceItem
from .cases import Actual, Case, CaseResult, judge

if TYPE_CHECKING:
    from ..config import AcklaneConfig

__all__ = ["DEFAULT_TIMEOUT", "run_cases"]

#: Seconds a case's message may take to be resolved before the case fails.
DEFAULT_TIMEOUT: Final = 30.0
_GROUP: Final = "acklane-test"
_WATCHER_REASON: Final = re.compile(r"^watcher (\S+): ")
#: Connectors whose rejected messages always have a destination (SQS's redrive target,
#: Service Bus's dead-letter sub-queue), dead_letter set or not.
_ALWAYS_DEAD_LETTERED: Final = ("sqs", "servicebus")


class _Observer(RunObserver):
    """Wakes the harness when the message it waits for has been advanced."""

    def __init__(self) -> None:
        self.waiting_for: str | None = None
        #: The stream key of the case's stream: another stream reading the same topic
        #: (its own group) advances the same record on its own.
        self.key: Hashable = None
        self.outcome: Any = None
        self.resolved = asyncio.Event()

    def advanced(self, key: Hashable, batch: Sequence[AdvanceItem]) -> None:
        if key != self.key:
            return
        for item in batch:
            record = getattr(item.broker_payload, "record", None)
            outcome = item.outcome
            if (
                record is not None
                and record.message_id == self.waiting_for
                and not outcome.failed
                and (outcome.acked or outcome.rejected)
            ):
                self.outcome = outcome
                self.resolved.set()


class _LogCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@contextlib.contextmanager
def _captured_logs() -> Iterator[_LogCapture]:
    """acklane's WARNING+ log lines go to the case's result, not to the console."""
    logger = logging.getLogger("acklane")
    handler = _LogCapture()
    propagate, level = logger.propagate, logger.level
    logger.addHandler(handler)
    logger.propagate = False
    if logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.propagate, logger.level = propagate, level


def _topic(stream: StreamConfig) -> str:
    """The topic a case's message goes to: the stream's first topic, else its name
    (the message's ``source``, as the real broker would give it for Kafka)."""
    topics = getattr(stream.config, "topics", None)
    if isinstance(topics, list) and topics and isinstance(topics[0], str):
        return topics[0]
    return stream.name


def _dead_letter_topic(stream: str) -> str:
    return f"{stream}.acklane-test-dead-letter"


def _drops(stream: StreamConfig) -> bool:
    """Rejected messages of this stream are dropped: no destination for them."""
    return (
        getattr(stream.config, "dead_letter", None) is None
        and stream.connector_name not in _ALWAYS_DEAD_LETTERED
    )


def test_config(
    config: AcklaneConfig, cases: Sequence[Case], broker: str, store_url: str
) -> AcklaneConfig:
    """``config`` on the memory broker ``broker`` and the store ``store_url``, no sinks."""
    from acklane.connectors.memory import MemoryConfig

    from ..config import MetricsSettings, StoreSettings
    from ..connectors import load_connector
    from ..pipeline.poison import max_attempts_of
    from ..stores.settings import StateStoreSettings

    streams: dict[str, StreamConfig] = {}
    for name, stream in config.streams.items():
        topics = {_topic(stream)} | {
            c.message.source for c in cases if c.message.stream == name and c.message.source
        }
        memory = MemoryConfig(
            broker=broker,
            topics=sorted(topics),
            group_id=f"{_GROUP}-{name}",  # each stream its own group, as on a real broker
            partitions=1,
            poll_interval=0.05,
            max_attempts=max_attempts_of(stream.config),
            dead_letter=_dead_letter_topic(name),
        )
        options = memory.model_dump(mode="json", exclude_none=True)
        connector = load_connector("memory")
        streams[name] = StreamConfig(name, "memory", connector, memory, options, stream.line)
    engine = config.engine.model_copy(
        update={
            "restart_backoff_initial": 0.01,
            "restart_backoff_max": 0.05,
            "progress_interval": 0.0,
            "cohort_grace_period": 0.0,
            "shutdown_timeout": min(config.engine.shutdown_timeout, 5.0),
        }
    )
    return dataclasses.replace(
        config,
        engine=engine,
        store=StoreSettings(url=store_url, commit_interval_ms=0, retention=None),
        state=StateStoreSettings(),
        metrics=MetricsSettings(),
        streams=streams,
        watchers=tuple(dataclasses.replace(w, sinks=()) for w in config.watchers),
        sinks={},
    )


def _attribute(
    reasons: Sequence[str], rejected: int, config: AcklaneConfig, watchers: Sequence[str]
) -> dict[str, str]:
    """Which watcher gave which reject reason.

    A reason acklane writes starts with ``watcher NAME: ``; a poison verdict
    (``poison: ...``) is every watcher's. A reason a function filter gave
    itself (``reject_shared_stream_event("...")``) goes to the function filters not
    accounted for, in the file's order.
    """
    out: dict[str, str] = {}
    loose: list[str] = []
    for reason in reasons:
        if reason.startswith("poison: "):
            return dict.fromkeys(watchers, reason)
        found = _WATCHER_REASON.match(reason)
        if found and found.group(1) in watchers and found.group(1) not in out:
            out[found.group(1)] = reason
        else:
            loose.append(reason)
    loose += ["(rejected without a reason)"] * max(0, rejected - len(reasons))
    candidates = [
        w.name
        for w in config.watchers
        if w.name in watchers and w.name not in out and "function" in (w.filter or {})
    ] or [w for w in watchers if w not in out]
    for watcher, reason in zip(candidates, loose, strict=False):
        out[watcher] = reason
    return out


class _Pipeline:
    """One run of the test configuration, kept running from case to case."""

    def __init__(self, config: AcklaneConfig, cases: Sequence[Case], folder: Path) -> None:
        self.broker_name = f"acklane-test-{uuid.uuid4().hex[:12]}"
        url = f"sqlite:///{folder / f'{self.broker_name}.db'}"
        self.original = config
        self.config = test_config(config, cases, self.broker_name, url)
        self.observer = _Observer()
        self.runner = Runner(self.config, observer=self.observer, handle_signals=False)
        self.task: asyncio.Task[None] | None = None
        self.last_event_id = 0
        #: The case's message: (topic, partition, offset).
        self.published: tuple[str, int, int] = ("", 0, 0)

    @property
    def broker(self) -> Any:
        from acklane.connectors.memory import MemoryBroker

        return MemoryBroker.get(self.broker_name)

    async def start(self) -> None:
        for name, stream in self.config.streams.items():
            # before any publish: one partition each, so that records are in publish order
            for topic in [*stream.options["topics"], _dead_letter_topic(name)]:
                self.broker.create_topic(topic, 1)
        self.task = asyncio.create_task(self.runner.run(), name="acklane-test-pipeline")

    async def stop(self) -> None:
        from acklane.connectors.memory import MemoryBroker

        self.runner.request_stop()
        if self.task is not None:
            try:
                async with asyncio.timeout(self.config.engine.shutdown_timeout + 5):
                    await self.task
            except (TimeoutError, Exception):
                self.task.cancel()
                with contextlib.suppress(BaseException):
                    await self.task
        MemoryBroker.remove(self.broker_name)

    async def run(self, case: Case, within: float) -> CaseResult:
        started = time.monotonic()
        message = case.message
        stream = self.config.streams[message.stream]
        topic = message.source or _topic(self.original.streams[message.stream])
        watchers = [w.name for w in self.config.watchers if w.stream == message.stream]
        observer = self.observer
        observer.resolved.clear()
        observer.outcome = None
        observer.key = stream.key
        dead_topic = _dead_letter_topic(message.stream)
        partition, offset = self.broker.publish(
            topic, message.body, message.key, message.attributes
        )
        self.published = (topic, partition, offset)
        observer.waiting_for = f"memory:{self.broker.incarnation}/{topic}/{partition}/{offset}"
        result = CaseResult(case, {w: Actual() for w in watchers}, "nothing")
        try:
            async with asyncio.timeout(within):
                await _first(observer.resolved.wait(), self.task)
        except TimeoutError:
            result.error = (
                f"the message was not resolved within {within:g}s (a watcher still on it: "
                "see engine.ack_timeout, or --timeout)"
            )
        if self.runner.failure is not None:
            result.error = f"the pipeline stopped: {self.runner.failure}"
        elif self.task is not None and self.task.done() and result.error is None:
            exc = self.task.exception() if not self.task.cancelled() else None
            result.error = f"the pipeline stopped: {exc!r}"
        if result.error is None:
            await self._collect(result, observer.waiting_for, watchers, dead_topic, stream)
        result.seconds = time.monotonic() - started
        return judge(result)

    async def _collect(
        self,
        result: CaseResult,
        message_id: str,
        watchers: Sequence[str],
        dead_topic: str,
        stream: StreamConfig,
    ) -> None:
        events = await self.runner.store.list_events(after_id=self.last_event_id, limit=100_000)
        for event in events:
            self.last_event_id = max(self.last_event_id, event.id)
            if event.message_id == message_id and event.trigger_id in result.watchers:
                result.watchers[event.trigger_id].fired.append((event.position, event.payload))
        for actual in result.watchers.values():
            actual.fired = [payload for _, payload in sorted(actual.fired, key=lambda p: p[0])]
        outcome = self.observer.outcome
        reasons = tuple(getattr(outcome, "reject_reasons", ()))
        for watcher, reason in _attribute(reasons, outcome.rejected, self.config, watchers).items():
            result.watchers[watcher].rejected = reason
        # the copies of this very message (another stream on its topic has its own topic)
        topic, partition, offset = self.published
        origin = {ORIGIN_TOPIC: topic, ORIGIN_PARTITION: str(partition), ORIGIN_OFFSET: str(offset)}
        copies = [
            r
            for r in self.broker.records(dead_topic)
            if all(r.headers.get(k) == v for k, v in origin.items())
        ]
        if copies:
            reason = copies[-1].headers.get(REJECT_REASON, "")
            original = self.original.streams[stream.name]
            result.dead_letter = "dropped" if _drops(original) else reason


async def _first(wait: Any, task: asyncio.Task[None] | None) -> None:
    """Await ``wait`` unless the pipeline's task ends first."""
    waiter = asyncio.ensure_future(wait)
    try:
        pending = {waiter} if task is None else {waiter, task}
        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not waiter.done():
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter


async def run_cases(
    config: AcklaneConfig, cases: Sequence[Case], *, within: float = DEFAULT_TIMEOUT
) -> list[CaseResult]:
    """Run ``cases`` one after the other through ``config``'s watchers; one result each
    (a case whose message is not resolved within ``within`` seconds fails)."""
    results: list[CaseResult] = []
    if not cases:
        return results
    with tempfile.TemporaryDirectory(prefix="acklane-test-") as folder, _captured_logs() as logs:
        pipeline: _Pipeline | None = None
        try:
            for case in cases:
                if pipeline is None:
                    pipeline = _Pipeline(config, cases, Path(folder))
                    await pipeline.start()
                mark = len(logs.lines)
                result = await pipeline.run(case, within)
                result.logs = logs.lines[mark:]
                results.append(result)
                if result.error is not None:  # start afresh: its message may hold the stream
                    await pipeline.stop()
                    pipeline = None
        finally:
            if pipeline is not None:
                await pipeline.stop()
    return results
