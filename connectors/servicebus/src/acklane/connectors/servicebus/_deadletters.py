"""``acklane dlq`` on a Service Bus stream: the entity's ``$deadletterqueue`` sub-queue.

``list`` peeks it (``PeekMessages``, by sequence number): nothing is locked, no
count changes. ``redrive`` and ``purge`` receive in peek-lock mode: a letter is
held (locked) while the command works on it; a redrive sends a copy to the
stream's queue (or to the topic of its subscription: every subscription of the
topic whose rules take it gets it) and completes the letter only once the send
returned; what the command did not take is abandoned when it ends (its lock
dropped: it stays in the sub-queue).

The copy keeps the body, the application properties (one more
``acklane.redrive.count``), the session id, content type, correlation id and
subject; its ``MessageId`` is the original's with ``.redrive-N``: a copy sent again
after a crash is dropped by duplicate detection, where the entity has it on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, ClassVar

from acklane.core.connectors.deadletter import REDRIVE_COUNT
from acklane.core.connectors.dlq import (
    DeadLetter,
    DeadLetterReader,
    original_attributes,
    redrive_count,
)
from acklane.core.errors import ConnectorError

from ._check import told_plainly
from ._config import ServiceBusConfig
from ._message import _body, _text, identity_of
from ._opening import open_promptly

__all__ = ["ServiceBusDeadLetterReader"]

#: Seconds a receive waits for the next letter, at most.
WAIT = 1.0


class ServiceBusDeadLetterReader(DeadLetterReader):
    """The stream entity's dead-letter sub-queue (see the module)."""

    reading_cost: ClassVar[str] = (
        "Service Bus: list peeks the dead-letter sub-queue; nothing changes."
    )

    def __init__(self, config: ServiceBusConfig) -> None:
        self.config = config
        self._client: Any = None
        self._receiver: Any = None
        self._sender: Any = None
        self._held: dict[str, Any] = {}  # locked messages by letter id
        self._seen: set[str] = set()
        self._next_peek: int | None = None
        self._drained = False

    @property
    def destination(self) -> str:
        return f"servicebus {self.config.entity}/$deadletterqueue at {self.config.namespace}"

    @property
    def source(self) -> str:
        cfg = self.config
        kind, name = ("queue", cfg.queue) if cfg.queue else ("topic", cfg.topic)
        return f"servicebus {kind} {name} at {cfg.namespace}"

    def _open(self) -> Any:
        if self._receiver is not None:
            return self._receiver
        from azure.servicebus import ServiceBusReceiveMode, ServiceBusSubQueue

        cfg = self.config
        self._client = self._client or cfg.make_client()
        common: dict[str, Any] = {
            "sub_queue": ServiceBusSubQueue.DEAD_LETTER,
            "receive_mode": ServiceBusReceiveMode.PEEK_LOCK,
            "max_wait_time": WAIT,
        }
        if cfg.queue is not None:
            self._receiver = self._client.get_queue_receiver(queue_name=cfg.queue, **common)
        else:
            self._receiver = self._client.get_subscription_receiver(
                topic_name=cfg.topic, subscription_name=cfg.subscription, **common
            )
        open_promptly(self._receiver)  # as the producer's: no 50 ms pause per frame
        return self._receiver

    def _letter(self, message: Any) -> DeadLetter:
        properties = {_text(k): v for k, v in (message.application_properties or {}).items()}
        texts = {name: _text(value) for name, value in properties.items()}
        reason = _text(message.dead_letter_error_description or message.dead_letter_reason or "")
        return DeadLetter(
            id=str(message.sequence_number),
            origin_id=identity_of(self.config.namespace, self.config.entity, message),
            origin=self.config.entity,
            reason=reason,
            time=message.enqueued_time_utc,
            body=_body(message.body),
            key=message.session_id,
            attributes=original_attributes(texts),
            redrives=redrive_count(texts),
            handle=message,
        )

    async def browse(self, limit: int) -> list[DeadLetter]:
        receiver = self._open()
        with told_plainly():
            messages = await receiver.peek_messages(
                max_message_count=limit, sequence_number=self._next_peek or 0
            )
        out = []
        for message in messages:
            letter = self._letter(message)
            if letter.id in self._seen:
                continue
            self._seen.add(letter.id)
            self._next_peek = int(message.sequence_number) + 1
            out.append(letter)
        return out

    async def fetch(self, limit: int) -> list[DeadLetter]:
        if self._drained:
            return []
        receiver = self._open()
        with told_plainly():
            messages = await receiver.receive_messages(max_message_count=limit, max_wait_time=WAIT)
        if not messages:
            self._drained = True
        out: list[DeadLetter] = []
        for message in messages:
            letter = self._letter(message)
            if letter.id in self._seen:
                # its lock lapsed and it came again: handed out already, given back now
                with contextlib.suppress(Exception):
                    await receiver.abandon_message(message)
                continue
            self._seen.add(letter.id)
            self._held[letter.id] = message
            out.append(letter)
        return out

    async def copy_back(self, letters: Sequence[DeadLetter]) -> None:
        from azure.servicebus import ServiceBusMessage
        from azure.servicebus.exceptions import ServiceBusError

        cfg = self.config
        self._client = self._client or cfg.make_client()
        if self._sender is None:
            self._sender = (
                self._client.get_queue_sender(queue_name=cfg.queue)
                if cfg.queue is not None
                else self._client.get_topic_sender(topic_name=cfg.topic)
            )
        copies = []
        for letter in letters:
            original = letter.handle
            properties: dict[str | bytes, Any] = {
                _text(k): v
                for k, v in (original.application_properties or {}).items()
                if _text(k) != REDRIVE_COUNT
            }
            properties[REDRIVE_COUNT] = str(letter.redrives + 1)
            message_id = original.message_id
            copies.append(
                ServiceBusMessage(
                    letter.body,
                    application_properties=properties,
                    session_id=original.session_id,
                    content_type=original.content_type,
                    correlation_id=original.correlation_id,
                    subject=original.subject,
                    message_id=f"{message_id}.redrive-{letter.redrives + 1}"
                    if message_id
                    else None,
                )
            )
        try:
            await self._sender.send_messages(copies)
        except (ServiceBusError, ValueError) as exc:
            raise ConnectorError(
                f"{self.source}: {type(exc).__name__}: {exc}; nothing was removed from the "
                "dead-letter sub-queue"
            ) from exc

    async def remove(self, letters: Sequence[DeadLetter]) -> None:
        receiver = self._open()
        for letter in letters:
            await receiver.complete_message(self._held.get(letter.id, letter.handle))
            self._held.pop(letter.id, None)

    async def aclose(self) -> None:
        receiver, self._receiver = self._receiver, None
        sender, self._sender = self._sender, None
        client, self._client = self._client, None
        held = list(self._held.values())
        self._held.clear()
        if receiver is not None:
            for message in held:
                with contextlib.suppress(Exception):  # its lock lapses anyway
                    await receiver.abandon_message(message)
            with contextlib.suppress(Exception):
                await receiver.close()
        for closing in (sender, client):
            if closing is not None:
                with contextlib.suppress(Exception):
                    await closing.close()
