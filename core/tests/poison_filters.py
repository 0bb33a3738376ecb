"""Filter functions of the poison-policy tests (importable as ``poison_filters:...``)."""

from __future__ import annotations

import asyncio
from typing import Any

from acklane.core import RawMessage, reject_shared_stream_event


def big_orders(message: RawMessage) -> Any:
    """The function filter of docs/configuration.md: ``{"id": 2}`` raises KeyError 'amount'."""
    order = message.json()
    if order.get("valid") is False:
        reject_shared_stream_event("invalid order")
        return None
    return {"id": order["id"]} if order["amount"] > 100 else None


#: Message ids the flaky filter already failed on once.
FLAKY: set[str] = set()


def flaky(message: RawMessage) -> Any:
    """Raises the first time it sees a message whose body has ``"flaky": true``."""
    body = message.json()
    if body.get("flaky") and str(message.message_id) not in FLAKY:
        FLAKY.add(str(message.message_id))
        raise RuntimeError("flaky dependency")
    return {"id": body["id"]}


async def stalls(message: RawMessage) -> Any:
    """Never finishes a message whose body has ``"stall": true`` (an ack timeout)."""
    body = message.json()
    if body.get("stall"):
        await asyncio.Event().wait()
    return {"id": body["id"]}


async def never_starts(stream: Any, watcher: Any) -> Any:
    """Fails before it reads a message: a failure that belongs to no message."""
    raise RuntimeError("cannot start")
    yield  # pragma: no cover - makes it an async generator
