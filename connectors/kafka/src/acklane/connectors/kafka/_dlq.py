"""Dead-letter copies to a Kafka topic, and the size limits that can refuse them.

A rejected record is copied to the ``dead_letter`` topic (its headers plus where it
came from and why) and the copies are flushed before the commit that passes them;
a copy the DLQ topic or the DLQ producer refuses as too large fails the group,
naming the settings to raise. At start, the source topics' ``max.message.bytes``
are compared with the DLQ's, so that such a record is told before it comes.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    ConfigResource,
    ResourceType,
)

from acklane.core.connectors.deadletter import (
    ORIGIN_GROUP,
    ORIGIN_OFFSET,
    ORIGIN_PARTITION,
    ORIGIN_TOPIC,
    REASON_MAX_BYTES,
    REJECT_REASON,
    DeadLetterStep,
    bounded_text,
    log_origin,
    outcome_reason,
)
from acklane.core.errors import DeadLetterRefused
from acklane.core.producer import AdvanceItem

from ._config import KafkaConfig
from ._errors import KafkaAdvanceError, _Refused
from ._health import QuietClientLog
from ._identity import METADATA_TIMEOUT
from ._message import KafkaDelivery
from ._stats import KafkaStreamStats

__all__ = ["DLQ_ADDED_MAX_BYTES", "DLQ_GROUP_MAX_BYTES", "DeadLetterCopies"]

log = logging.getLogger("acklane.connectors.kafka")

#: The most bytes of the group name an ``acklane.origin.group`` header carries.
DLQ_GROUP_MAX_BYTES = 255
#: The most bytes acklane adds to a dead-letter copy (header names and values; the
#: topic name is at most 249 bytes, the reason at most ``REASON_MAX_BYTES``).
DLQ_ADDED_MAX_BYTES = (
    sum(map(len, (ORIGIN_TOPIC, ORIGIN_PARTITION, ORIGIN_OFFSET, ORIGIN_GROUP, REJECT_REASON)))
    + 249
    + len(str(2**31 - 1))
    + len(str(2**63 - 1))
    + DLQ_GROUP_MAX_BYTES
    + REASON_MAX_BYTES
)
# librdkafka's own batch.size: the most a producer batches into one request per partition.
_LIBRDKAFKA_BATCH_SIZE = 1_000_000
# A record (or its batch) over a size limit, from produce() or the broker.
_TOO_LARGE = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})


def _copy_size(key: bytes | None, value: bytes | None, headers: list[tuple[str, Any]]) -> int:
    """Bytes of a record's key, value and headers (names and values)."""
    size = len(key or b"") + len(value or b"")
    for name, data in headers:
        size += len(name.encode()) + len(data.encode() if isinstance(data, str) else data or b"")
    return size


def max_message_bytes(admin: Any, topics: list[str]) -> dict[str, int | Exception | None]:
    """Each topic's ``max.message.bytes``: an int, None when not reported, or the error."""
    out: dict[str, int | Exception | None] = {}
    resources = [ConfigResource(ResourceType.TOPIC, t) for t in topics]
    try:
        futures = admin.describe_configs(resources, request_timeout=METADATA_TIMEOUT)
    except KafkaException as exc:
        return dict.fromkeys(topics, exc)
    for resource, future in futures.items():
        try:
            entry = future.result(timeout=METADATA_TIMEOUT + 5).get("max.message.bytes")
            out[resource.name] = None if entry is None else int(entry.value)
        except Exception as exc:
            out[resource.name] = exc
    return out


class DeadLetterCopies:
    """The dead-letter step of one consumer group: copies, drops and refusals, counted
    in ``stats``; its producer client is made at the first copy (consumer thread)."""

    def __init__(
        self,
        config: KafkaConfig,
        stats: KafkaStreamStats,
        on_client_error: Callable[[KafkaError], None],
        client_log: QuietClientLog,
    ) -> None:
        self.config = config
        self.stats = stats
        self._on_client_error = on_client_error
        self._client_log = client_log
        self._step = DeadLetterStep(
            "Kafka",
            f"group {config.group_id}",
            config.dead_letter,
            "dead_letter",
            logger=log,
            refused_error=_Refused,
            failed_error=KafkaAdvanceError,
        )
        self._client: Any = None
        self.limit: int | None = None  # the DLQ topic's max.message.bytes, if known

    def check_limits(self, admin: Any, dlq: str) -> None:
        """Warn, at start, when a record a source topic holds cannot fit in the DLQ topic."""
        sources = [t for t in self.config.topics if not t.startswith("^")]
        limits = max_message_bytes(admin, [dlq, *sources])
        dlq_limit = limits.get(dlq)
        if isinstance(dlq_limit, Exception):
            log.warning(
                "Kafka DLQ topic %s: cannot read its max.message.bytes (%s); a rejected record "
                "larger than it allows will stop its partition (nothing is committed past a "
                "record that was not dead-lettered)",
                dlq,
                dlq_limit,
            )
            return
        self.limit = dlq_limit
        client_limit = int(self.config.dlq_settings()["message.max.bytes"])
        for topic in sources:
            limit = limits.get(topic)
            if not isinstance(limit, int):
                log.debug("Kafka topic %s: max.message.bytes unknown (%s)", topic, limit)
                continue
            for smaller, setting in (
                (dlq_limit, f"max.message.bytes of the DLQ topic {dlq}"),
                (
                    client_limit,
                    "message.max.bytes of the dead-letter producer (dead_letter_client)",
                ),
            ):
                if smaller is not None and smaller < limit:
                    log.warning(
                        "Kafka %s is %d bytes, smaller than topic %s's max.message.bytes %d: a "
                        "rejected record between the two (less the up to %d bytes of headers "
                        "acklane adds) cannot be dead-lettered, and its partition stops there "
                        "(nothing is committed past it). Raise %s to at least %d",
                        setting,
                        smaller,
                        topic,
                        limit,
                        DLQ_ADDED_MAX_BYTES,
                        setting,
                        limit + DLQ_ADDED_MAX_BYTES,
                    )

    def copy(self, items: Sequence[AdvanceItem[KafkaDelivery]], topic: str) -> None:
        """Copy ``items`` to ``topic`` and wait until the broker confirmed every copy,
        else raise: nothing may be committed past a record that was not copied."""
        producer = self._client
        if producer is None:
            producer = self._client = self._new_client()
        # (message id, copy size, error) of each copy the broker did not take
        errors: list[tuple[str, int, KafkaError]] = []

        def delivered(record_id: str, size: int, error: KafkaError | None, _msg: Any) -> None:
            if error is not None:
                errors.append((record_id, size, error))

        group = bounded_text(self.config.group_id, DLQ_GROUP_MAX_BYTES)
        for item in items:
            delivery: KafkaDelivery = item.broker_payload
            message = delivery.message
            outcome = item.outcome
            headers: list[tuple[str, str | bytes | None]] = list(message.headers() or ())
            headers += log_origin(message.topic(), message.partition(), message.offset())
            headers += [(ORIGIN_GROUP, group), (REJECT_REASON, outcome_reason(outcome))]
            key, value = message.key(), message.value()
            size = _copy_size(key, value, headers)
            while True:
                try:
                    producer.produce(
                        topic,
                        value=value,
                        key=key,
                        headers=headers,
                        on_delivery=functools.partial(delivered, delivery.message_id, size),
                    )
                    break
                except BufferError:
                    producer.poll(0.1)  # the local queue is full: let deliveries drain
                except KafkaException as exc:
                    error = exc.args[0] if exc.args else None
                    if isinstance(error, KafkaError) and error.code() in _TOO_LARGE:
                        raise self._refused(
                            delivery.message_id, size, topic, by_broker=False
                        ) from exc
                    raise KafkaAdvanceError(
                        f"cannot dead-letter {delivery.message_id} ({size} bytes of key, value "
                        f"and headers) to {topic!r}: {exc}; nothing was committed past it"
                    ) from exc
        remaining = producer.flush(self.config.dead_letter_flush_timeout)
        if remaining:
            raise KafkaAdvanceError(
                f"{remaining} dead-letter copies to {topic!r} were not confirmed within "
                f"{self.config.dead_letter_flush_timeout}s; nothing was committed past them"
            )
        if errors:
            refused = [(mid, size) for mid, size, e in errors if e.code() in _TOO_LARGE]
            if refused:
                raise self._refused(*refused[0], topic, by_broker=True, count=len(refused))
            mid, _, error = errors[0]
            raise KafkaAdvanceError(
                f"dead-lettering to {topic!r} failed: {error.str()} (the copy of {mid}); "
                "nothing was committed past it"
            )
        for item in items:
            self._step.copied(item.broker_payload.message_id, outcome_reason(item.outcome))
        self.stats.dead_lettered = self._step.dead_lettered

    def _new_client(self) -> Any:
        settings = self.config.dlq_settings()
        settings["error_cb"] = self._on_client_error
        settings["logger"] = self._client_log
        limit = self.limit
        if limit is not None and "batch.size" not in settings:
            # Copies batched together must fit the DLQ topic's limit as one batch too.
            settings["batch.size"] = min(limit, _LIBRDKAFKA_BATCH_SIZE)
        return Producer(settings)

    def _refused(
        self, message_id: str, size: int, topic: str, *, by_broker: bool, count: int = 1
    ) -> DeadLetterRefused:
        """A dead-letter copy refused as too large: counted, told, and the error to raise."""
        if by_broker:
            limit = "" if self.limit is None else f" of {self.limit} bytes"
            why = f"the broker refused it: over the max.message.bytes{limit} of topic {topic!r}"
        else:
            limit = self.config.dlq_settings()["message.max.bytes"]
            why = f"the DLQ producer refuses messages over its message.max.bytes of {limit} bytes"
        text = (
            f"cannot dead-letter {message_id}: its copy is {size} bytes (key, value and "
            f"headers) and {why}. Nothing was committed past it: the group fails on it until "
            f"the copy fits. Raise max.message.bytes on the DLQ topic {topic!r} and/or "
            f"message.max.bytes in dead_letter_client"
        )
        refused = self._step.refuse(
            text,
            settings=(
                f"max.message.bytes of topic {topic}",
                "dead_letter_client.message.max.bytes",
            ),
            count=count,
        )
        self.stats.dead_letter_refused = self._step.refused
        return refused

    def drop(self, items: Sequence[AdvanceItem[KafkaDelivery]]) -> None:
        """Rejected records committed past with no DLQ topic: told and counted."""
        for item in items:
            self._step.drop(
                item.broker_payload.message_id,
                outcome_reason(item.outcome),
                why="committed past, no dead_letter",
            )
        self.stats.dropped = self._step.dropped

    def close(self) -> list[str]:
        """Flush the copies not confirmed yet and let the client go: the problems."""
        problems: list[str] = []
        if self._client is not None:
            try:
                remaining = self._client.flush(self.config.dead_letter_flush_timeout)
                if remaining:
                    problems.append(f"{remaining} dead-letter copies were not confirmed")
            except Exception as exc:
                problems.append(f"DLQ producer flush failed: {exc!r}")
            self._client = None
        return problems
