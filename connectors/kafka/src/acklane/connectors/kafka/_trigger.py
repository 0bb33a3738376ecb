"""The trigger class for users who write their filters in Python."""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable
from typing import Any

from acklane.core.producer import SharedStreamProducer
from acklane.core.trigger import BaseEventTrigger, TriggerEvent

from ._config import KafkaConfig
from ._message import KafkaMessage
from ._producer import KafkaStreamProducer

__all__ = ["KafkaMessageTrigger", "config_from_kwargs"]


def config_from_kwargs(kwargs: dict[str, Any]) -> KafkaConfig:
    """The :class:`KafkaConfig` in a trigger's kwargs (a subclass's own fields are ignored)."""
    fields = KafkaConfig.model_fields
    return KafkaConfig.model_validate({k: v for k, v in kwargs.items() if k in fields})


class KafkaMessageTrigger(BaseEventTrigger):
    """Watches Kafka topics through a shared consumer group; subclass it to filter.

    Takes the fields of :class:`KafkaConfig` as keyword arguments and validates
    them at once. Triggers with the same servers, topics and group share one
    consumer. Override :meth:`filter_shared_stream` to decide, per
    :class:`KafkaMessage`, what to yield (or call ``reject_shared_stream_event``);
    the default yields one event per record.
    """

    def __init__(self, **kwargs: Any) -> None:
        KafkaConfig.model_validate(kwargs)  # refuse a bad config before anything starts
        super().__init__(**kwargs)

    def kafka_config(self) -> KafkaConfig:
        """This trigger's validated configuration."""
        config: KafkaConfig | None = getattr(self, "_kafka_config", None)
        if config is None:
            config = config_from_kwargs(vars(self))
            self._kafka_config = config
        return config

    def shared_stream_key(self) -> Hashable | None:
        return self.kafka_config().stream_key()

    def shared_stream_settings(self) -> KafkaConfig:
        """The whole configuration: triggers of one key must agree on all of it."""
        return self.kafka_config()

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        return KafkaStreamProducer(config_from_kwargs(kwargs))

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
