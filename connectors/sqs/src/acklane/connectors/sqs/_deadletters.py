"""``acklane dlq`` on an SQS stream: its dead-letter queue, received and released.

SQS cannot read a message without receiving it: every read makes the message
invisible for ``hold`` seconds and adds one to its ``ApproximateReceiveCount``
(a dead-letter queue with a redrive policy of its own would move it on after
``maxReceiveCount`` reads). What a command does not remove is made visible again
(``ChangeMessageVisibility`` 0) when it ends; killed, the messages come back
when ``hold`` runs out.

A redrive copies each chosen message to the stream's queue (``SendMessageBatch``:
the body, the original attributes, unpacked when the dead-letter step had packed
them, one more ``acklane.redrive.count``; on a FIFO queue the original's message
group, and the dead-letter copy's message id as deduplication id, so a copy sent
again within SQS's five minutes is dropped), and deletes it from the dead-letter
queue only once SQS took every copy of the batch.

SQS's own message move task (``StartMessageMoveTask``) is not used: it moves
every message of the queue (no choice by reason or id), and it moves them as they
are (acklane's origin and reason stay, no redrive count is added), so a message
rejected again would go round forever.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Sequence
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from typing import Any, ClassVar

from acklane.core.connectors.deadletter import (
    ORIGIN_MESSAGE_ID,
    ORIGIN_QUEUE,
    REDRIVE_COUNT,
    REJECT_REASON,
)
from acklane.core.connectors.dlq import (
    DeadLetter,
    DeadLetterReader,
    DeadLettersNotSupported,
    original_attributes,
    redrive_count,
)
from acklane.core.errors import ConnectorError, ReceiveError

from ._config import SqsConfig
from ._entries import PACKED_ATTRIBUTES, SYSTEM_ATTRIBUTES, chunks, run_batch

__all__ = ["SqsDeadLetterReader"]

#: Seconds a message read stays invisible, at most (released when the command ends).
HOLD = 300


def _value(attribute: dict[str, Any]) -> str:
    if "StringValue" in attribute:
        return str(attribute["StringValue"])
    if "BinaryValue" in attribute:
        return base64.b64encode(bytes(attribute["BinaryValue"])).decode("ascii")
    return ""


def _originals(attributes: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The original's message attributes, as SendMessage takes them."""
    packed = attributes.get(PACKED_ATTRIBUTES)
    if packed is not None:
        out: dict[str, dict[str, Any]] = {}
        for name, value in json.loads(_value(packed)).items():
            if "BinaryValue" in value:
                out[name] = {
                    "DataType": value["DataType"],
                    "BinaryValue": base64.b64decode(value["BinaryValue"]),
                }
            else:
                out[name] = {"DataType": value["DataType"], "StringValue": value["StringValue"]}
        return out
    kept = original_attributes({name: "" for name in attributes})
    out = {}
    for name in kept:
        if name in (PACKED_ATTRIBUTES, REDRIVE_COUNT):
            continue
        value = attributes[name]
        entry: dict[str, Any] = {"DataType": value["DataType"]}
        if "BinaryValue" in value:
            entry["BinaryValue"] = value["BinaryValue"]
        else:
            entry["StringValue"] = value.get("StringValue", "")
        out[name] = entry
    return out


class SqsDeadLetterReader(DeadLetterReader):
    """The stream's dead-letter queue (``dead_letter``, else its redrive target)."""

    reading_cost: ClassVar[str] = (
        "SQS: every message read is received (invisible while the command runs, released "
        "after) and its ApproximateReceiveCount goes up by one."
    )

    def __init__(self, config: SqsConfig, *, hold: int = HOLD) -> None:
        self.config = config
        self.hold = hold
        self._stack = AsyncExitStack()
        self._client: Any = None
        self.queue_url: str | None = config.queue_url
        self.dead_letter_url: str | None = config.dead_letter
        self._fifo = False
        #: Receipt handles of the messages read and not removed, by message id.
        self._held: dict[str, str] = {}
        self._seen: set[str] = set()
        self._drained = False

    @property
    def destination(self) -> str:
        return f"sqs queue {self.dead_letter_url or '(the redrive target of the queue)'}"

    @property
    def source(self) -> str:
        return f"sqs queue {self.queue_url or self.config.queue_ref}"

    async def _connect(self) -> Any:
        if self._client is not None:
            return self._client
        from ._queue import _Reader, open_client

        client = await open_client(None, self.config, self._stack, error=ReceiveError)
        reader = _Reader(client, self.config, ReceiveError)
        attributes = await reader.locate()
        self.queue_url = reader.url
        self._fifo = attributes.get("FifoQueue") == "true" or reader.url.endswith(".fifo")
        if self.dead_letter_url is None:
            self.dead_letter_url = await reader.redrive_target(attributes.get("RedrivePolicy"))
        if self.dead_letter_url is None:
            raise DeadLettersNotSupported(
                f"{self.config.describe()}: the stream has no dead-letter queue (no "
                "dead_letter, no RedrivePolicy); its rejects are dropped"
            )
        self._client = client
        return client

    def _letter(self, message: dict[str, Any]) -> DeadLetter:
        attributes = dict(message.get("MessageAttributes") or {})
        system = message.get("Attributes") or {}
        originals = _originals(attributes)
        sent = system.get("SentTimestamp")
        when = datetime.fromtimestamp(int(sent) / 1000, UTC) if sent else None
        message_id = str(message["MessageId"])
        named = {name: _value(value) for name, value in attributes.items()}
        counted = {name: _value(value) for name, value in originals.items()}
        counted.setdefault(REDRIVE_COUNT, named.get(REDRIVE_COUNT, "0"))
        return DeadLetter(
            id=message_id,
            origin_id=named.get(ORIGIN_MESSAGE_ID, ""),
            origin=named.get(ORIGIN_QUEUE, ""),
            reason=named.get(REJECT_REASON, ""),
            time=when,
            body=str(message["Body"]).encode("utf-8"),
            key=system.get("MessageGroupId"),
            attributes={
                name: _value(value) for name, value in originals.items() if name != REDRIVE_COUNT
            },
            redrives=redrive_count(counted),
            handle=(str(message["ReceiptHandle"]), originals),
        )

    async def fetch(self, limit: int) -> list[DeadLetter]:
        client = await self._connect()
        out: list[DeadLetter] = []
        if self._drained:
            return out
        waited = False
        while len(out) < limit:
            response = await client.receive_message(
                QueueUrl=self.dead_letter_url,
                MaxNumberOfMessages=min(10, limit - len(out)),
                # short polls while messages come; one long poll (which asks every
                # server) before calling the queue empty
                WaitTimeSeconds=1 if waited else 0,
                VisibilityTimeout=self.hold,
                MessageAttributeNames=["All"],
                AttributeNames=SYSTEM_ATTRIBUTES,
            )
            messages = response.get("Messages") or []
            if not messages:
                if waited:
                    self._drained = True
                    break
                waited = True
                continue
            waited = False
            for message in messages:
                letter = self._letter(message)
                self._held[letter.id] = letter.handle[0]
                if letter.id in self._seen:
                    continue
                self._seen.add(letter.id)
                out.append(letter)
        return out

    async def copy_back(self, letters: Sequence[DeadLetter]) -> None:
        client = await self._connect()
        entries = []
        for index, letter in enumerate(letters):
            attributes = dict(letter.handle[1])
            attributes[REDRIVE_COUNT] = {
                "DataType": "String",
                "StringValue": str(letter.redrives + 1),
            }
            entry: dict[str, Any] = {
                "Id": str(index),
                "MessageBody": letter.body.decode("utf-8"),
                "MessageAttributes": attributes,
            }
            if self._fifo:
                key = letter.key
                entry["MessageGroupId"] = (
                    key.decode() if isinstance(key, bytes) else key
                ) or "acklane-redrive"
                entry["MessageDeduplicationId"] = letter.id
            entries.append(entry)

        async def send(chunk: Sequence[dict[str, Any]]) -> dict[str, Any]:
            return await run_batch(
                client, "send_message_batch", self.queue_url, list(chunk), self.config.entry_retries
            )

        if self._fifo:  # in order: a FIFO group keeps the order of its sends
            results = [await send(chunk) for chunk in chunks(entries)]
        else:
            results = await asyncio.gather(*(send(chunk) for chunk in chunks(entries)))
        failed = {k: v for result in results for k, v in result.items()}
        if failed:
            first = next(iter(failed.values()))
            raise ConnectorError(
                f"{self.source}: {len(failed)} copy(ies) refused, the first: "
                f"{first.get('Code')}: {first.get('Message')}; nothing of the batch was "
                "deleted from the dead-letter queue"
            )

    async def remove(self, letters: Sequence[DeadLetter]) -> None:
        client = await self._connect()
        entries = [
            {"Id": str(i), "ReceiptHandle": self._held.get(letter.id, letter.handle[0])}
            for i, letter in enumerate(letters)
        ]

        async def delete(chunk: Sequence[dict[str, Any]]) -> dict[str, Any]:
            return await run_batch(
                client,
                "delete_message_batch",
                self.dead_letter_url,
                list(chunk),
                self.config.entry_retries,
            )

        for failed in await asyncio.gather(*(delete(chunk) for chunk in chunks(entries))):
            if failed:
                first = next(iter(failed.values()))
                raise ConnectorError(
                    f"{self.destination}: {len(failed)} message(s) not deleted, the first: "
                    f"{first.get('Code')}: {first.get('Message')} (their copies were sent: "
                    "a later redrive sends them again)"
                )
        for letter in letters:
            self._held.pop(letter.id, None)

    async def aclose(self) -> None:
        client, held = self._client, list(self._held.values())
        self._held.clear()
        try:
            if client is not None and held:
                entries = [
                    {"Id": str(i), "ReceiptHandle": handle, "VisibilityTimeout": 0}
                    for i, handle in enumerate(held)
                ]
                for chunk in chunks(entries):
                    with contextlib.suppress(Exception):  # they come back after `hold` anyway
                        await client.change_message_visibility_batch(
                            QueueUrl=self.dead_letter_url, Entries=list(chunk)
                        )
        finally:
            self._client = None
            await self._stack.aclose()
