"""``acklane publish`` to a Kafka stream: confluent-kafka's producer, with the stream's settings."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, ClassVar

from acklane.core.connectors import (
    OutgoingMessage,
    Publisher,
    PublishError,
    PublishNotSupported,
)

from ._config import KafkaConfig
from ._health import QuietClientLog

__all__ = ["KafkaPublisher"]

#: librdkafka's failure lines at DEBUG: ``error_cb`` reports each failure, and the
#: publisher tells the outcome in one line (a broker that does not answer made a
#: line every 50 ms until the records timed out).
_client_log = QuietClientLog(logging.getLogger("acklane.connectors.kafka.librdkafka"))

#: librdkafka errors after which waiting longer cannot help.
_FATAL_CODES = ("_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED", "TOPIC_AUTHORIZATION_FAILED")

#: librdkafka errors that say a broker did not answer (it retries on its own).
_UNREACHABLE_CODES = ("_TRANSPORT", "_RESOLVE", "_TIMED_OUT", "_ALL_BROKERS_DOWN")


def publish_topic(config: KafkaConfig, destination: str | None) -> str:
    """The topic to publish to: ``destination``, else the stream's only named topic."""
    if destination is not None:
        return destination
    named = [t for t in config.topics if not t.startswith("^")]
    if len(config.topics) == 1 and named:
        return named[0]
    raise PublishError(
        f"the stream reads {len(config.topics)} topic(s) ({', '.join(config.topics)}): "
        "name the one to publish to (--topic)"
    )


class KafkaPublisher(Publisher):
    """Produces to one topic and waits for the broker's acknowledgement of each record.

    The producer gets the stream's servers, security fields and the ``client``
    properties a producer understands (those of the dead-letter producer,
    ``dead_letter_client`` included); a record not confirmed within
    ``dead_letter_flush_timeout`` seconds fails the batch.
    """

    max_batch: ClassVar[int] = 1000

    def __init__(self, config: KafkaConfig, topic: str) -> None:
        self.config = config
        self.topic = topic
        self._producer: Any = None
        self._fatal: str | None = None
        #: Why a broker did not answer (librdkafka's words, which name it), if one did not.
        self._unreachable: str | None = None
        # value_format/key_format framed for a Schema Registry: the schemas to encode with
        self._schemas: tuple[str | None, str | None] = (None, None)
        self._encoder: Any = None

    def encode_with(self, value_schema: str | None, key_schema: str | None) -> None:
        if not self.config.decodes():
            raise PublishNotSupported(
                f"{self.destination}: the stream's value_format is {self.config.value_format} "
                f"and its key_format {self.config.key_format}: no schema to encode with"
            )
        self._schemas = (value_schema, key_schema)

    @property
    def destination(self) -> str:
        return f"kafka topic {self.topic} at {self.config.bootstrap_servers}"

    def _on_error(self, error: Any) -> None:
        if error.fatal() or error.name() in _FATAL_CODES:
            self._fatal = f"{error.name()}: {error.str()}"
        elif error.name() in _UNREACHABLE_CODES and error.name() != "_ALL_BROKERS_DOWN":
            self._unreachable = error.str()  # the last broker's failure, which names it
        elif error.name() == "_ALL_BROKERS_DOWN" and self._unreachable is None:
            self._unreachable = error.str()

    def _not_confirmed(self, count: int) -> PublishError:
        """The error for ``count`` records the broker did not confirm in time: the
        broker that did not answer, when one did not."""
        waited = f"{self.config.dead_letter_flush_timeout:g}s (dead_letter_flush_timeout)"
        if self._unreachable is not None:
            return PublishError(
                f"{self.destination}: broker unreachable ({self._unreachable}); "
                f"{count} record(s) not confirmed within {waited}"
            )
        return PublishError(
            f"{self.destination}: {count} record(s) not confirmed within {waited}; "
            "is the broker up?"
        )

    def _make_producer(self) -> Any:
        from confluent_kafka import Producer

        timeout_ms = int(self.config.dead_letter_flush_timeout * 1000)
        settings: dict[str, Any] = {
            **self.config.dlq_settings(),
            "message.timeout.ms": timeout_ms,
            "error_cb": self._on_error,
            "logger": _client_log,
        }
        return Producer(settings)

    def _send(self, messages: Sequence[OutgoingMessage]) -> None:
        if self._producer is None:
            self._producer = self._make_producer()
        producer = self._producer
        failures: list[str] = []
        timed_out = 0

        def delivered(error: Any, _record: Any) -> None:
            nonlocal timed_out
            if error is None:
                self._unreachable = None  # the broker answers (again)
                return
            if error.name() == "_MSG_TIMED_OUT":
                timed_out += 1
            failures.append(f"{error.name()}: {error.str()}")

        if self._encoder is None and self.config.decodes():
            from ._formats import Encoder

            try:
                self._encoder = Encoder(self.config, *self._schemas)
            except Exception as exc:
                raise PublishError(f"{self.destination}: {exc}") from exc
        encoder = self._encoder
        for number, message in enumerate(messages, 1):
            headers = [(k, v.encode()) for k, v in message.attributes.items()] or None
            value: bytes = message.body
            key: bytes | str | None = message.key
            if encoder is not None:
                try:
                    value, key = encoder.encode(self.topic, value, key, headers)
                except Exception as exc:
                    raise PublishError(
                        f"{self.destination}: message {number} could not be encoded "
                        f"({self.config.value_format}): {exc}"
                    ) from exc
            while True:
                try:
                    producer.produce(
                        self.topic,
                        value=value,
                        key=key,
                        headers=headers,
                        on_delivery=delivered,
                    )
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.1)
            producer.poll(0)
        remaining = producer.flush(self.config.dead_letter_flush_timeout + 5)
        if self._fatal is not None:
            raise PublishError(f"{self.destination}: {self._fatal}")
        if failures and timed_out < len(failures):
            raise PublishError(
                f"{self.destination}: {len(failures)} record(s) refused, the first: {failures[0]}"
            )
        if failures or remaining:
            raise self._not_confirmed(len(failures) + remaining)

    async def send(self, messages: Sequence[OutgoingMessage]) -> None:
        await asyncio.to_thread(self._send, messages)

    async def aclose(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await asyncio.to_thread(producer.flush, 5)
