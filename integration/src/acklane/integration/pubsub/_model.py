"""The emulator's records: topics, subscriptions and their backlogs, open streams,
snapshots, and the names and limits the service checks.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ._filter import Predicate

__all__ = [
    "DEFAULT_ACK_DEADLINE",
    "DEFAULT_RETENTION",
    "DELETED_TOPIC",
    "MAX_ACK_DEADLINE",
    "MAX_SUBSCRIPTION_RETENTION",
    "MAX_TOPIC_RETENTION",
    "MIN_RETENTION",
]

_TOPIC = re.compile(r"^projects/([^/]+)/topics/([A-Za-z][A-Za-z0-9._~%+-]{2,254})$")
_SUBSCRIPTION = re.compile(r"^projects/([^/]+)/subscriptions/([A-Za-z][A-Za-z0-9._~%+-]{2,254})$")
_PROJECT = re.compile(r"^projects/([^/]+)$")
DELETED_TOPIC = "_deleted-topic_"
DEFAULT_ACK_DEADLINE = 10
MAX_ACK_DEADLINE = 600
#: How long a subscription keeps unacked messages unless told otherwise (7 days).
DEFAULT_RETENTION = 7 * 24 * 3600.0
MIN_RETENTION = 600.0
MAX_SUBSCRIPTION_RETENTION = 7 * 24 * 3600.0
MAX_TOPIC_RETENTION = 31 * 24 * 3600.0
_SNAPSHOT = re.compile(r"^projects/([^/]+)/snapshots/([A-Za-z][A-Za-z0-9._~%+-]{2,254})$")


@dataclass(eq=False)
class _Snapshot:
    config: Any  # Snapshot
    #: The messages a seek to it makes unacked again: those unacked when it was taken,
    #: and every message published to its topic since.
    messages: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class _Entry:
    """One message of one subscription's backlog."""

    seq: int
    message: Any  # PubsubMessage (protobuf)
    attempts: int = 0
    ack_id: str | None = None
    deadline: float = 0.0
    available_at: float = 0.0
    stream: _Stream | None = None

    @property
    def key(self) -> str:
        return str(self.message.ordering_key)


@dataclass(eq=False)
class _Stream:
    """One open StreamingPull: its deadline and its flow control."""

    deadline: int
    max_messages: int
    max_bytes: int
    leased: dict[str, _Entry] = field(default_factory=dict)

    def prune(self, now: float) -> None:
        for ack_id, entry in list(self.leased.items()):
            if entry.ack_id != ack_id or entry.deadline <= now:
                del self.leased[ack_id]

    def room(self) -> tuple[int, int]:
        messages = self.max_messages - len(self.leased) if self.max_messages > 0 else 1 << 30
        used = sum(e.message.ByteSize() for e in self.leased.values())
        size = self.max_bytes - used if self.max_bytes > 0 else 1 << 62
        return messages, size


@dataclass(eq=False)
class _Topic:
    config: Any  # Topic
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    subscriptions: set[str] = field(default_factory=set)
    #: Messages kept for seeking back (``message_retention_duration`` set on the topic).
    log: list[Any] = field(default_factory=list)
    snapshots: set[str] = field(default_factory=set)

    @property
    def retention(self) -> float:
        """Seconds the topic keeps its messages for seeking (0: it keeps none)."""
        if not self.config.HasField("message_retention_duration"):
            return 0.0
        return float(self.config.message_retention_duration.ToTimedelta().total_seconds())


@dataclass(eq=False)
class _Subscription:
    config: Any  # Subscription
    backlog: dict[int, _Entry] = field(default_factory=dict)
    by_ack: dict[str, _Entry] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    #: The compiled ``filter`` (``None``: every message).
    predicate: Predicate | None = None
    #: Acked messages kept for seeking back (``retain_acked_messages``), by message id.
    acked: dict[str, Any] = field(default_factory=dict)
    #: When it was created (ns since the epoch): a seek cannot bring back what came before.
    created_ns: int = 0

    @property
    def ordered(self) -> bool:
        return bool(self.config.enable_message_ordering)

    @property
    def exactly_once(self) -> bool:
        return bool(self.config.enable_exactly_once_delivery)

    def wants(self, message: Any) -> bool:
        return self.predicate is None or self.predicate(message.attributes)

    @property
    def retention(self) -> float:
        if not self.config.HasField("message_retention_duration"):
            return DEFAULT_RETENTION
        return float(self.config.message_retention_duration.ToTimedelta().total_seconds())

    def poke(self) -> None:
        self.changed.set()
