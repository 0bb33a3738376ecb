"""``acklane publish`` to a Pub/Sub stream: ``Publish`` to the topic of its subscription."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, ClassVar

from acklane.core.connectors import OutgoingMessage, Publisher, PublishError

from ._client import make_client
from ._config import PubSubConfig

__all__ = ["PubSubPublisher"]

#: Pub/Sub's most messages per ``Publish`` request, and a margin under its 10 MB.
_MAX_MESSAGES = 1000
_MAX_BYTES = 8_000_000


class PubSubPublisher(Publisher):
    """Publishes to ``destination`` (a topic name in the stream's project, or a path),
    else to the topic the stream's subscription is attached to (read with
    ``GetSubscription``). The key becomes the ordering key, attributes attributes.
    """

    max_batch: ClassVar[int] = 500

    def __init__(self, config: PubSubConfig, destination: str | None = None) -> None:
        self.config = config
        self.topic: str | None = None
        if destination is not None:
            self.topic = (
                destination
                if destination.startswith("projects/")
                else f"projects/{config.project_id}/topics/{destination}"
            )
        self._client: Any = None

    @property
    def destination(self) -> str:
        topic = self.topic or f"the topic of {self.config.subscription_path}"
        where = f" at {self.config.where}" if self.config.where else ""
        return f"pubsub topic {topic}{where}"

    async def _topic(self) -> str:
        if self.topic is not None:
            return self.topic
        subscriber = make_client(self.config, "subscriber")
        try:
            subscription = await subscriber.get_subscription(
                subscription=self.config.subscription_path, timeout=30
            )
        except Exception as exc:
            raise PublishError(
                f"Pub/Sub subscription {self.config.subscription_path}: cannot read its topic "
                f"({type(exc).__name__}: {exc}); name the topic with --topic"
            ) from exc
        finally:
            with contextlib.suppress(Exception):
                await subscriber.transport.close()
        self.topic = str(subscription.topic)
        return self.topic

    async def send(self, messages: Sequence[OutgoingMessage]) -> None:
        from google.pubsub_v1 import types

        topic = await self._topic()
        if self._client is None:
            self._client = make_client(self.config, "publisher")
        batch: list[Any] = []
        size = 0
        for message in messages:
            if batch and (len(batch) >= _MAX_MESSAGES or size + len(message.body) > _MAX_BYTES):
                await self._publish(topic, batch)
                batch, size = [], 0
            batch.append(
                types.PubsubMessage(
                    data=message.body,
                    attributes=dict(message.attributes),
                    ordering_key=message.key or "",
                )
            )
            size += len(message.body)
        if batch:
            await self._publish(topic, batch)

    async def _publish(self, topic: str, batch: list[Any]) -> None:
        try:
            await self._client.publish(topic=topic, messages=batch, timeout=60)
        except Exception as exc:
            raise PublishError(f"pubsub topic {topic}: {type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.transport.close()
