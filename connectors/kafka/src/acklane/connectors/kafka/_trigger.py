"""The trigger class for users who write their filters in Python."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from acklane.core.connectors import ConnectorTrigger
from acklane.core.trigger import TriggerEvent

from ._config import KafkaConfig
from ._connector import KafkaConnector
from ._message import KafkaMessage

__all__ = ["KafkaMessageTrigger"]


class KafkaMessageTrigger(ConnectorTrigger[KafkaConfig]):
    """Watches Kafka topics through a shared consumer group; subclass it to filter.

    Takes the fields of :class:`KafkaConfig` as keyword arguments (with any of a
    subclass's own) and validates them at once. Triggers with the same servers,
    topics and group share one consumer. Override :meth:`filter_shared_stream` to
    decide, per :class:`KafkaMessage`, what to yield (or call
    ``reject_shared_stream_event``); the default yields one event per record.
    """

    connector_class = KafkaConnector

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for message in stream:
            yield TriggerEvent(self.event_payload(message))

    def event_payload(self, message: KafkaMessage) -> dict[str, Any]:
        """The default trigger event of a record: where it came from, its key and its text."""
        return {
            "message_id": message.message_id,
            "topic": message.topic,
            "partition": message.partition,
            "offset": message.offset,
            "key": message.key,
            "value": message.body.decode("utf-8", errors="replace"),
        }
