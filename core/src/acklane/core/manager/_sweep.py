"""The ack-timeout sweep: members (and detached ones) that sit on an event too long fail."""

from __future__ import annotations

import asyncio
import time

from ..trigger import ack_timeout_error
from ._broadcast import _Broadcast
from ._common import log
from ._ledger import _Entry
from ._subscriber import _Subscriber

_monotonic = time.monotonic


class _Sweep(_Broadcast):
    """Failing members past ``ack_timeout``."""

    async def _sweep(self) -> None:
        """Every tenth of the ack timeout (0.01s to 1s), fail members past it."""
        timeout = self.host.ack_timeout
        interval = min(max(timeout / 10.0, 0.01), 1.0)
        while True:
            await asyncio.sleep(interval)
            self._sweep_once(_monotonic() - timeout)
            if self.detached:
                self._prune_detached()

    def _sweep_once(self, limit: float) -> None:
        """Time out every member (and detached one) whose oldest event is before ``limit``."""
        for sub in (*self.members, *self.detached):
            if self.frozen:
                break  # failed (perhaps by the previous timeout): nothing more counts
            oldest = sub.oldest_outstanding()
            if oldest is not None and oldest <= limit:
                self._timeout(sub)

    def _prune_detached(self) -> None:
        """Forget detached subscribers with nothing left to time out."""
        self.detached = [s for s in self.detached if s.failure is None and s.oldest_outstanding()]

    def _timeout(self, sub: _Subscriber) -> None:
        """The subscriber sat on an event past ``ack_timeout``: fail it out of everything."""
        oldest = sub.oldest_entry()
        event_id = self._event_id(oldest)
        log.warning(
            "Shared stream ack timeout key=%r trigger_id=%s event=%s after %.3gs",
            self.key,
            sub.trigger_id,
            event_id,
            self.host.ack_timeout,
        )
        self.force_fail(
            sub,
            ack_timeout_error(
                f"trigger {sub.trigger_id} did not resolve event {event_id} within "
                f"ack_timeout={self.host.ack_timeout}s"
            ),
            oldest if _stuck_on(sub, oldest) else None,
        )


def _stuck_on(sub: _Subscriber, oldest: _Entry) -> bool:
    """Whether an ack timeout belongs to ``oldest``: the filter sits on it (its window is
    open) and nothing it yielded for it awaits the event store (a slow store is not the
    message's fault)."""
    if oldest is not sub.current or sub.rejected_current:
        return False
    binding = sub.binding
    return binding is None or binding.pending == 0
