"""The connector contract: everything a broker's connector needs from core, and nothing else.

- :class:`Connector` (``Connector[YourConfig]``): the broker's binding to the
  engine, registered under the entry-point group ``acklane.connectors``;
- :class:`ConnectorTrigger`: the trigger class of watchers written in Python;
- :func:`verdict` and :class:`Verdict`: what to do with one resolved message;
- :class:`Action`: the names a producer's ``counters()`` may use;
- :class:`CommitLedger`: holds, floors and commit plans of a cumulative-commit broker;
- the lease kit of a broker that settles message by message (SQS, Pub/Sub,
  Service Bus): :class:`ProducerTasks` (owned tasks, a failure latch, an ordered
  close), :class:`SettleBuffer`, :class:`LeaseKeeper` and :func:`beat_interval`,
  :class:`LeaseParking`, :class:`OrderedLanes` (the per-message twin of the
  ledger), :class:`ErrorMap` (an SDK's exceptions onto acklane's error kinds);
- :class:`StreamSettings` and :class:`LeaseStreamSettings`: the settings every
  stream block shares (``max_attempts``, ``dead_letter``; the lease brokers'
  ``redelivery_backoff``, ``restart_lease_hold``, ``advance_linger``, ``heartbeat``),
  one name for one idea on every broker, old names still read with a warning;
- :class:`Reachability`: whether the broker answers, told once per change, the
  source of a producer's ``broker_problem()`` (``/readyz``);
- :class:`Publisher` and :class:`OutgoingMessage`: the optional sending side
  (``acklane publish``), :class:`PublishNotSupported` by default;
- the dead-letter vocabulary lives in :mod:`acklane.core.connectors.deadletter`.

See ``docs/connectors/README.md``.
"""

from ._actions import Action
from ._connector import ConfigT, Connector
from ._errors import ErrorMap
from ._lanes import LaneEntry, LanePlan, OrderedLanes
from ._lease import BoundLot, LeaseKeeper, LeaseParking, ParkedLot, beat_interval, due
from ._ledger import CommitLedger, CommitPlan, LedgerEntry
from ._publish import OutgoingMessage, Publisher, PublishError, PublishNotSupported
from ._reachability import Reachability
from ._registry import ENTRY_POINT_GROUP, UnknownConnector, available_connectors, load_connector
from ._settle import SettleBuffer
from ._stream_settings import (
    DEFAULT_MAX_ATTEMPTS,
    HeartbeatSettings,
    LeaseStreamSettings,
    MaxAttempts,
    RedeliveryBackoff,
    StreamSettings,
    deprecated_names,
    rename_fields,
)
from ._tasks import ProducerTasks, finish_within
from ._trigger import ConnectorTrigger
from ._verdict import Verdict, verdict

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "ENTRY_POINT_GROUP",
    "Action",
    "BoundLot",
    "CommitLedger",
    "CommitPlan",
    "ConfigT",
    "Connector",
    "ConnectorTrigger",
    "ErrorMap",
    "HeartbeatSettings",
    "LaneEntry",
    "LanePlan",
    "LeaseKeeper",
    "LeaseParking",
    "LeaseStreamSettings",
    "LedgerEntry",
    "MaxAttempts",
    "OrderedLanes",
    "OutgoingMessage",
    "ParkedLot",
    "ProducerTasks",
    "PublishError",
    "PublishNotSupported",
    "Publisher",
    "Reachability",
    "RedeliveryBackoff",
    "SettleBuffer",
    "StreamSettings",
    "UnknownConnector",
    "Verdict",
    "available_connectors",
    "beat_interval",
    "deprecated_names",
    "due",
    "finish_within",
    "load_connector",
    "rename_fields",
    "verdict",
]
