"""The subscriber side: trigger base class, trigger events, and rejecting an event."""

from __future__ import annotations

import logging
import sys
from abc import ABCMeta
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
    "uses_ack_channel",
]

log = logging.getLogger("acklane.core.trigger")

#: Airflow's shared-stream module. acklane never imports Airflow: it only looks in
#: ``sys.modules``, so that in a process that has loaded Airflow both work together.
AIRFLOW_SHARED_STREAM = "airflow.triggers.shared_stream"


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


# Airflow's AckTimeout is another class (it does not derive from acklane's errors).
# When Airflow is loaded, the engine raises an acklane AckTimeout that is an instance
# of Airflow's too, so that code written against either catches it: one class per
# Airflow class, made at the first timeout (never at import).
_AIRFLOW_ACK_TIMEOUTS: dict[type[BaseException], type[AckTimeout]] = {}


def ack_timeout_error(text: str) -> AckTimeout:
    """The engine's :class:`AckTimeout`, also an instance of Airflow's when Airflow is loaded."""
    airflow = sys.modules.get(AIRFLOW_SHARED_STREAM)
    theirs = None if airflow is None else getattr(airflow, "AckTimeout", None)
    if not (isinstance(theirs, type) and issubclass(theirs, Exception)):
        return AckTimeout(text)
    cls = _AIRFLOW_ACK_TIMEOUTS.get(theirs)
    if cls is None:
        cls = _AIRFLOW_ACK_TIMEOUTS[theirs] = _both_ack_timeouts(theirs)
    return cls(text)


def _both_ack_timeouts(theirs: type[Exception]) -> type[AckTimeout]:
    """A subclass of acklane's and Airflow's ``AckTimeout`` (pickled as acklane's)."""

    def __reduce__(self: AckTimeout) -> tuple[type[AckTimeout], tuple[Any, ...]]:
        return AckTimeout, self.args

    namespace = {"__module__": __name__, "__qualname__": "AckTimeout", "__reduce__": __reduce__}
    return type("AckTimeout", (AckTimeout, theirs), namespace)


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

    A filter running under Airflow's ``SharedStreamManager`` (Airflow loaded, its
    binding window open in this task) is rejected through Airflow's own function;
    Airflow's outcome has no room for a reason, so the reason is only logged.
    """
    window = current_window.get()
    if window is not None and window.reject(reason):
        return
    if _airflow_reject(reason):
        return
    log.warning(
        "reject_shared_stream_event() called outside a binding window; ignored "
        "(fast path, standalone run(), or between two events)"
    )


def _airflow_reject(reason: str | None) -> bool:
    """Reject through Airflow's window, if Airflow is loaded and has one open here."""
    airflow = sys.modules.get(AIRFLOW_SHARED_STREAM)
    if airflow is None:
        return False
    context = getattr(airflow, "_reject_context", None)
    window = None if context is None else context.get()
    if window is None or getattr(window, "acklane_window", False):
        return False  # none open, or acklane's manager's own (which just declined)
    if reason:
        log.info("rejected under Airflow's manager, which keeps no reason: %s", reason)
    airflow.reject_shared_stream_event()
    return True


def _is_base_trigger(klass: type) -> bool:
    """acklane's or Airflow's ``BaseEventTrigger`` (Airflow's recognised by name only)."""
    return klass is BaseEventTrigger or (
        klass.__qualname__ == "BaseEventTrigger" and klass.__module__ == "airflow.triggers.base"
    )


def uses_ack_channel(cls: type) -> bool:
    """Whether instances of ``cls`` share a stream in ack mode (else the fast path).

    Airflow's rule, so that both managers put a trigger class in the same mode:
    walk the MRO up to the base trigger class (acklane's or Airflow's); ack mode
    when a class on the way defines ``create_shared_stream_producer`` itself.
    """
    for klass in cls.__mro__:
        if _is_base_trigger(klass):
            return False
        if "create_shared_stream_producer" in vars(klass):
            return True
    return False


class _TriggerClass(ABCMeta):
    """The metaclass of :class:`BaseEventTrigger`: where its default
    ``create_shared_stream_producer`` lives.

    Airflow's base class defines that classmethod (raising ``NotImplementedError``),
    and Airflow's manager puts a class in ack mode when a class of its MRO defines it
    itself, walking up to *Airflow's* base only. On acklane's base it would be found by
    that walk, and every acklane trigger would run in ack mode under Airflow's manager.
    Defined here, ``SomeTrigger.create_shared_stream_producer(kwargs)`` still finds it
    (a class's attribute lookup ends at its metaclass) while no class's ``__dict__``
    holds it, so both managers' walks see only a subclass's own definition.
    (``ABCMeta``: a trigger may also derive from an ABC, or from Airflow's base.)
    """

    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """Ack mode: a subclass that shares its stream in ack mode defines this."""
        raise NotImplementedError(
            f"{cls.__name__} does not implement create_shared_stream_producer"
        )


class BaseEventTrigger(metaclass=_TriggerClass):
    """Base class of triggers (watchers) that may share one upstream poll.

    Subclasses opt in to sharing by returning a key from :meth:`shared_stream_key`
    and by providing either :meth:`open_shared_stream` (fast path, nothing is
    acknowledged) or :meth:`create_shared_stream_producer` (ack mode). The
    constructor takes no arguments, so subclasses need not call it with any. The
    defaults raise what Airflow's raise, in its words.
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
        raise NotImplementedError(
            f"{cls.__name__} declares a shared_stream_key but does not implement open_shared_stream"
        )

    if TYPE_CHECKING:
        # At run time the default is the metaclass's (_TriggerClass): found on every
        # trigger class, in none of their __dict__s, so it puts no class in ack mode.

        @classmethod
        def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
            """Ack mode: the producer that owns the broker connection for one group."""
            ...

    else:

        def __getattr__(self, name: str) -> Any:
            # A trigger's own create_shared_stream_producer is found as on Airflow's base
            # (only this name: any other miss is the usual AttributeError).
            if name == "create_shared_stream_producer":
                return getattr(type(self), name)
            raise AttributeError(
                f"{type(self).__name__!r} object has no attribute {name!r}", name=name, obj=self
            )

    @classmethod
    def uses_ack_channel(cls) -> bool:
        """True in ack mode: a subclass defines ``create_shared_stream_producer``."""
        return uses_ack_channel(cls)

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        """Turn the broadcast raw stream into this trigger's events."""
        raise NotImplementedError(
            f"{type(self).__name__} declares a shared_stream_key but does not implement "
            "filter_shared_stream"
        )
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
