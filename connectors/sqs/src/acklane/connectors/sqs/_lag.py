"""The backlog of an SQS stream: the queue's approximate counts.

One aioboto3 client of its own reads ``GetQueueAttributes`` (``sqs:GetQueueAttributes``,
nothing received, nothing changed) for
``ApproximateNumberOfMessages`` (visible: what the stream could receive now, its
``lag``), ``ApproximateNumberOfMessagesNotVisible`` (in flight: received and not yet
deleted, by this process or another) and ``ApproximateNumberOfMessagesDelayed``
(delayed: sent with a delay, or back off after a redelivery backoff). SQS says the
counts are approximate (eventually consistent, about a minute behind at worst).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

from acklane.core.errors import ReceiveError
from acklane.core.observe.lag import Backlog, BacklogProbe

from ._config import SqsConfig
from ._queue import open_client

__all__ = ["SqsBacklogProbe"]

_STATES = (
    ("visible", "ApproximateNumberOfMessages"),
    ("in_flight", "ApproximateNumberOfMessagesNotVisible"),
    ("delayed", "ApproximateNumberOfMessagesDelayed"),
)


class SqsBacklogProbe(BacklogProbe):
    """``Connector.backlog_probe`` of an SQS stream (see the module's docstring)."""

    broker = "sqs"

    def __init__(self, config: SqsConfig) -> None:
        self.config = config
        self._stack = AsyncExitStack()
        self._client: Any = None
        self._url: str | None = config.queue_url

    async def read(self) -> Sequence[Backlog]:
        cfg = self.config
        if self._client is None:
            self._client = await open_client(None, cfg, self._stack, error=ReceiveError)
        if self._url is None:
            kwargs: dict[str, Any] = {"QueueName": cfg.queue_name}
            if cfg.account_id:
                kwargs["QueueOwnerAWSAccountId"] = cfg.account_id
            self._url = str((await self._client.get_queue_url(**kwargs))["QueueUrl"])
        response = await self._client.get_queue_attributes(
            QueueUrl=self._url, AttributeNames=[name for _, name in _STATES]
        )
        attributes = response.get("Attributes", {})
        states = tuple((state, float(attributes.get(name, 0))) for state, name in _STATES)
        name = self._url.rstrip("/").rsplit("/", 1)[-1]
        return [Backlog(name, states[0][1], states)]

    async def aclose(self) -> None:
        self._client = None
        await self._stack.aclose()
