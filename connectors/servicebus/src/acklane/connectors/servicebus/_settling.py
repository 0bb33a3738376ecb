"""One Service Bus settlement: complete, dead-letter (the reason bounded) or abandon.

A settlement whose lock was lost on the way (it lapsed, its session went, its
receiver was closed) is no failure: Service Bus delivers the message again, and
the event store recognises it. Anything else raises: the group fails.
"""

from __future__ import annotations

import logging
from collections.abc import Container
from dataclasses import dataclass

from azure.servicebus.exceptions import ServiceBusError

from acklane.core.connectors import Action, Verdict
from acklane.core.connectors.deadletter import bounded_text

from ._locks import LOCK_LOST
from ._message import ServiceBusDelivery

__all__ = ["LOST", "Settlement", "settle"]

log = logging.getLogger("acklane.connectors.servicebus")

#: Service Bus limits a DeadLetterErrorDescription to 4096 characters; keep well under.
_DESCRIPTION_MAX_BYTES = 1024
#: What :func:`settle` returns for a settlement whose lock was lost first.
LOST = "lock_lost"


@dataclass(slots=True, eq=False)
class Settlement:
    """A settlement the engine decided, waiting for the flusher to send it."""

    delivery: ServiceBusDelivery
    verdict: Verdict
    reason: str = ""


async def settle(settlement: Settlement, open_receivers: Container[object], describe: str) -> str:
    """Send one settlement; returns what it did (an :class:`Action`, or :data:`LOST`)."""
    delivery = settlement.delivery
    receiver, message = delivery.receiver, delivery.message
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
    log.warning(
        "%s: message %s: lock lost before settlement (%s); it will be redelivered",
        describe,
        delivery.identity,
        why,
    )
    return LOST
