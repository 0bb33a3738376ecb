"""A group's poison books: the policy told of failed attempts, suspects judged as pulled.

acklane's addition; nothing here runs per event while a key has no suspects.
"""

from __future__ import annotations

from ..producer import AdvanceItem
from ._common import log
from ._group_base import _GroupBase
from ._ledger import REJECTED, _Entry
from ._subscriber import _Subscriber


class _Poison(_GroupBase):
    """The poison policy's moments (``PoisonPolicy``), as the group meets them."""

    def _attempt_failed(self, sub: _Subscriber, entry: _Entry, exc: BaseException) -> None:
        """``sub`` failed on ``entry``: a failed attempt of that message, for the policy."""
        policy = self.host.poison_policy
        if policy is None or not self.acking or self.frozen:
            return
        mid = self._message_id(entry.payload)
        if mid is None:
            return
        try:
            policy.failed(self.key, sub.trigger_id, mid, exc)
        except Exception:  # the policy must never break the ack channel
            log.exception("poison policy failed key=%r", self.key)

    def _poisoned(self, entry: _Entry) -> bool:
        """A suspect the policy judges poison: rejected for every member, never broadcast."""
        mid = self._message_id(entry.payload)
        if mid is None or mid not in self.suspects:
            return False
        policy = self.host.poison_policy
        assert policy is not None
        try:
            reason = policy.poisoned(self.key, mid)
        except Exception:
            log.exception("poison policy failed key=%r", self.key)
            return False
        if reason is None:
            return False
        entry.marked().reasons = [reason]
        self.resolve(entry, REJECTED, entry.remaining)
        return True

    def _suspects_resolved(self, batch: list[AdvanceItem]) -> None:
        """Tell the policy which suspects the broker was just told to ack or reject."""
        suspects = self.suspects
        done = []
        for payload, outcome in batch:
            if outcome.failed or not (outcome.acked or outcome.rejected):
                continue  # redelivered: its count goes on
            mid = self._message_id(payload)
            if mid is not None and mid in suspects:
                done.append(mid)
        policy = self.host.poison_policy
        if done and policy is not None:
            try:
                policy.resolved(self.key, done)
            except Exception:
                log.exception("poison policy failed key=%r", self.key)
