"""A receiver's link opened without the SDK's pause after every frame.

The SDK (azure-servicebus 7.x, its pyamqp transport) opens a receiver in a loop:
ask its AMQP client whether it is ready (which reads at most one frame of the
handshake: open, begin, the ``$cbs`` links, the token's answer, the attach...),
and when it is not, sleep 50 ms before asking again. The dozen frames of an
opening then take about 0.55 s whatever the round trip: at 5 ms, ten times what
the frames themselves need, and paid again by every receiver, every reconnection
and every session a session receiver accepts.

Each of those readiness checks waits for its frame already (up to the socket
timeout), so the pause adds nothing but time. :func:`open_promptly` makes the
receiver's client ask again at once while the receiver is opening, a bounded
number of times per check (then the SDK's own pause comes back, so a client that
answers without waiting cannot spin), and leaves it as it is once open. With a
transport or an SDK shaped otherwise it does nothing: the receiver opens as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["open_promptly"]

#: Readiness checks in a row without the SDK's pause (an opening reads about a dozen frames).
_CHECKS = 32


def open_promptly(receiver: Any) -> None:
    """Have ``receiver`` (an async ``ServiceBusReceiver``) open, and reopen after a
    lost connection, without pausing between the frames of the handshake."""
    create = getattr(receiver, "_create_handler", None)
    transport = getattr(receiver, "_amqp_transport", None)
    if create is None or getattr(transport, "KIND", None) != "pyamqp":
        return

    def create_handler(auth: Any) -> None:
        create(auth)
        handler: Any = getattr(receiver, "_handler", None)
        ready = getattr(handler, "client_ready_async", None)
        if ready is not None:
            handler.client_ready_async = _prompt(receiver, ready)

    receiver._create_handler = create_handler


def _prompt(receiver: Any, ready: Callable[[], Awaitable[bool]]) -> Callable[[], Awaitable[bool]]:
    async def ready_promptly() -> bool:
        if getattr(receiver, "_running", True):  # open: a check as the SDK makes it
            return await ready()
        for _ in range(_CHECKS):
            if await ready():
                return True
        return False

    return ready_promptly
