"""The shared stream producer of one Kafka consumer group.

confluent-kafka's consumer is not thread-safe, so its calls (consume, commit, seek,
pause, close) and the rebalance callbacks run one at a time, and so do the
producer's books (owned partitions, held floors, last commits): on a dedicated
thread for every call that may wait (a commit, a seek, a consume that waits for
records, the connect and close), or on the event loop's thread, while that thread
runs nothing, for a consume of what librdkafka has already fetched (``timeout=0``:
it does not wait). Handing records from one thread to the other cost more wall time
than building them, and the two threads fought for the GIL (bench/README.md).

The producer is the composition of layers, one concept each, each using only those
below it: :mod:`._clients` (the clients, their thread :mod:`._handoff`, their
health), :mod:`._books` (the rebalance books), :mod:`._commit` (commits, holds,
seeks back, dead-letter copies in :mod:`._dlq`), :mod:`._fetch` (fetch, hand-out,
pause); here, the :class:`SharedStreamProducer` interface, connect and close. The
cluster and topic ids that name records are read by :mod:`._identity`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Hashable, Mapping, Sequence
from dataclasses import asdict

from confluent_kafka import Consumer, KafkaException
from confluent_kafka.admin import AdminClient

from acklane.core.connectors import Action
from acklane.core.producer import AdvanceItem, LaneBatch, SharedStreamProducer

from ._clients import CLIENT_LOG
from ._config import KafkaConfig
from ._errors import KafkaAdvanceError, KafkaReceiveError
from ._fetch import FetchPath, _Handout
from ._identity import read_cluster_id
from ._message import _UNSET, KafkaDelivery, KafkaMessage

__all__ = ["KafkaStreamProducer"]

log = logging.getLogger("acklane.connectors.kafka")


class KafkaStreamProducer(FetchPath, SharedStreamProducer[KafkaDelivery]):
    """Consumes a Kafka consumer group for one shared stream and commits what the engine advances.

    Lane = ``(topic, partition)``. ``advance`` commits offset+1 of the last
    committable record of the lane; a failed or unclaimed record holds its
    partition (nothing at or after it is committed, across batches) and the
    partition is sought back to it so it comes again now; a rejected record is
    copied to ``dead_letter`` (flushed before the commit that passes it) or, with no
    DLQ, committed past and counted in ``stats.dropped``.

    A record's ``message_id`` names the cluster and the topic's life as well as the
    partition and offset (see :func:`~acklane.connectors.kafka.id_prefix`): read
    once on connect (the cluster id) and once per assignment (the topic ids).
    """

    def __init__(self, config: KafkaConfig) -> None:
        super().__init__(config)
        self._opened = False

    # -- the SharedStreamProducer interface

    async def open_stream(self) -> AsyncIterator[tuple[KafkaMessage, KafkaDelivery]]:
        """Join the consumer group and yield its records, one at a time, forever."""
        batches = self.open_batches()
        try:
            async for batch in batches:
                for pair in batch.pairs:
                    yield pair
        finally:
            await batches.aclose()

    async def open_batches(self) -> AsyncGenerator[LaneBatch]:
        """Join the consumer group and yield its records, batch by batch, forever.

        Each record is both the filters' raw event and the broker payload. A batch is
        a run of records of one partition (a fetch holds runs of each partition), so
        the engine looks the lane up once per run.
        """
        if self._opened:
            raise RuntimeError(f"{self.config.describe()}: open_stream() may be called only once")
        if self._closed:
            raise RuntimeError(f"{self.config.describe()}: the producer is closed")
        self._opened = True
        self._thread.start(f"acklane-kafka-{self.config.group_id}")
        await self._call(self._connect)
        cfg = self.config
        while True:
            room = cfg.max_outstanding - self._outstanding
            if room >= self._min_room:
                epoch, batch, starts = await self._fetch_batch(min(room, cfg.batch_size))
            elif await self._wait_for_room():
                continue
            else:
                # Still full: pause fetching, but keep polling so that rebalances and
                # max.poll.interval.ms are served while the watchers catch up.
                epoch, batch, starts = await self._call(self._fetch_runs, 1, True)
            if not batch:
                continue
            ends = starts[1:]
            ends.append(len(batch))
            for start, end in zip(starts, ends, strict=True):
                run = batch[start:end]
                yield LaneBatch(run[0].lane, _Handout(self, run, epoch))

    async def advance(self, batch: Sequence[AdvanceItem[KafkaDelivery]]) -> None:
        """Commit, dead-letter or hold, per partition, for a resolved prefix of one lane."""
        if not batch:
            return
        try:
            await self._call(self._advance, batch)
        finally:
            self._outstanding -= len(batch)
            if self.config.max_outstanding - self._outstanding >= self._min_room:
                self._room.set()

    def counters(self) -> Mapping[str, float]:
        return {Action(name): count for name, count in asdict(self.stats).items()}

    def broker_problem(self) -> str | None:
        # written on the consumer thread; one str attribute, read here on the loop
        return self._health.unreachable

    def get_advance_lane(self, delivery: KafkaDelivery) -> Hashable:
        return delivery.lane

    def message_id(self, delivery: KafkaDelivery) -> str | None:
        mid: str = delivery._mid  # made when the record was fetched (see KafkaMessage)
        return delivery.message_id if mid is _UNSET else mid

    async def aclose(self) -> None:
        """Flush the DLQ producer and close the consumer (leaving the group), once."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()  # a connect still waiting for the cluster gives up now
        if self._thread.started:
            await self._thread.last(self._close_clients)

    @property
    def assignment(self) -> frozenset[tuple[str, int]]:
        """The ``(topic, partition)`` pairs this consumer owns now."""
        return self._assignment

    # -- on the consumer thread

    def _connect(self) -> None:
        settings = self.config.consumer_settings()
        settings["error_cb"] = self._on_client_error
        settings["logger"] = CLIENT_LOG
        try:
            consumer = Consumer(settings)
        except KafkaException as exc:
            raise KafkaReceiveError(
                f"cannot create the Kafka consumer for {self.config.describe()}: {exc}"
            ) from exc
        self._consumer = consumer
        admin = self.config.admin_settings()
        admin["error_cb"] = self._on_client_error
        admin["logger"] = CLIENT_LOG
        self._admin = AdminClient(admin)
        self._cluster_id = read_cluster_id(
            self._admin, consumer, self._health, self._closing, self.config
        )
        if self.config.dead_letter is not None:
            self._dead_letters.check_limits(self._admin, self.config.dead_letter)
        consumer.subscribe(
            list(self.config.topics),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        log.info(
            "Kafka consumer subscribed %s cluster=%s", self.config.describe(), self._cluster_id
        )

    def _close_clients(self) -> None:
        problems = self._dead_letters.close()
        self._admin = None
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception as exc:
                problems.append(f"consumer close failed: {exc!r}")
            self._consumer = None
        if problems:
            raise KafkaAdvanceError(f"closing {self.config.describe()}: {'; '.join(problems)}")
