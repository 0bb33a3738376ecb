"""What watches the engine: one protocol, called with plain values, in a fixed order.

Tracing, progress lines, the poison policy's progress books, the runner's reactions
and a display (the demo) all learn of the engine's moments the same way: a
:class:`Hooks` whose methods they override. The engine calls them with plain values
(keys, trigger ids, raw messages, payloads, advance batches), never with its own
books, so a hook can neither read nor change them.

Every method is a no-op here. A moment nobody overrides costs nothing: the engine
asks :func:`hook_of` once (when a group starts) and calls nothing per message when
it answers None. :class:`HookChain` calls several hooks in the order it was given.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple

if TYPE_CHECKING:
    from ..producer import AdvanceItem
    from ..trigger import TriggerEvent
    from ._types import BoundEvent

#: What a watcher made of a message (:attr:`Verdict.outcome`).
FIRED: Final = "fired"
ACKED: Final = "acked"
REJECTED: Final = "rejected"
FAILED: Final = "failed"


class Received(NamedTuple):
    """A message the poll took: the raw event filters read, the producer's payload
    (what :meth:`Hooks.advanced` hands back), and its identity (None: it has none)."""

    raw: Any
    payload: Any
    message_id: str | None


class Verdict(NamedTuple):
    """What one watcher made of one message, once it was done with it: ``outcome`` is
    :data:`FIRED` (``events`` trigger events), :data:`ACKED` (none), :data:`REJECTED`
    (with the watcher's ``reason``, if it gave one) or :data:`FAILED`."""

    watcher: str
    outcome: str
    events: int = 0
    reason: str | None = None


class Hooks:
    """Everything that watches the engine overrides what it needs; the rest are no-ops.

    Called synchronously on the event loop. An exception from :meth:`advanced`,
    :meth:`subscriber_failed` or :meth:`subscriber_leaving` is logged, never raised
    into the engine (a hook must never break the ack channel).
    """

    # -- the engine (the manager's groups)

    def received(self, key: Hashable, messages: Sequence[Received]) -> None:
        """The poll of ``key`` took ``messages`` and broadcasts them now."""

    def filtered(self, key: Hashable, message: Received, verdict: Verdict) -> None:
        """A watcher of ``key`` is done with ``message`` (its ``message_id`` may be None
        here even when it has one)."""

    def advanced(self, key: Hashable, batch: Sequence[AdvanceItem]) -> None:
        """The producer of ``key`` advanced the broker past ``batch``."""

    def subscriber_failed(self, key: Hashable, trigger_id: str, error: BaseException) -> None:
        """A subscriber was force-failed with ``error`` (not when its whole group failed)."""

    def subscriber_leaving(self, key: Hashable, trigger_id: str, how: str) -> None:
        """A live subscription ends in order (``how``), just *before* it leaves: an
        orderly leave acks the event it is on and takes it out of later broadcasts, so a
        caller for whom that is a failure fails the group here."""

    # -- the runner

    def fired(self, watcher: str, event: TriggerEvent, message_id: str | None) -> None:
        """A watcher yielded a trigger event (before it is stored)."""

    def stored(self, key: Hashable, watcher: str, bound: BoundEvent | None) -> None:
        """The event store queued a trigger event of ``watcher`` (``bound`` to its
        message, or None)."""

    def rejected_payload(self, watcher: str, error: Exception) -> None:
        """A watcher yielded a payload that is not JSON; its raw event was rejected."""

    def committed(self, seqs: Sequence[int]) -> None:
        """The event store committed these bound events (before the engine hears it)."""

    def cohort_failed(self, key: Hashable, error: BaseException, delay: float) -> None:
        """The watchers of ``key`` failed and restart after ``delay`` seconds."""

    def abandoned(self, key: Hashable, why: str) -> None:
        """The group of ``key`` is gone: what it never advanced, the broker redelivers."""


class HookChain(Hooks):
    """Several hooks, each moment called on each of them in the order given."""

    def __init__(self, *hooks: Hooks) -> None:
        flat: list[Hooks] = []
        for hook in hooks:
            flat.extend(hook.hooks if isinstance(hook, HookChain) else (hook,))
        self.hooks: tuple[Hooks, ...] = tuple(flat)

    def _each(self, name: str) -> list[Callable[..., None]]:
        return [getattr(h, name) for h in self.hooks if _overrides(h, name)]

    def received(self, key: Hashable, messages: Sequence[Received]) -> None:
        for call in self._each("received"):
            call(key, messages)

    def filtered(self, key: Hashable, message: Received, verdict: Verdict) -> None:
        for call in self._each("filtered"):
            call(key, message, verdict)

    def advanced(self, key: Hashable, batch: Sequence[AdvanceItem]) -> None:
        for call in self._each("advanced"):
            call(key, batch)

    def subscriber_failed(self, key: Hashable, trigger_id: str, error: BaseException) -> None:
        for call in self._each("subscriber_failed"):
            call(key, trigger_id, error)

    def subscriber_leaving(self, key: Hashable, trigger_id: str, how: str) -> None:
        for call in self._each("subscriber_leaving"):
            call(key, trigger_id, how)

    def fired(self, watcher: str, event: TriggerEvent, message_id: str | None) -> None:
        for call in self._each("fired"):
            call(watcher, event, message_id)

    def stored(self, key: Hashable, watcher: str, bound: BoundEvent | None) -> None:
        for call in self._each("stored"):
            call(key, watcher, bound)

    def rejected_payload(self, watcher: str, error: Exception) -> None:
        for call in self._each("rejected_payload"):
            call(watcher, error)

    def committed(self, seqs: Sequence[int]) -> None:
        for call in self._each("committed"):
            call(seqs)

    def cohort_failed(self, key: Hashable, error: BaseException, delay: float) -> None:
        for call in self._each("cohort_failed"):
            call(key, error, delay)

    def abandoned(self, key: Hashable, why: str) -> None:
        for call in self._each("abandoned"):
            call(key, why)


def verdict_of(watcher: str, verdict: Any) -> Verdict:
    """An inline filter's answer as a :class:`Verdict`: a list of payloads (fired, or
    acked when empty), a ``Rejected`` (its reason), or None (the filter raised)."""
    said: tuple[str, str, int, str | None]
    if verdict is None:
        said = (watcher, FAILED, 0, None)
    elif type(verdict) is list:
        said = (watcher, FIRED, len(verdict), None) if verdict else (watcher, ACKED, 0, None)
    else:
        said = (watcher, REJECTED, 0, getattr(verdict, "reason", None))
    return _new_verdict(Verdict, said)


# Builds a Verdict without its Python-level __new__ (once per message and watcher).
_new_verdict = tuple.__new__


def hook_of(hooks: Hooks, name: str) -> Callable[..., None] | None:
    """``hooks``' method ``name`` when some hook overrides it, else None: what a hot path
    looks up once, so that a moment nobody watches costs nothing per message."""
    if isinstance(hooks, HookChain):
        calls = hooks._each(name)
        if not calls:
            return None
        if len(calls) == 1:
            return calls[0]
    elif not _overrides(hooks, name):
        return None
    method: Callable[..., None] = getattr(hooks, name)
    return method


def _overrides(hook: Hooks, name: str) -> bool:
    """Whether ``hook``'s class (or the instance itself) replaces the no-op ``name``."""
    method = getattr(hook, name)
    return getattr(method, "__func__", None) is not getattr(Hooks, name)


class Callbacks(Hooks):
    """The manager's Airflow-shaped constructor callbacks (``on_advance``,
    ``on_subscriber_failed``, ``on_subscriber_leaving``) as hooks."""

    def __init__(
        self,
        on_advance: Callable[[Hashable, Sequence[AdvanceItem]], None] | None,
        on_subscriber_failed: Callable[[Hashable, str, BaseException], None] | None,
        on_subscriber_leaving: Callable[[Hashable, str, str], None] | None,
    ) -> None:
        # only what was given: a moment without its callback stays a no-op (see hook_of)
        if on_advance is not None:
            self.advanced = on_advance  # type: ignore[method-assign,assignment]
        if on_subscriber_failed is not None:
            self.subscriber_failed = on_subscriber_failed  # type: ignore[method-assign,assignment]
        if on_subscriber_leaving is not None:
            self.subscriber_leaving = on_subscriber_leaving  # type: ignore[method-assign,assignment]
