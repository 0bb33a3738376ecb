"""What a Pub/Sub subscription says of itself.

Its topic (a copy's origin, the messages' identity), its ack deadline (the first
lease of a pulled message), its dead-letter policy (a reject without
``dead_letter`` is nacked for it to move), whether it orders by key. Without
the permission to read it, the stream goes on assuming the safe answers: the
shortest deadline, no policy, ordered delivery.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from acklane.core.connectors import Reachability
from acklane.core.errors import ReceiveError

from ._check import ERRORS, grpc_code

__all__ = [
    "DEFAULT_ACK_DEADLINE",
    "SubscriptionFacts",
    "read_subscription",
]

log = logging.getLogger("acklane.connectors.pubsub._producer")

#: Assumed when the subscription cannot be read: the service's shortest ack deadline.
DEFAULT_ACK_DEADLINE = 10
#: Seconds the read waits for one answer (then tried again).
_TIMEOUT = 30.0


@dataclass(slots=True)
class SubscriptionFacts:
    topic: str = ""
    ack_deadline: int = DEFAULT_ACK_DEADLINE
    has_dead_letter_policy: bool = False
    ordered: bool = True


async def read_subscription(
    client: Any,
    path: str,
    reachability: Reachability,
    *,
    called: Callable[[], object],
    error: type[ReceiveError],
) -> SubscriptionFacts:
    """Read ``path``; waits while the endpoint does not answer (``called`` counts calls)."""

    def call() -> Any:
        called()
        return client.get_subscription(subscription=path, retry=None, timeout=_TIMEOUT)

    try:
        sub = await reachability.until_answered(call, ERRORS.unreachable, ERRORS.text)
    except Exception as exc:
        code = grpc_code(exc)
        if code == "NOT_FOUND":
            raise error(f"Pub/Sub subscription {path} does not exist") from exc
        if code != "PERMISSION_DENIED":
            raise ERRORS.map(exc, f"reading subscription {path}") from exc
        log.warning(
            "Pub/Sub subscription %s: cannot read it (%s); assuming a %ss ack deadline, "
            "no dead-letter policy and ordered delivery (grant "
            "pubsub.subscriptions.get to read them)",
            path,
            exc,
            DEFAULT_ACK_DEADLINE,
        )
        return SubscriptionFacts()
    policy = sub.dead_letter_policy
    return SubscriptionFacts(
        topic=str(sub.topic),
        ack_deadline=int(sub.ack_deadline_seconds) or DEFAULT_ACK_DEADLINE,
        has_dead_letter_policy=bool(policy and policy.dead_letter_topic),
        ordered=bool(sub.enable_message_ordering),
    )
