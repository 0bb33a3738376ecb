"""``acklane publish`` to an SQS stream: ``SendMessageBatch`` (aioboto3), the stream's settings."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any, ClassVar

from pydantic import SecretStr

from acklane.core.connectors import OutgoingMessage, Publisher, PublishError

from ._config import SqsConfig

__all__ = ["SqsPublisher"]

#: SQS's most entries per ``SendMessageBatch``.
_BATCH = 10
#: The FIFO message group of messages published without a key.
DEFAULT_GROUP = "acklane-publish"


def _reveal(value: SecretStr | None) -> str | None:
    return None if value is None else value.get_secret_value()


class SqsPublisher(Publisher):
    """Sends to the stream's queue (its URL, or the URL of ``queue_name``).

    The body must be text (SQS bodies are). A FIFO queue's messages get the key as
    their MessageGroupId (``acklane-publish`` without one) and their ``dedupe_id`` as
    MessageDeduplicationId (a fresh one without it); a standard queue takes no key
    and has no deduplication id.
    """

    max_batch: ClassVar[int] = 100

    def __init__(self, config: SqsConfig) -> None:
        self.config = config
        self._stack = AsyncExitStack()
        self._client: Any = None
        self.queue_url: str | None = config.queue_url

    @property
    def destination(self) -> str:
        return f"sqs queue {self.queue_url or self.config.queue_ref}"

    async def _connect(self) -> Any:
        import aioboto3
        from botocore.exceptions import BotoCoreError, ClientError

        cfg = self.config
        if self._client is None:
            session = aioboto3.Session(
                profile_name=cfg.profile,
                aws_access_key_id=_reveal(cfg.aws_access_key_id),
                aws_secret_access_key=_reveal(cfg.aws_secret_access_key),
                aws_session_token=_reveal(cfg.aws_session_token),
                region_name=cfg.region,
            )
            self._client = await self._stack.enter_async_context(
                session.client("sqs", region_name=cfg.region, endpoint_url=cfg.endpoint_url)
            )
        # looked up again after a failure (the queue created since, the endpoint back):
        # a long-lived publisher (a broker sink) must not keep a missing URL
        if self.queue_url is None:
            kwargs: dict[str, Any] = {"QueueName": cfg.queue_name}
            if cfg.account_id:
                kwargs["QueueOwnerAWSAccountId"] = cfg.account_id
            try:
                response = await self._client.get_queue_url(**kwargs)
            except (ClientError, BotoCoreError) as exc:
                raise PublishError(f"{cfg.describe()}: the queue was not found: {exc}") from exc
            self.queue_url = str(response["QueueUrl"])
        return self._client

    def _entries(self, messages: Sequence[OutgoingMessage]) -> list[dict[str, Any]]:
        fifo = (self.queue_url or self.config.queue_ref).endswith(".fifo")
        entries = []
        for i, message in enumerate(messages):
            try:
                body = message.body.decode("utf-8")
            except UnicodeDecodeError:
                raise PublishError(
                    f"{self.destination}: message {i + 1} of the batch is not UTF-8 text "
                    "(SQS bodies are text)"
                ) from None
            entry: dict[str, Any] = {"Id": str(i), "MessageBody": body}
            if message.attributes:
                entry["MessageAttributes"] = {
                    name: {"DataType": "String", "StringValue": value}
                    for name, value in message.attributes.items()
                }
            if fifo:
                entry["MessageGroupId"] = message.key or DEFAULT_GROUP
                entry["MessageDeduplicationId"] = message.dedupe_id or uuid.uuid4().hex
            elif message.key is not None:
                raise PublishError(
                    f"{self.destination}: a key is a FIFO queue's MessageGroupId; this queue "
                    "is not FIFO (drop --key)"
                )
            entries.append(entry)
        return entries

    async def _send_chunk(self, client: Any, entries: list[dict[str, Any]]) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = await client.send_message_batch(QueueUrl=self.queue_url, Entries=entries)
        except (ClientError, BotoCoreError) as exc:
            raise PublishError(f"{self.destination}: {exc}") from exc
        failed = response.get("Failed") or []
        if failed:
            first = failed[0]
            raise PublishError(
                f"{self.destination}: {len(failed)} message(s) refused, the first: "
                f"{first.get('Code')}: {first.get('Message')}"
            )

    async def send(self, messages: Sequence[OutgoingMessage]) -> None:
        client = await self._connect()
        entries = self._entries(messages)
        chunks = [entries[i : i + _BATCH] for i in range(0, len(entries), _BATCH)]
        if (self.queue_url or "").endswith(".fifo"):
            for chunk in chunks:  # in order: a FIFO group keeps the order of its sends
                await self._send_chunk(client, chunk)
        else:
            await asyncio.gather(*(self._send_chunk(client, c) for c in chunks))

    async def aclose(self) -> None:
        self._client = None
        await self._stack.aclose()
