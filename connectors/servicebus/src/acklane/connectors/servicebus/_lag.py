"""The backlog of a Service Bus stream, counted by peeking (AMQP, nothing settled).

Service Bus tells an entity's counts (active, scheduled, dead-lettered, transferring)
only through its management API over HTTPS (``ServiceBusAdministrationClient``'s
runtime properties, which need the *Manage* right): acklane's emulator speaks AMQP
only, and Microsoft's emulator serves no such API either, so no test could prove
that path; it is not used. What AMQP offers every stream's credentials (*Listen*) is
peeking: the probe peeks the entity and its dead-letter sub-queue in pages of
:data:`PAGE` from the first sequence number, up to :data:`LIMIT` messages each, and
counts what it saw:

- ``lag`` (state ``messages``): the messages in the entity, active, locked (in
  flight), deferred and scheduled alike (peeking cannot tell them apart), counted
  up to :data:`LIMIT` (a larger backlog reads as :data:`LIMIT`);
- state ``dead_letter``: the dead-letter sub-queue's messages, up to :data:`LIMIT`.

Peeking reads the messages' bodies: on a deep entity each read costs up to
:data:`LIMIT` message transfers, every ``engine.lag_interval`` seconds. A
session-enabled entity cannot be peeked without naming a session: it has no probe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from acklane.core.errors import ReceiveError
from acklane.core.observe.lag import Backlog, BacklogProbe

from ._check import NOT_SERVICE_BUS, speaks_another_protocol
from ._config import ServiceBusConfig

__all__ = ["LIMIT", "PAGE", "ServiceBusBacklogProbe"]

#: Messages peeked per call.
PAGE: Final = 250
#: Messages counted at most, per entity and per dead-letter sub-queue.
LIMIT: Final = 1000


class ServiceBusBacklogProbe(BacklogProbe):
    """``Connector.backlog_probe`` of a Service Bus stream (see the module's docstring)."""

    broker = "servicebus"

    def __init__(self, config: ServiceBusConfig) -> None:
        self.config = config
        self._client: Any = None

    async def read(self) -> Sequence[Backlog]:
        if self._client is None:
            self._client = self.config.make_client()
        try:
            messages = await self._count(None)
            dead = await self._count("deadletter")
        except Exception as exc:
            if speaks_another_protocol(exc):  # the SDK's words would name neither
                raise ReceiveError(f"Service Bus {self.config.entity}: {NOT_SERVICE_BUS}") from exc
            raise
        states = (("messages", float(messages)), ("dead_letter", float(dead)))
        return [Backlog(self.config.entity, float(messages), states)]

    async def _count(self, sub_queue: str | None) -> int:
        cfg = self.config
        if cfg.queue is not None:
            receiver = self._client.get_queue_receiver(cfg.queue, sub_queue=sub_queue)
        else:
            receiver = self._client.get_subscription_receiver(
                cfg.topic, cfg.subscription, sub_queue=sub_queue
            )
        seen = 0
        async with receiver:
            after: int | None = None
            while seen < LIMIT:
                kwargs = {} if after is None else {"sequence_number": after + 1}
                page = await receiver.peek_messages(
                    max_message_count=min(PAGE, LIMIT - seen), **kwargs
                )
                if not page:
                    break
                seen += len(page)
                after = max(int(m.sequence_number or 0) for m in page)
        return seen

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()
