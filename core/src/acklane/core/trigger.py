"""The subscriber side: trigger base class, trigger events, and rejecting an event."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Hashable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

from .errors import SharedStreamError

if TYPE_CHECKING:
    from .producer import SharedStreamProducer

__all__ = [
    "AckTimeout",
    "BaseEventTrigger",
    "SharedStreamError",
    "StreamEnded",
    "SubscriberOverflow",
    "TriggerEvent",
    "reject_shared_stream_event",
]

log = logging.getLogger("acklane.core.trigger")


class TriggerEvent:
    """What a filter yields: one event that fires its watcher's asset."""

    __slots__ = ("payload",)

    def __init__(self, payload: Any) -> None:
        self.payload = payload

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TriggerEvent) and other.payload == self.payload

    def __hash__(self) -> int:
        return hash(repr(self.payload))

    def __repr__(self) -> str:
        return f"TriggerEvent<{self.payload!r}>"


class AckTimeout(SharedStreamError):
    """The subscriber did not resolve an event within ``ack_timeout`` of its broadcast."""


class SubscriberOverflow(SharedStreamError):
    """The subscriber's queue was full when an event was broadcast to it."""


class StreamEnded(SharedStreamError):
    """The producer's ``open_stream`` returned; a shared stream must run forever."""


class _BindingWindow(Protocol):
    def reject(self, reason: str | None) -> bool: ...


# Set by the engine around each raw event it hands to a filter; task-local because
# each filter runs in its own task.
current_window: ContextVar[_BindingWindow | None] = ContextVar(
    "acklane_binding_window", default=None
)


def reject_shared_stream_event(reason: str | None = None) -> None:
    """Mark the raw event the calling filter is on as rejected (dead-letter it).

    Resolves the event for this subscriber at once. Outside an open binding window
    (fast path, standalone ``run()``, between two events) it only logs a warning.
    ``reason`` is acklane's addition; it reaches the producer for the DLQ copy.
    """
    window = current_window.get()
    if window is None or not window.reject(reason):
        log.warning(
            "reject_shared_stream_event() called outside a binding window; ignored "
            "(fast path, standalone run(), or between two events)"
        )


class BaseEventTrigger:
    """Base class of triggers (watchers) that may share one upstream poll.

    Subclasses opt in to sharing by returning a key from :meth:`shared_stream_key`
    and by providing either :meth:`open_shared_stream` (fast path, nothing is
    acknowledged) or :meth:`create_shared_stream_producer` (ack mode). The
    constructor takes no arguments, so subclasses need not call it with any.
    """

    #: The asset store of the asset this watcher feeds, set by the runner.
    asset_store: Any = None

    def __init__(self, **kwargs: Any) -> None:
        for name, value in kwargs.items():
            setattr(self, name, value)

    def shared_stream_key(self) -> Hashable | None:
        """Triggers with equal keys share one poll; ``None`` runs :meth:`run` alone."""
        return None

    def shared_stream_settings(self) -> object | None:
        """What else must agree among triggers of one key, compared with ``==``.

        The producer of a group is built from its first subscriber's kwargs, so a
        trigger that joins with other settings (a different dead-letter topic, other
        credentials or poll tuning) would silently run with the first one's. A class
        that returns its validated stream configuration here (a pydantic model, a
        dataclass or a mapping) has a joining trigger with different settings refused
        by ``SharedStreamManager.subscribe`` with a ``ValueError`` that names the
        differing fields (never their values). ``None`` (the default) is not checked.
        acklane's addition: the manager reads it with ``getattr``, so triggers without
        it work unchanged.
        """
        return None

    @classmethod
    def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        """Fast path: an async generator of raw events, run once per group."""
        raise NotImplementedError(f"{cls.__qualname__} does not implement open_shared_stream")

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """Ack mode: the producer that owns the broker connection for one group."""
        raise NotImplementedError(
            f"{cls.__qualname__} does not implement create_shared_stream_producer"
        )

    @classmethod
    def uses_ack_channel(cls) -> bool:
        """True when the class overrides :meth:`create_shared_stream_producer`."""
        own = cls.create_shared_stream_producer.__func__  # type: ignore[attr-defined]
        base = BaseEventTrigger.create_shared_stream_producer.__func__  # type: ignore[attr-defined]
        return own is not base

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        """Turn the broadcast raw stream into this trigger's events."""
        raise NotImplementedError(f"{type(self).__qualname__} does not implement a filter")
        yield  # pragma: no cover - makes this an async generator

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """``(classpath, kwargs)``; the kwargs of a group's first subscriber build its producer."""
        cls = type(self)
        kwargs = {k: v for k, v in vars(self).items() if not k.startswith("_")}
        kwargs.pop("asset_store", None)
        return f"{cls.__module__}.{cls.__qualname__}", kwargs

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """The standalone loop of a trigger that does not share (key ``None``)."""
        raise NotImplementedError(f"{type(self).__qualname__} does not implement run()")
        yield  # pragma: no cover
