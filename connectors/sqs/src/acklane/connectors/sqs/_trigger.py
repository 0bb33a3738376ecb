"""A trigger class for SQS watchers written in Python."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from acklane.core.connectors import ConnectorTrigger
from acklane.core.message import BodyDecodeError
from acklane.core.trigger import TriggerEvent

from ._config import SqsConfig
from ._connector import SqsConnector
from ._message import SqsMessage

__all__ = ["SqsMessageTrigger"]


class SqsMessageTrigger(ConnectorTrigger[SqsConfig]):
    """A watcher of one SQS queue; subclass it to write a filter in Python.

    Construct it with the :class:`SqsConfig` fields (``queue_url=...``,
    ``endpoint_url=...``) plus any of your own; the configuration is validated at
    once. Watchers with the same queue, region and endpoint share one poll.
    Override :meth:`accepts` and :meth:`event_payload`, or
    :meth:`filter_shared_stream` itself; call ``reject_shared_stream_event(reason)``
    to dead-letter the current message.
    """

    connector_class = SqsConnector

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for message in stream:
            if self.accepts(message):
                yield TriggerEvent(self.event_payload(message))

    def accepts(self, message: SqsMessage) -> bool:
        """Whether this message fires the watcher (default: every message)."""
        return True

    def event_payload(self, message: SqsMessage) -> dict[str, Any]:
        """The payload of the trigger event a message produces (JSON-serialisable)."""
        payload: dict[str, Any] = {
            "message_id": message.message_id,
            "queue_url": message.queue_url,
            "attributes": dict(message.attributes),
            "group_id": message.group_id,
            "receive_count": message.receive_count,
            "sent_at": message.publish_time.isoformat() if message.publish_time else None,
        }
        try:
            payload["body"] = message.text()
        except BodyDecodeError:
            payload["body_hex"] = message.body.hex()
        return payload
