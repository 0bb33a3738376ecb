"""Leases of messages the watchers still work on: kept alive, and parked across a restart.

A lease broker hands a message out for a while (SQS's visibility timeout, Pub/Sub's
ack deadline, Service Bus's lock); until the engine resolves it, the producer must
extend that lease, or the broker gives the message to another consumer while a
watcher still works on it. Only the engine's ``ack_timeout`` may decide a watcher
failed.

- :func:`beat_interval`: the one rule for how often to beat: a quarter of the
  shortest lease (never more than the configured interval), so that a lease is
  extended at least once before it lapses; a lease is due when it lapses within
  two beats (:func:`due`).
- :class:`LeaseKeeper`: the beat itself, a task of the producer. A transient
  error (the broker is busy, unreachable for a moment) warns and waits for the
  next beat; anything else ends it with the error, which fails the group: leases
  that can no longer be extended would lapse under the watchers.
- :class:`LeaseParking`: at close, leases of messages the engine never resolved
  are *parked* for a while (``restart_lease_hold``) instead of released, so the
  next producer of the same stream in this process (a cohort restart) takes them
  over without a redelivery. The parking is an object with its own expiry, not a
  global dictionary nobody cleans: what nobody took in time is forgotten (the
  broker delivers it again when its lease lapses).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["BoundLot", "LeaseKeeper", "LeaseParking", "ParkedLot", "beat_interval", "due"]

T = TypeVar("T")
#: The shortest beat (seconds): a lease shorter than four of these is beaten this often.
MIN_BEAT = 0.05


def beat_interval(lease: float, configured: float | None = None) -> float:
    """Seconds between two beats for a lease of ``lease`` seconds.

    A quarter of the lease, or the configured interval when shorter; never below
    :data:`MIN_BEAT`.
    """
    quarter = max(lease, 0.0) / 4
    interval = quarter if configured is None else min(configured, quarter)
    return max(interval, MIN_BEAT)


def due(leases: Iterable[T], until: Callable[[T], float], now: float, interval: float) -> list[T]:
    """The leases that lapse within two beats of ``now`` (``until``: when each lapses)."""
    horizon = now + 2 * interval
    return [lease for lease in leases if until(lease) <= horizon]


class LeaseKeeper:
    """Calls ``extend(interval)`` every beat; the callback extends what is due.

    ``interval`` is fixed or read before every beat (a callable, for a broker whose
    leases are known only once messages come). ``transient(exc)`` tells an error
    worth retrying at the next beat from one that fails the group.
    """

    def __init__(
        self,
        extend: Callable[[float], Awaitable[None]],
        interval: float | Callable[[], float],
        *,
        transient: Callable[[BaseException], bool],
        describe: str,
        logger: logging.Logger | None = None,
    ) -> None:
        self._extend = extend
        self._interval = interval
        self._transient = transient
        self.describe = describe
        self._log = logger or logging.getLogger("acklane.connectors")
        #: Beats whose extension failed transiently (each told at WARNING).
        self.missed = 0

    def interval(self) -> float:
        return self._interval() if callable(self._interval) else self._interval

    async def run(self) -> None:
        """Beat until cancelled; raises the first error that is not transient."""
        while True:
            interval = self.interval()
            await asyncio.sleep(interval)
            await self.beat(interval)

    async def beat(self, interval: float) -> None:
        """One beat: extend what is due, a transient error told and swallowed."""
        try:
            await self._extend(interval)
        except Exception as exc:
            if not self._transient(exc):
                raise
            self.missed += 1
            self._log.warning(
                "%s: lease extension failed (%s); retrying next beat", self.describe, exc
            )


@dataclass(slots=True)
class ParkedLot(Generic[T]):
    """What closing producers of one stream left to the next one."""

    #: Leases kept, in the order they were first handed out.
    leases: list[T] = field(default_factory=list)
    #: Anything else the next producer needs (SQS: a FIFO receive attempt to retry).
    note: object = None
    #: When the last of them lapses (``clock()``): past it, the lot is forgotten.
    expires: float = 0.0


class LeaseParking(Generic[T]):
    """Parked leases by stream key, each with its lapse time (see the module).

    ``until(lease)`` is when a lease lapses, on ``clock``'s scale. One instance per
    connector is shared by its producers in the process; a test makes its own.
    """

    def __init__(
        self, until: Callable[[T], float], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._until = until
        self._clock = clock
        self._lots: dict[tuple[Hashable, ...], ParkedLot[T]] = {}

    def park(
        self,
        key: tuple[Hashable, ...],
        leases: Iterable[T] = (),
        *,
        note: object = None,
        note_until: float | None = None,
    ) -> int:
        """Keep ``leases`` for the next producer of ``key``, and ``note`` (if given)
        until ``note_until``; returns how many leases were parked."""
        self._expire()
        lot = self._lots.setdefault(key, ParkedLot())
        added = list(leases)
        lot.leases.extend(added)
        if note is not None:
            lot.note = note
        lapses = [self._until(lease) for lease in added]
        if note_until is not None:
            lapses.append(note_until)
        lot.expires = max([lot.expires, *lapses])
        if not lot.leases and lot.note is None:
            del self._lots[key]
        return len(added)

    def take(self, key: tuple[Hashable, ...], margin: float = 0.0) -> tuple[list[T], int, object]:
        """Take ``key``'s lot: ``(leases with more than margin seconds left, how many
        were too close to lapsing, its note)``; the lot is gone after."""
        self._expire()
        lot = self._lots.pop(key, None)
        if lot is None:
            return [], 0, None
        now = self._clock()
        taken = [lease for lease in lot.leases if self._until(lease) - now > margin]
        return taken, len(lot.leases) - len(taken), lot.note

    async def take_over(
        self,
        key: tuple[Hashable, ...],
        renew: Callable[[list[T]], Awaitable[list[T]]],
        *,
        margin: float,
        what: str,
        logger: logging.Logger,
    ) -> tuple[list[T], object]:
        """Take ``key``'s lot and renew its leases as a receive would have.

        ``renew`` returns the leases it renewed (an error: none); each step is told
        (``what`` starts the lines). Returns ``(the leases taken over, the lot's note)``.
        """
        taken, too_late, note = self.take(key, margin)
        if too_late:
            logger.info(
                "%s: %d parked message(s) were held too long to take over; the broker "
                "delivers them again",
                what,
                too_late,
            )
        if not taken:
            return [], note
        try:
            kept = await renew(taken)
        except Exception as exc:
            logger.warning(
                "%s: %d parked lease(s) could not be taken over (%s); the broker delivers "
                "them again",
                what,
                len(taken),
                exc,
            )
            return [], note
        if kept:
            logger.info(
                "%s: took over %d message(s) left unresolved by the previous producer, "
                "without a redelivery",
                what,
                len(kept),
            )
        return kept, note

    async def keep(
        self,
        key: tuple[Hashable, ...],
        leases: list[T],
        hold: float,
        extend: Callable[[list[T], float], Awaitable[list[T]]],
        *,
        what: str,
        logger: logging.Logger | None = None,
    ) -> int:
        """Extend ``leases`` by ``hold`` seconds and park those ``extend`` kept; told once.

        Returns how many were parked.
        """
        if not leases:
            return 0
        logger = logger or logging.getLogger("acklane.connectors")
        parked = self.park(key, await extend(leases, hold))
        if parked:
            logger.info(
                "%s: kept the leases of %d unresolved message(s) for %ss (restart_lease_hold), "
                "for the next producer of it in this process; otherwise the broker delivers "
                "them again then",
                what,
                parked,
                hold,
            )
        return parked

    def lot(
        self, key: tuple[Hashable, ...], what: str, logger: logging.Logger | None = None
    ) -> BoundLot[T]:
        """``key``'s lot as one producer sees it (``what`` starts its lines)."""
        return BoundLot(self, key, what, logger or logging.getLogger("acklane.connectors"))

    def __contains__(self, key: object) -> bool:
        return key in self._lots

    def clear(self) -> None:
        self._lots.clear()

    def _expire(self) -> None:
        now = self._clock()
        for key in [k for k, lot in self._lots.items() if lot.expires < now]:
            del self._lots[key]


@dataclass(slots=True)
class BoundLot(Generic[T]):
    """One stream's lot in a :class:`LeaseParking`, with the words of its producer."""

    parking: LeaseParking[T]
    key: tuple[Hashable, ...]
    what: str
    logger: logging.Logger

    async def take_over(
        self, renew: Callable[[list[T]], Awaitable[list[T]]], margin: float
    ) -> tuple[list[T], object]:
        """:meth:`LeaseParking.take_over` of this lot."""
        return await self.parking.take_over(
            self.key, renew, margin=margin, what=self.what, logger=self.logger
        )

    async def keep(
        self, leases: list[T], hold: float, extend: Callable[[list[T], float], Awaitable[list[T]]]
    ) -> int:
        """:meth:`LeaseParking.keep` into this lot."""
        return await self.parking.keep(
            self.key, leases, hold, extend, what=self.what, logger=self.logger
        )

    def note(self, note: object, until: float) -> None:
        """Leave ``note`` for the next producer until ``until``."""
        self.parking.park(self.key, note=note, note_until=until)
