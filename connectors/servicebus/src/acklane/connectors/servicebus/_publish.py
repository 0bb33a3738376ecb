"""``acklane publish`` to a Service Bus stream: azure-servicebus's sender, in message batches."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, ClassVar

from acklane.core.connectors import OutgoingMessage, Publisher, PublishError

from ._check import NOT_SERVICE_BUS, speaks_another_protocol
from ._config import ServiceBusConfig

__all__ = ["ServiceBusPublisher"]


class ServiceBusPublisher(Publisher):
    """Sends to the stream's queue, or to the topic of its subscription.

    Attributes become application properties; the key is the session id, so only a
    session-enabled stream (``sessions: true``) takes one. A ``dedupe_id`` is the
    message's ``MessageId``, what duplicate detection compares.
    """

    max_batch: ClassVar[int] = 200

    def __init__(self, config: ServiceBusConfig) -> None:
        self.config = config
        self._client: Any = None
        self._sender: Any = None

    @property
    def destination(self) -> str:
        cfg = self.config
        kind, name = ("queue", cfg.queue) if cfg.queue else ("topic", cfg.topic)
        return f"servicebus {kind} {name} at {cfg.namespace}"

    def _message(self, message: OutgoingMessage) -> Any:
        from azure.servicebus import ServiceBusMessage

        if message.key is not None and not self.config.sessions:
            raise PublishError(
                f"{self.destination}: a key is the session id, and this stream is not "
                "session-enabled (sessions: false); drop --key"
            )
        properties: dict[str | bytes, Any] = {k: v for k, v in message.attributes.items()}
        return ServiceBusMessage(
            message.body,
            application_properties=properties or None,
            session_id=message.key,
            message_id=message.dedupe_id,
        )

    async def send(self, messages: Sequence[OutgoingMessage]) -> None:
        from azure.servicebus.exceptions import MessageSizeExceededError, ServiceBusError

        if self._sender is None:
            self._client = self.config.make_client()
            if self.config.queue is not None:
                self._sender = self._client.get_queue_sender(queue_name=self.config.queue)
            else:
                self._sender = self._client.get_topic_sender(topic_name=self.config.topic)
        sender = self._sender
        try:
            batch = await sender.create_message_batch()
            for message in messages:
                item = self._message(message)
                try:
                    batch.add_message(item)
                except MessageSizeExceededError:
                    if len(batch) == 0:
                        raise
                    await sender.send_messages(batch)
                    batch = await sender.create_message_batch()
                    batch.add_message(item)
            if len(batch):
                await sender.send_messages(batch)
        except (ServiceBusError, ValueError) as exc:
            if speaks_another_protocol(exc):  # the SDK's words would name neither
                raise PublishError(f"{self.destination}: {NOT_SERVICE_BUS}") from exc
            raise PublishError(f"{self.destination}: {type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        sender, self._sender = self._sender, None
        client, self._client = self._client, None
        if sender is not None:
            with contextlib.suppress(Exception):
                await sender.close()
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
