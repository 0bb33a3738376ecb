"""A trigger class for Pub/Sub watchers written in Python."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from acklane.core.connectors import ConnectorTrigger
from acklane.core.message import BodyDecodeError
from acklane.core.trigger import TriggerEvent

from ._config import PubSubConfig
from ._connector import PubSubConnector
from ._message import PubSubMessage

__all__ = ["PubSubMessageTrigger"]


class PubSubMessageTrigger(ConnectorTrigger[PubSubConfig]):
    """A watcher of one Pub/Sub subscription; subclass it to write a filter in Python.

    Construct it with the :class:`PubSubConfig` fields (``project=...``,
    ``subscription=...``) plus any of your own; the configuration is validated at
    once. Watchers of the same subscription (and endpoint) share one poll.
    Override :meth:`accepts` and :meth:`event_payload`, or
    :meth:`filter_shared_stream` itself; call ``reject_shared_stream_event(reason)``
    to dead-letter the current message.
    """

    connector_class = PubSubConnector

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for message in stream:
            if self.accepts(message):
                yield TriggerEvent(self.event_payload(message))

    def accepts(self, message: PubSubMessage) -> bool:
        """Whether this message fires the watcher (default: every message)."""
        return True

    def event_payload(self, message: PubSubMessage) -> dict[str, Any]:
        """The payload of the trigger event a message produces (JSON-serialisable)."""
        payload: dict[str, Any] = {
            "message_id": message.message_id,
            "subscription": message.subscription,
            "attributes": dict(message.attributes),
            "ordering_key": message.ordering_key,
            "delivery_attempt": message.delivery_attempt,
            "published_at": message.publish_time.isoformat() if message.publish_time else None,
        }
        try:
            payload["body"] = message.text()
        except BodyDecodeError:
            payload["body_hex"] = message.body.hex()
        return payload
