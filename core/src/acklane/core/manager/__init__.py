"""The shared stream manager: one poll per key, fan-out, the ledger, and the advance pump.

Bookkeeping is per subscriber, not per event: each subscriber consumes its queue in
order, so an event only carries counters (how many snapshot members have yet to
resolve it, and how they did). Per delivery the engine does a queue append, a
pop, and a counter decrement; no per-event sets or dicts of subscribers exist.

The contract is docs/engine.md. Private modules, one concept each:

- ``_manager``: :class:`SharedStreamManager` (subscribing, the binding channel, groups)
- one key's group, one class in a layer per concept: ``_group_base`` (its state, the
  one resolve-and-ack routine, message identities), ``_poison`` (the poison policy's
  moments), ``_lanes`` (the ledger's lanes and the pump), ``_members`` (membership,
  failure propagation, room), ``_delivery`` (inline members evaluated by the
  broadcast), ``_broadcast`` (the poll's paths), ``_sweep`` (the ack timeout) and
  ``_group`` (its lifecycle, and ``GroupHost``: all it may use of its manager)
- ``_hooks``: :class:`Hooks`, what watches the engine (tracing, progress, the runner, a
  display), called with plain values; :class:`HookChain` calls several in order
- ``_subscriber``: one member (its queue, its binding window, the stream its filter reads,
  or, for an inline member, the filter the broadcast evaluates)
- ``_ledger``: a broadcast event's record, the resolution kinds, outcomes
- ``_settings``: refusing a member whose stream settings differ from its group's
- ``_types``: public value types and observer shapes; ``_common``: the logger

The underscored names re-exported here (and ``log``) are not API: they stay
reachable at their pre-package path for tests and debugging.
"""

from __future__ import annotations

from ._common import log as log
from ._group import _Group as _Group
from ._hooks import ACKED, FAILED, FIRED, REJECTED, HookChain, Hooks, Received, Verdict, hook_of
from ._ledger import _CLEAN_CACHE as _CLEAN_CACHE
from ._ledger import _Entry as _Entry
from ._manager import (
    CONSUMER_CLOSED,
    FILTER_RETURNED,
    InlineSubscription,
    SharedStreamManager,
    Subscription,
)
from ._subscriber import _Binding as _Binding
from ._subscriber import _Subscriber as _Subscriber
from ._types import (
    AdvanceObserver,
    BoundEvent,
    FailureObserver,
    GroupStats,
    InlineEmit,
    InlineEvaluate,
    InlineReady,
    LeaveObserver,
    PoisonPolicy,
    Rejected,
)

__all__ = [
    "ACKED",
    "CONSUMER_CLOSED",
    "FAILED",
    "FILTER_RETURNED",
    "FIRED",
    "REJECTED",
    "AdvanceObserver",
    "BoundEvent",
    "FailureObserver",
    "GroupStats",
    "HookChain",
    "Hooks",
    "InlineEmit",
    "InlineEvaluate",
    "InlineReady",
    "InlineSubscription",
    "LeaveObserver",
    "PoisonPolicy",
    "Received",
    "Rejected",
    "SharedStreamManager",
    "Subscription",
    "Verdict",
    "hook_of",
]
