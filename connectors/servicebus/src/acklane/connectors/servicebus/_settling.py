"""Service Bus settlements: complete, dead-letter (the reason bounded) or abandon.

A settlement whose lock was lost on the way (it lapsed, its session went, its
receiver was closed) is no failure: Service Bus delivers the message again, and
the event store recognises it. Anything else raises: the group fails.

The SDK completes one message per call, and each call waits for the service's
answer: one round trip per message, about 200 messages/s a receiver at 5 ms of
round trip. AMQP lets one disposition frame settle a range of delivery ids, and
the service answers it once: :func:`completion_ranges` picks the completions
that can share one (consecutive deliveries of the link that received them, their
locks held), :func:`complete_range` sends it through the SDK's own link (its
``settle_messages_async``, awaiting the outcome as the SDK does for one message).
When a range is not answered as accepted, its messages are completed one by one
by their lock tokens (:func:`complete_by_lock`, through ``$management``: a
delivery the range settled would get no answer on the link), which says precisely
which lock was lost: a message the range did complete then reads as a lost lock,
never as a second completion.

A settlement whose connection fails under it (the connection was reset before the
receiver noticed and reconnected) is a lost lock too, as when its receiver has a
new link already: the link it was received on is gone with the connection, so its
message comes again (or was settled just before), and the link is remembered as
lost (``lost_links``): the settlements still queued on it are not sent in vain.
"""

from __future__ import annotations

import logging
from collections.abc import Container, MutableSet, Sequence
from dataclasses import dataclass
from typing import Any

from azure.servicebus._common.constants import (
    MESSAGE_COMPLETE,
    MESSAGE_MGMT_SETTLEMENT_TERM_MAP,
)
from azure.servicebus._pyamqp.error import AMQPConnectionError
from azure.servicebus.exceptions import ServiceBusConnectionError, ServiceBusError

from acklane.core.connectors import Action, Verdict
from acklane.core.connectors.deadletter import bounded_text

from ._locks import LOCK_LOST
from ._message import ServiceBusDelivery

__all__ = [
    "CONNECTION_LOST",
    "LOST",
    "Settlement",
    "complete_by_lock",
    "complete_range",
    "completion_ranges",
    "link_of",
    "settle",
]

log = logging.getLogger("acklane.connectors.servicebus")

#: Service Bus limits a DeadLetterErrorDescription to 4096 characters; keep well under.
_DESCRIPTION_MAX_BYTES = 1024
#: What :func:`settle` returns for a settlement whose lock was lost first.
LOST = "lock_lost"
#: Seconds a range's outcome is awaited when the receiver does not say (the SDK's default).
_OUTCOME_TIMEOUT = 60.0
#: A settlement's connection failed under it (the SDK's words, and the socket's).
CONNECTION_LOST = (ServiceBusConnectionError, AMQPConnectionError, ConnectionError)


@dataclass(slots=True, eq=False)
class Settlement:
    """A settlement the engine decided, waiting for the flusher to send it."""

    delivery: ServiceBusDelivery
    verdict: Verdict
    reason: str = ""


def _link_gone(delivery: ServiceBusDelivery, lost_links: Container[object]) -> bool:
    """Whether the link ``delivery`` was received on is gone: its receiver reconnected
    (or is closed) since, or its connection failed under a settlement."""
    link = delivery.link
    return link is not None and (link_of(delivery.receiver) is not link or link in lost_links)


def _connection_lost(
    describe: str, delivery: ServiceBusDelivery, lost_links: MutableSet[Any], exc: BaseException
) -> str:
    if delivery.link is not None:
        lost_links.add(delivery.link)
    return _lost(describe, delivery, f"its connection failed: {type(exc).__name__}")


async def settle(
    settlement: Settlement,
    open_receivers: Container[object],
    describe: str,
    lost_links: MutableSet[Any],
) -> str:
    """Send one settlement; returns what it did (an :class:`Action`, or :data:`LOST`)."""
    delivery = settlement.delivery
    receiver, message = delivery.receiver, delivery.message
    if _link_gone(delivery, lost_links):
        # The message's delivery id belonged to the lost link, and on a new one it may
        # name another message. The lost link released it; Service Bus delivers it again.
        log.warning(
            "%s: message %s: its link was lost before settlement; it will be redelivered",
            describe,
            delivery.identity,
        )
        return LOST
    try:
        match settlement.verdict:
            case Verdict.COMMIT:
                await receiver.complete_message(message)
                return Action.COMPLETED
            case Verdict.DEAD_LETTER:
                reason = settlement.reason
                await receiver.dead_letter_message(
                    message,
                    reason=bounded_text(reason, 256),
                    error_description=bounded_text(reason, _DESCRIPTION_MAX_BYTES),
                )
                return Action.DEAD_LETTERED
            case _:
                await receiver.abandon_message(message)
                return Action.REDELIVERED
    except LOCK_LOST as exc:
        why = type(exc).__name__  # the lock lapsed or the session went
    except CONNECTION_LOST as exc:
        return _connection_lost(describe, delivery, lost_links, exc)
    except ServiceBusError as exc:
        if "lock" not in str(exc).lower() or "lost" not in str(exc).lower():
            raise
        why = type(exc).__name__
    except ValueError:
        if receiver in open_receivers:
            raise
        # Its receiver was closed already (its session let go, or lost): closing
        # released the message, and Service Bus delivers it again.
        why = "receiver closed"
    return _lost(describe, delivery, why)


def _lost(describe: str, delivery: ServiceBusDelivery, why: str) -> str:
    log.warning(
        "%s: message %s: lock lost before settlement (%s); it will be redelivered",
        describe,
        delivery.identity,
        why,
    )
    return LOST


async def complete_by_lock(
    settlement: Settlement, describe: str, lost_links: MutableSet[Any]
) -> str:
    """Complete one message by its lock token, through the receiver's ``$management``
    link (what the SDK itself falls back to); an :class:`Action`, or :data:`LOST`."""
    delivery = settlement.delivery
    receiver: Any = delivery.receiver
    if delivery.link is not None and delivery.link in lost_links:
        return _lost(describe, delivery, "its connection failed")
    try:
        await receiver._settle_message_via_mgmt_link(
            MESSAGE_MGMT_SETTLEMENT_TERM_MAP[MESSAGE_COMPLETE], [delivery.message.lock_token]
        )
    except LOCK_LOST as exc:
        return _lost(describe, delivery, type(exc).__name__)
    except CONNECTION_LOST as exc:
        return _connection_lost(describe, delivery, lost_links, exc)
    except ServiceBusError as exc:
        if "lock" not in str(exc).lower():
            raise
        return _lost(describe, delivery, type(exc).__name__)
    delivery.message._settled = True
    return Action.COMPLETED


def link_of(receiver: Any) -> Any:
    """The AMQP link handler ``receiver`` receives on now (None when it has none, or
    when its SDK transport cannot await a settlement's outcome)."""
    handler = getattr(receiver, "_handler", None)
    transport = getattr(receiver, "_amqp_transport", None)
    if handler is None or getattr(transport, "KIND", None) != "pyamqp":
        return None
    if not getattr(receiver, "_await_settlement_outcome", False):
        return None
    return handler if hasattr(handler, "settle_messages_async") else None


def _rangeable(settlement: Settlement, lost_links: Container[object]) -> int | None:
    """The delivery id a completion can be sent under in a range, or None."""
    delivery = settlement.delivery
    if settlement.verdict is not Verdict.COMMIT or delivery.link is None:
        return None
    message = delivery.message
    delivery_id = getattr(message, "_delivery_id", None)
    if not isinstance(delivery_id, int) or getattr(message, "_is_deferred_message", True):
        return None
    if getattr(message, "_settled", True):
        return None
    if delivery.session_id is None and getattr(message, "_lock_expired", True):
        return None  # one by one: the SDK reports it as a lost lock
    if _link_gone(delivery, lost_links):
        return None  # the receiver reconnected (or will): those ids were the old link's
    return delivery_id


def completion_ranges(
    queue: Sequence[Settlement], lost_links: Container[object] = ()
) -> list[list[Settlement]]:
    """The completions at the head of ``queue`` (up to its first other settlement),
    ordered by delivery id and cut where ids are not consecutive or a completion
    cannot be ranged (then a run of its own). Completions commute: their order does
    not matter; an abandon or dead-letter after them keeps its place.
    """
    head: list[tuple[int, Settlement]] = []
    singles: list[Settlement] = []
    for settlement in queue:
        if settlement.verdict is not Verdict.COMMIT:
            break
        delivery_id = _rangeable(settlement, lost_links)
        if delivery_id is None:
            singles.append(settlement)
        else:
            head.append((delivery_id, settlement))
    head.sort(key=lambda pair: pair[0])
    runs: list[list[Settlement]] = []
    last = None
    for delivery_id, settlement in head:
        if (
            runs
            and last == delivery_id - 1
            and runs[-1][-1].delivery.link is settlement.delivery.link
        ):
            runs[-1].append(settlement)
        else:
            runs.append([settlement])
        last = delivery_id
    return runs + [[single] for single in singles]


async def complete_range(run: Sequence[Settlement], describe: str) -> bool:
    """Complete ``run`` (consecutive deliveries of one link) with one disposition;
    whether the service accepted them all (else they go one by one)."""
    first, last = run[0].delivery, run[-1].delivery
    receiver: Any = first.receiver
    timeout = getattr(getattr(receiver, "_config", None), "timeout", None) or _OUTCOME_TIMEOUT
    try:
        await first.link.settle_messages_async(
            (first.message._delivery_id, last.message._delivery_id),
            first.message._delivery_tag,
            "accepted",
            await_outcome=True,
            outcome_timeout=timeout,
        )
    except Exception as exc:  # the messages go one by one, which tells each one's fate
        log.debug("%s: %d completions in one disposition failed (%r)", describe, len(run), exc)
        return False
    for settlement in run:
        settlement.delivery.message._settled = True  # as the SDK marks a message it settled
    return True
