"""The producer side of the ack channel: what a broker connector implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple

from typing_extensions import TypeVar

__all__ = [
    "AdvanceItem",
    "AdvanceOutcome",
    "LaneBatch",
    "PayloadT",
    "SharedStreamProducer",
    "reject_reasons_of",
]

#: A producer's broker payload: what it hands out beside each raw event and gets back
#: in :class:`AdvanceItem` (a bare ``SharedStreamProducer`` is one of ``Any``).
PayloadT = TypeVar("PayloadT", default=Any)


@dataclass(frozen=True, slots=True)
class AdvanceOutcome:
    """How the members of one event's subscriber snapshot resolved it.

    ``reject_reasons`` (beyond Airflow) carries the reasons given to
    ``reject_shared_stream_event(reason=...)`` so a dead-letter copy can say why.
    """

    acked: int
    failed: int
    rejected: int = 0
    reject_reasons: tuple[str, ...] = field(default=(), compare=False)

    @property
    def is_clean(self) -> bool:
        """True when every snapshot member accepted the event and there was at least one."""
        return self.failed == 0 and self.rejected == 0 and self.acked > 0


def reject_reasons_of(outcome: object) -> tuple[str, ...]:
    """The reject reasons an outcome carries: acklane's do, Airflow's ``AdvanceOutcome`` not.

    A producer reads the reasons only through this, so that it runs under Airflow's
    manager too (its outcomes then give the default reason text).
    """
    reasons: tuple[str, ...] = getattr(outcome, "reject_reasons", ())
    return reasons


class AdvanceItem(NamedTuple, Generic[PayloadT]):
    """One resolved event handed back to the producer, in fan-out order."""

    broker_payload: PayloadT
    outcome: AdvanceOutcome


class LaneBatch(NamedTuple):
    """acklane's addition: a batch of :meth:`SharedStreamProducer.open_batches` whose
    pairs are all of one lane.

    The engine then takes ``lane`` as the lane of every pair (it does not call
    ``get_advance_lane`` for them, which must agree) and finds the lane's ledger
    once per batch instead of once per pair. Pairs that have a length (``len()``)
    may be taken all at once, with no await in between, when every member's queue
    has room for them all; the length may be an upper bound (lazily checked pairs
    that turn out stale as they are taken). Pairs taken at once are taken from their
    ``at_once()`` method when they have one: a producer that checks each pair as it
    is taken (see :meth:`SharedStreamProducer.open_batches`) may there check them
    once for all, since nothing awaits until the last one is taken.
    """

    lane: Hashable
    pairs: Iterable[tuple[Any, Any]]


class SharedStreamProducer(ABC, Generic[PayloadT]):
    """Owns one group's broker connection for the life of its poll.

    The connection must be opened lazily inside :meth:`open_stream`, never in
    ``__init__``: the factory may run in a context where connecting is wrong.

    Generic in its broker payload (``SharedStreamProducer[SqsDelivery]``): the
    payload it yields is the one :meth:`advance`, :meth:`get_advance_lane` and
    :meth:`message_id` get back, typed, with no cast.
    """

    @abstractmethod
    def open_stream(self) -> AsyncIterator[tuple[Any, PayloadT]]:
        """Yield ``(raw_event, broker_payload)`` forever, or raise.

        Returning normally is an error: the group fails with "stream ended".
        """

    def open_batches(self) -> AsyncIterator[Iterable[tuple[Any, PayloadT]] | LaneBatch] | None:
        """acklane's faster form of :meth:`open_stream`: the same pairs, a batch at a time.

        A producer that already receives records in batches (Kafka's ``consume``) may
        return an async generator of iterables of ``(raw_event, broker_payload)`` pairs;
        the engine then broadcasts a batch without resuming an async generator per
        record. It takes the pairs one at a time, and may await between two of them (a
        full queue with ``overflow="pause"``), so an ``advance`` can run in between: a
        producer whose advance makes later records of the batch stale should yield a
        lazy iterable that checks each pair as it is taken.
        A batch may be a :class:`LaneBatch`: pairs that are all of one lane, whose
        lane is then looked up once (a producer that receives records in runs of one
        partition saves a ``get_advance_lane`` call per record).
        The rules are those of :meth:`open_stream` (yield forever or raise; pairs in
        fan-out order; empty batches are allowed). The default, ``None``, means "use
        :meth:`open_stream`": Airflow's engine knows only that one, so a producer that
        implements this must implement :meth:`open_stream` too.
        """
        return None

    @abstractmethod
    async def advance(self, batch: Sequence[AdvanceItem[PayloadT]]) -> None:
        """Act on the broker for a contiguous, resolved prefix of one lane.

        At most one call is in flight per group. Raising fails the whole group.
        """

    def get_advance_lane(self, broker_payload: PayloadT) -> Hashable:
        """The lane of an event; events of one lane are advanced in order."""
        return None

    def message_id(self, broker_payload: PayloadT) -> str | None:
        """The broker's stable identity of the message, for dropping duplicates."""
        return None

    def counters(self) -> Mapping[str, float]:
        """acklane's addition: what this producer did on the broker so far, by name.

        Cumulative counts such as commits, dead-lettered or dropped messages and
        redeliveries; the runner exports them as ``acklane_connector_actions``.
        Called at metrics scrape time, on the event loop's thread. Default: none.
        """
        return {}

    def broker_problem(self) -> str | None:
        """acklane's addition: why the broker cannot be reached now, or ``None``.

        A broker that does not answer is no failure of the group (the producer keeps
        trying), so the stream would look healthy; the runner reads this on every
        heartbeat and ``/readyz`` reports the stream not ready while it is set.
        Called on the event loop's thread; cheap, never raises, never does I/O
        (:class:`acklane.core.connectors.Reachability` keeps the state). Default:
        ``None`` (no view of the broker's reachability).
        """
        return None

    async def aclose(self) -> None:
        """Flush and close the broker clients; called once, best-effort."""
