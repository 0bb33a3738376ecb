"""Service Bus's peek locks: renewed while the watchers work, given back at close.

Every outstanding message's lock (a session's messages: their session's lock) is
renewed when it lapses within two beats, until the engine resolves the message
or ``max_lock_renewal`` passed; the beat is a quarter of the shortest lock held
(``heartbeat.interval`` when set). A lost lock is counted: Service Bus delivers the
message again. At close, messages of sessionless receivers the engine never
resolved are abandoned (delivered again now, not when their locks lapse).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, MutableMapping
from datetime import UTC, datetime
from typing import Any

from azure.servicebus.exceptions import MessageLockLostError, SessionLockLostError

from acklane.core.connectors import beat_interval

from ._message import ServiceBusDelivery

__all__ = ["LOCK_LOST", "abandon", "lock_interval", "renew_due"]

log = logging.getLogger("acklane.connectors.servicebus")

#: The SDK's words for a lock that lapsed (a message's, or its session's).
LOCK_LOST = (MessageLockLostError, SessionLockLostError)


def lock_interval(deliveries: Iterable[ServiceBusDelivery], sessions: Iterable[Any]) -> float:
    """A beat for the shortest lock held (1 s with none): a quarter of it, at most 5 s."""
    now = datetime.now(UTC)
    left: list[float] = [
        (d.message.locked_until_utc - now).total_seconds()
        for d in deliveries
        if d.message.locked_until_utc is not None
    ]
    left += [
        (r.session.locked_until_utc - now).total_seconds()
        for r in sessions
        if r.session is not None and r.session.locked_until_utc is not None
    ]
    return min(beat_interval(max(min(left), 0.4)), 5.0) if left else 1.0


async def renew_due(
    outstanding: MutableMapping[int, ServiceBusDelivery],
    sessions: MutableMapping[Any, asyncio.Event],
    interval: float,
    max_lock_renewal: float,
) -> tuple[int, int]:
    """Renew the locks that lapse within two beats; ``(renewed, lost)``.

    A message whose lock was lost leaves ``outstanding``; a session being let go
    (its event set), or holding a message past ``max_lock_renewal``, is not renewed.
    """
    now = datetime.now(UTC)
    renewed = lost = 0
    overdue: set[int] = set()  # sessions holding a message past max_lock_renewal
    for key, delivery in list(outstanding.items()):
        if delivery.settled:
            continue
        if time.monotonic() - delivery.received_at > max_lock_renewal:
            overdue.add(id(delivery.receiver))
            continue
        if delivery.session_id is not None or not _due(delivery.message, now, interval):
            continue  # a session's lock is its messages' lock: renewed below
        try:
            await delivery.receiver.renew_message_lock(delivery.message)
            renewed += 1
        except LOCK_LOST:
            lost += 1
            outstanding.pop(key, None)
            log.warning("message %s: lock lost; it will be redelivered", delivery.identity)
    for receiver, release in list(sessions.items()):  # every session held
        if release.is_set() or id(receiver) in overdue:
            continue  # being let go, or renewed long enough
        if not _due(receiver.session, now, interval):
            continue
        try:
            await receiver.session.renew_lock()
            renewed += 1
        except LOCK_LOST:
            lost += 1
    return renewed, lost


async def abandon(held: list[ServiceBusDelivery], describe: str, budget: float) -> tuple[int, int]:
    """Abandon ``held`` (best effort, within ``budget`` seconds); ``(abandoned, lost)``.

    The group is going (a cohort restart, a failure, a stop): nobody will resolve
    them. Left alone they would come back only when their locks lapse (the entity's
    lock duration, a minute by default), which counts a delivery too; abandoned,
    they come back now. What is not abandoned lapses as before.
    """
    given = lost = 0
    try:
        async with asyncio.timeout(budget):
            for delivery in held:
                delivery.settled = True
                if (
                    delivery.link is not None
                    and getattr(delivery.receiver, "_handler", None) is not delivery.link
                ):
                    lost += 1  # its link went (a reconnect): released with it already
                    continue
                try:
                    await delivery.receiver.abandon_message(delivery.message)
                except LOCK_LOST:
                    lost += 1  # it comes back anyway
                    continue
                given += 1
    except Exception as exc:
        log.warning(
            "%s: giving back unresolved messages on close failed (%r); Service Bus "
            "redelivers them when their locks lapse",
            describe,
            exc,
        )
    log.info(
        "%s: %d of %d unresolved messages abandoned on close (redelivered now)",
        describe,
        given,
        len(held),
    )
    return given, lost


def _due(locked: Any, now: datetime, interval: float) -> bool:
    """Whether a message's or a session's lock lapses within two beats (or is unknown)."""
    until = locked.locked_until_utc
    return until is None or (until - now).total_seconds() <= 2 * interval
