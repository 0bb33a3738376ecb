"""What a sink is: one destination that stored trigger events are delivered to.

A sink gets :class:`Delivery` values (a stored event, its stable id and the attempt
number) and says, per event, whether it got through: ``None`` for delivered, a
:class:`RetryableDelivery` for "try again later" (with the receiver's
``Retry-After`` when it gave one), a :class:`RefusedDelivery` for "never" (the event
is parked for this sink with the reason). Any other exception counts as retryable.

The dispatcher (:mod:`acklane.core.sinks._dispatcher`) owns everything else: which
events are due, claims across processes, retries with backoff, parking, ordering
and concurrency. A sink only does its I/O.
"""

from __future__ import annotations

import hashlib
from abc import ABC
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self

from ..errors import AcklaneError
from ._settings import SinkSettings
from ._spans import NO_SPANS, SinkSpans

if TYPE_CHECKING:
    from ..connectors._stream import StreamConfig

__all__ = [
    "Delivery",
    "DeliveryError",
    "DeliveryResult",
    "RefusedDelivery",
    "RetryableDelivery",
    "Sink",
    "SinkContext",
    "SinkError",
    "event_id_for",
    "field_problem",
]


class SinkError(AcklaneError):
    """A sink cannot be built or opened (bad settings, an unreachable endpoint)."""


class DeliveryError(SinkError):
    """One event did not get through to a sink; :attr:`reason` says why, secret-free."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RetryableDelivery(DeliveryError):
    """Try again later: a connection error, a timeout, 408, 429, 5xx, a broker hiccup.

    ``retry_after`` (seconds), when the receiver asked for a pause, is honoured
    instead of the backoff when it is longer.
    """

    def __init__(self, reason: str, *, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


class RefusedDelivery(DeliveryError):
    """The receiver refused the event for good (a 4xx other than 408/429, a payload the
    destination cannot take): it is parked for this sink at once, with the reason."""


#: Per event of a batch: None (delivered) or why not.
DeliveryResult = BaseException | None


def event_id_for(
    *,
    watcher: str,
    stream: str,
    message_id: str | None,
    position: int,
    store_id: int,
    created_at: datetime,
) -> str:
    """The stable id of a stored event, as every sink carries it (``ev_`` + 32 hex).

    Derived from the event's dedupe identity (stream, watcher, message id, position)
    when it has a message id, so that the same message stored again (after retention
    pruned its first copy, say) carries the same id and a receiver that dedupes on it
    sees no repeat; from the row (its id and the time it was stored) otherwise.
    """
    if message_id is not None:
        basis = f"m\x1f{stream}\x1f{watcher}\x1f{message_id}\x1f{position}"
    else:
        basis = f"r\x1f{stream}\x1f{watcher}\x1f{store_id}\x1f{created_at.isoformat()}"
    return "ev_" + hashlib.sha256(basis.encode("utf-8", "surrogatepass")).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Delivery:
    """One stored trigger event on its way to one sink."""

    #: The stable id every sink carries (idempotency key, Airflow ``extra``, broker
    #: header): the same for every attempt, and for the same message stored again.
    event_id: str
    #: The event store's row id (store order).
    store_id: int
    watcher: str
    #: The stream's key as the event store keeps it.
    stream: str
    message_id: str | None
    position: int
    #: The trigger event's payload (a JSON value).
    payload: Any
    created_at: datetime
    #: 1 for the first attempt at this sink, 2 for the first retry, ...
    attempt: int = 1
    #: The stream's name in the configuration (its watcher's ``stream:``), what the
    #: sinks send as ``stream``; None when not known (then the key is sent).
    stream_name: str | None = None

    def acklane_fields(self) -> dict[str, Any]:
        """acklane's own fields, as every sink carries them beside the payload."""
        return {
            "event_id": self.event_id,
            "watcher": self.watcher,
            "stream": self.stream if self.stream_name is None else self.stream_name,
            "message_id": self.message_id,
            "position": self.position,
            "stored_at": self.created_at.isoformat(),
        }


def field_problem(problem: str) -> tuple[str, str]:
    """``"stream: no stream named 'x'"`` as ``("stream", "no stream named 'x'")``, for
    :meth:`Sink.config_problems` (a problem without a leading field name stays whole)."""
    head, sep, rest = problem.partition(": ")
    if sep and head.replace("_", "").replace(".", "").isalnum():
        return head, rest
    return "", problem


@dataclass(frozen=True, slots=True)
class SinkContext:
    """What a sink may need of the rest of the configuration."""

    #: The configured streams by name (the ``broker`` sink publishes through one).
    streams: Mapping[str, StreamConfig] = field(default_factory=dict)
    #: Each watcher's ``asset`` (the ``airflow`` sink's default asset).
    watcher_assets: Mapping[str, str | None] = field(default_factory=dict)
    #: The folder of the configuration file (``module:function`` paths are found there
    #: too, as function filters are).
    config_dir: Path | None = None


class SpanSource(Protocol):
    """Where a sink's delivery spans come from (a tracer)."""

    def sink_spans(self, sink: Sink, batch: Sequence[Delivery]) -> SinkSpans:
        """The delivery spans of ``batch`` for ``sink``: a context manager."""
        ...


class Sink(ABC):
    """One configured destination; an async context manager (:meth:`open`,
    :meth:`aclose`). Subclasses implement :meth:`deliver_one` or, for a sink with a
    batch API, :meth:`deliver`, and name their settings model."""

    #: The ``kind:`` of the YAML block (``webhook``, ``airflow``, ``broker``, ``function``).
    kind: ClassVar[str]
    #: The pydantic model of the kind's YAML block (a :class:`SinkSettings` subclass
    #: whose ``kind`` is ``Literal[<kind>]``).
    settings_model: ClassVar[type[SinkSettings]] = SinkSettings
    #: True when :meth:`delivered_already` can tell what a crashed attempt got through,
    #: so that a delivery recorded in flight is looked up instead of sent again.
    exactly_once: ClassVar[bool] = False

    def __init__(self, settings: SinkSettings, context: SinkContext | None = None) -> None:
        self.settings = settings
        self.context = context if context is not None else SinkContext()
        self.name = settings.name
        #: Where the sink's delivery spans come from: the tracer of whoever runs it
        #: (the runner, ``acklane sinks run``); None: tracing off.
        self.spans_from: SpanSource | None = None

    def delivery_spans(self, batch: Sequence[Delivery]) -> SinkSpans:
        """The delivery spans of ``batch`` (a context manager); free when tracing is off."""
        source = self.spans_from
        return NO_SPANS if source is None else source.sink_spans(self, batch)

    @property
    def max_batch(self) -> int:
        """The most events one :meth:`deliver` call takes (the sink's ``batch_size``)."""
        return self.settings.batch_size

    @property
    def destination(self) -> str:
        """Where events go, secret-free, for logs and ``sinks status``."""
        return self.kind

    @classmethod
    def config_problems(cls, settings: SinkSettings, context: SinkContext) -> list[tuple[str, str]]:
        """Problems the configuration loader reports for this sink, as (field, message),
        found without the network (a stream that does not exist, a watcher without an
        asset, a function that does not import). ``context`` holds the watchers that
        name this sink only."""
        return []

    async def open(self) -> None:
        """Build clients; raise :class:`SinkError` when the settings cannot work."""
        return None

    async def aclose(self) -> None:
        """Release clients. Idempotent."""
        return None

    async def check(self) -> None:
        """``validate --connect``: reach the destination without delivering anything;
        raise :class:`SinkError` naming what failed."""
        return None

    async def deliver(self, batch: Sequence[Delivery]) -> list[DeliveryResult]:
        """Deliver ``batch`` (at most :attr:`max_batch` events, in store order); one
        result per event. The default delivers them one by one, in order."""
        results: list[DeliveryResult] = []
        for delivery in batch:
            try:
                await self.deliver_one(delivery)
            except Exception as exc:
                results.append(exc)
            else:
                results.append(None)
        return results

    async def deliver_one(self, delivery: Delivery) -> None:
        """Deliver one event, or raise (a :class:`DeliveryError` says how to go on)."""
        raise NotImplementedError(f"{type(self).__qualname__} implements neither deliver()")

    async def delivered_already(self, batch: Sequence[Delivery]) -> set[str]:
        """The event ids of ``batch`` the destination already has (only asked of an
        :attr:`exactly_once` sink, for deliveries a crash or a timeout left unsure)."""
        return set()

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
