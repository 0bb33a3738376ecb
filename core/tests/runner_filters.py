"""Filter functions used by the runner tests (importable as ``runner_filters:...``)."""

from __future__ import annotations

import asyncio
from typing import Any

from acklane.core import RawMessage

CRASHED: set[str] = set()
STALLED: set[str] = set()


def crash_once(message: RawMessage) -> dict[str, Any]:
    """Raises the first time it sees a message whose body says so, then works."""
    body = message.json()
    if body.get("crash") and message.message_id not in CRASHED:
        CRASHED.add(str(message.message_id))
        raise RuntimeError(f"filter bug on {message.message_id}")
    return {"id": body["id"]}


async def stall_once(message: RawMessage) -> dict[str, Any]:
    """A slow filter that stalls past the ack timeout the first time it sees a message
    whose body says so (that delivery fails), then answers."""
    await asyncio.sleep(0.03)
    body = message.json()
    if body.get("stall") and message.message_id not in STALLED:
        STALLED.add(str(message.message_id))
        await asyncio.sleep(3.0)
    return {"audited": body["id"]}


def not_json(message: RawMessage) -> Any:
    """Yields a payload that cannot be stored as JSON for odd ids."""
    body = message.json()
    if body["id"] % 2:
        return {"when": {1, 2, 3}}  # a set: not JSON
    return {"id": body["id"]}


async def watermark(stream: Any, watcher: Any) -> Any:
    """Keeps the highest id seen in its asset store, and fires for each message."""
    async for message in stream:
        body = message.json()
        high = await watcher.asset_store.aget("high", 0)
        if body["id"] > high:
            await watcher.asset_store.aset("high", body["id"])
        yield {"id": body["id"]}
