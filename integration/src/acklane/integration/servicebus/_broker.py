"""The emulator's state: entities, messages, locks and sessions, without any networking.

Everything here runs on the server's one reactor thread. Times are ``time.time()``
seconds; AMQP timestamps are milliseconds since the Unix epoch.
"""

from __future__ import annotations

import heapq
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import proton
from proton import Data, Described, symbol, timestamp

from ._config import EntityProperties
from ._rules import DEFAULT_RULE, Rule, route

# proton's annotations are narrower than what its message sections accept.
Message: Any = proton.Message

__all__ = [
    "DEAD_LETTER_SUFFIX",
    "Broker",
    "Entity",
    "Lock",
    "Stored",
    "Topic",
]

DEAD_LETTER_SUFFIX = "$deadletterqueue"
_SEQ = symbol("x-opt-sequence-number")
_ENQ = symbol("x-opt-enqueued-time")
_LOCKED = symbol("x-opt-locked-until")
_LOCK_TOKEN = symbol("x-opt-lock-token")
_DL_SOURCE = symbol("x-opt-deadletter-source")
_SCHEDULED = symbol("x-opt-scheduled-enqueue-time")
_STATE = symbol("x-opt-message-state")


@dataclass(slots=True, eq=False)
class Stored:
    """One message in one entity (a topic's copy per subscription is its own)."""

    seq: int
    message: Any
    enqueued: float
    expires: float | None
    session: str | None
    delivery_count: int = 0
    deferred: bool = False
    dead_letter_source: str | None = None
    #: Locks held on it now (its entity's ``locks`` that name it): none to be available.
    locked: int = 0

    def encode(
        self,
        locked_until: float | None = None,
        lock_token: uuid.UUID | None = None,
        state: int | None = None,
    ) -> bytes:
        msg = self.message
        annotations = dict(msg.annotations or {})
        annotations[_SEQ] = self.seq
        if state is not None:
            annotations[_STATE] = state
        else:
            annotations.pop(_STATE, None)
        annotations[_ENQ] = timestamp(int(self.enqueued * 1000))
        if locked_until is not None:
            annotations[_LOCKED] = timestamp(int(locked_until * 1000))
        else:
            annotations.pop(_LOCKED, None)
        if lock_token is not None:
            annotations[_LOCK_TOKEN] = lock_token
        if self.dead_letter_source is not None:
            annotations[_DL_SOURCE] = self.dead_letter_source
        msg.annotations = annotations
        data: bytes = msg.encode()
        raw_body: bytes | None = getattr(msg, "raw_body", None)
        return self._header(msg) + _strip_header(data) + (raw_body or b"")

    def _header(self, msg: Any) -> bytes:
        """The header section with every field written (proton trims a 0 delivery-count,
        and the SDK then reports ``delivery_count`` None)."""
        out = Data()
        out.put_described()
        out.enter()
        out.put_ulong(0x70)
        out.put_list()
        out.enter()
        out.put_bool(bool(msg.durable))
        out.put_ubyte(int(msg.priority))
        if msg.ttl:
            out.put_uint(int(msg.ttl * 1000))
        else:
            out.put_null()
        out.put_bool(self.delivery_count == 0)
        out.put_uint(self.delivery_count)
        out.exit()
        out.exit()
        encoded: bytes = out.encode()
        return encoded


_BODY_SECTIONS = (0x75, 0x76, 0x77)  # data, amqp-sequence, amqp-value
_FOOTER = 0x78


def decode_message(raw: bytes) -> Any:
    """An AMQP message as proton reads it, whatever body the SDK sent.

    proton cannot turn every valid body into Python objects (a map with binary keys:
    its ``memoryview`` keys are unhashable; several data or sequence sections: it
    keeps the last). Such a body is kept as its encoded
    sections (``raw_body``) and sent on byte for byte, as the service does; only the
    header, annotations and properties are read. A message that is not valid AMQP
    still raises.
    """
    # several data or sequence sections: proton keeps only the last one (a cheap
    # byte search; a false hit only costs the section walk below)
    several = raw.count(b"\x00Su") > 1 or raw.count(b"\x00Sv") > 1
    if not several:
        message = Message()
        try:
            message.decode(raw)
            message.raw_body = None
            return message
        except (ValueError, TypeError, KeyError):
            pass
    head = bytearray()
    body = bytearray()
    offset = 0
    while offset < len(raw):
        data = Data()
        used = data.decode(raw[offset:])
        section = raw[offset : offset + used]
        offset += used
        data.rewind()
        data.next()
        data.enter()
        data.next()
        descriptor = data.get_ulong() if data.type() == Data.ULONG else None
        if descriptor in _BODY_SECTIONS or descriptor == _FOOTER:
            body += section
        else:
            head += section
    message = Message()
    if head:
        message.decode(bytes(head))
    message.body = None
    message.raw_body = bytes(body)
    return message


def copy_message(message: Any) -> Any:
    """A copy of a decoded message that keeps a body proton could not read."""
    raw = message.encode()
    raw_body: bytes | None = getattr(message, "raw_body", None)
    copy = decode_message(raw + raw_body if raw_body else raw)
    return copy


def _strip_header(raw: bytes) -> bytes:
    """``raw`` without its header section, if it has one."""
    data = Data()
    used = data.decode(raw)
    data.rewind()
    data.next()
    value = data.get_object()
    if isinstance(value, Described) and value.descriptor == 0x70:
        return raw[used:]
    return raw


@dataclass(slots=True, eq=False)
class Lock:
    token: uuid.UUID
    stored: Stored
    until: float
    #: The delivery on a receive link (settled through it), None for a lock taken by
    #: receive-by-sequence-number (settled through $management).
    delivery: Any = None
    session: SessionState | None = None


@dataclass(slots=True, eq=False)
class SessionState:
    session_id: str
    owner: Any = None  # the link holding the session lock
    until: float = 0.0
    state: bytes | None = None
    #: When ``state`` was last set (``time.time()``), for list-sessions' filter.
    state_updated: float = 0.0


class Entity:
    """A queue, a subscription, or the dead-letter sub-queue of one of them."""

    def __init__(self, path: str, props: EntityProperties, *, dead_letter: bool = False) -> None:
        self.path = path
        #: A subscription's rules, by name (None for a queue or a dead-letter sub-queue).
        self.rules: dict[str, Rule] | None = None
        self.props = props
        self.is_dead_letter = dead_letter
        self.messages: dict[int, Stored] = {}  # every message not yet removed, by seq
        self._ready: dict[str | None, list[int]] = {}  # heaps of available seqs, per session
        self.locks: dict[uuid.UUID, Lock] = {}
        self.sessions: dict[str, SessionState] = {}
        self.scheduled: dict[int, Stored] = {}
        self.consumers: list[Any] = []  # sender links (our side) receiving from here
        self.dlq: Entity | None = (
            None
            if dead_letter
            else Entity(f"{path}/$DeadLetterQueue", EntityProperties(), dead_letter=True)
        )

    @property
    def sessionful(self) -> bool:
        return self.props.requires_session and not self.is_dead_letter

    # -- state

    def add(self, stored: Stored) -> None:
        self.messages[stored.seq] = stored
        self.make_ready(stored)

    def make_ready(self, stored: Stored) -> None:
        key = stored.session if self.sessionful else None
        if key is not None:
            self.sessions.setdefault(key, SessionState(key))
        heapq.heappush(self._ready.setdefault(key, []), stored.seq)

    def next_ready(self, session: str | None, now: float) -> Stored | None:
        """Pop the lowest-sequence available message of ``session`` (None: no sessions)."""
        heap = self._ready.get(session)
        while heap:
            seq = heapq.heappop(heap)
            stored = self.messages.get(seq)
            if stored is None or stored.deferred or self._is_locked(stored):
                continue
            if stored.expires is not None and stored.expires <= now:
                self.expire(stored)
                continue
            return stored
        return None

    def has_ready(self, session: str | None) -> bool:
        heap = self._ready.get(session)
        if not heap:
            return False
        return any(
            (s := self.messages.get(seq)) is not None and not s.deferred and not self._is_locked(s)
            for seq in heap
        )

    @staticmethod
    def _is_locked(stored: Stored) -> bool:
        return stored.locked > 0  # kept by lock() and settle(): no walk over every lock

    def expire(self, stored: Stored) -> None:
        self.messages.pop(stored.seq, None)
        if self.props.dead_lettering_on_expiration and self.dlq is not None:
            self.dead_letter(stored, "TTLExpiredException", "The message expired.", remove=False)

    def dead_letter(
        self, stored: Stored, reason: str | None, description: str | None, *, remove: bool = True
    ) -> None:
        if remove:
            self.messages.pop(stored.seq, None)
        if self.dlq is None:
            return  # dead-lettering from a dead-letter queue: nothing more to do
        props: dict[Any, Any] = dict(stored.message.properties or {})
        if reason is not None:
            props["DeadLetterReason"] = reason
        if description is not None:
            props["DeadLetterErrorDescription"] = description
        stored.message.properties = props
        stored.dead_letter_source = self.path
        stored.expires = None
        self.dlq.add(stored)

    def lock(self, stored: Stored, until: float, delivery: Any = None) -> Lock:
        token = uuid.uuid4()
        session = self.sessions.get(stored.session) if self.sessionful and stored.session else None
        lock = Lock(token, stored, until, delivery, session)
        self.locks[token] = lock
        stored.locked += 1
        return lock

    def settle(
        self,
        lock: Lock,
        outcome: str,
        *,
        reason: str | None = None,
        description: str | None = None,
        count: bool = True,
    ) -> None:
        """Apply ``complete`` / ``abandon`` / ``defer`` / ``dead-letter`` / ``release``."""
        stored = lock.stored
        if self.locks.pop(lock.token, None) is not None:
            stored.locked -= 1
        if outcome == "complete":
            self.messages.pop(stored.seq, None)
        elif outcome == "dead-letter":
            self.dead_letter(stored, reason, description)
        elif outcome == "defer":
            stored.deferred = True
        elif outcome in ("abandon", "release", "expire"):
            if count:
                stored.delivery_count += 1
            if stored.delivery_count >= self.props.max_delivery_count and not self.is_dead_letter:
                self.dead_letter(
                    stored,
                    "MaxDeliveryCountExceeded",
                    f"Message could not be consumed after {self.props.max_delivery_count} "
                    "delivery attempts.",
                )
            else:
                stored.deferred = False
                self.make_ready(stored)
        else:  # pragma: no cover - callers pass known outcomes
            raise ValueError(outcome)

    def peekable(self) -> Iterator[Stored]:
        """What a peek sees, in sequence order: active and deferred messages, and the
        scheduled ones not enqueued yet (the service shows those too)."""
        now = time.time()
        merged = {**self.scheduled, **self.messages}
        for seq in sorted(merged):
            stored = merged[seq]
            if stored.expires is None or stored.expires > now:
                yield stored

    def state_of(self, stored: Stored) -> int:
        """``x-opt-message-state``: 0 active, 1 deferred, 2 scheduled."""
        if stored.seq in self.scheduled and stored.seq not in self.messages:
            return 2
        return 1 if stored.deferred else 0

    def counts(self) -> dict[str, int]:
        return {
            "messages": len(self.messages),
            "locked": len(self.locks),
            "deferred": sum(1 for s in self.messages.values() if s.deferred),
            "scheduled": len(self.scheduled),
            "dead_letter": 0 if self.dlq is None else len(self.dlq.messages),
        }


@dataclass(slots=True, eq=False)
class Topic:
    name: str
    subscriptions: dict[str, Entity] = field(default_factory=dict)


class Broker:
    """One namespace: its queues and topics, and a sequence counter per entity."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.queues: dict[str, Entity] = {}
        self.topics: dict[str, Topic] = {}
        self._seq: dict[str, int] = {}
        #: Called after something became available (the server pumps its links).
        self.on_ready: Callable[[Entity], None] = lambda entity: None

    # -- administration

    def create_queue(self, name: str, props: EntityProperties) -> Entity:
        key = name.lower()
        if key in self.queues or key in self.topics:
            raise ValueError(f"entity {name!r} already exists")
        entity = self.queues[key] = Entity(name, props)
        self._seq[key] = 0
        return entity

    def create_topic(
        self,
        name: str,
        subscriptions: dict[str, EntityProperties],
        rules: Mapping[str, Sequence[Rule]] | None = None,
    ) -> Topic:
        """A topic and its subscriptions, each with its rules (``$Default``, a true
        filter, for a subscription declared without any)."""
        key = name.lower()
        if key in self.queues or key in self.topics:
            raise ValueError(f"entity {name!r} already exists")
        topic = Topic(name)
        for sub, props in subscriptions.items():
            entity = Entity(f"{name}/Subscriptions/{sub}", props)
            declared = list((rules or {}).get(sub, ()))
            entity.rules = (
                {r.name: r for r in declared} if declared else {DEFAULT_RULE: Rule.true()}
            )
            topic.subscriptions[sub.lower()] = entity
        self.topics[key] = topic
        self._seq[key] = 0
        return topic

    def delete(self, name: str) -> list[Entity]:
        """Remove a queue or a topic; returns the receivable entities that went with it."""
        key = name.lower()
        self._seq.pop(key, None)
        if key in self.queues:
            return [self.queues.pop(key)]
        topic = self.topics.pop(key, None)
        if topic is None:
            raise KeyError(name)
        return list(topic.subscriptions.values())

    # -- addressing

    def resolve(self, path: str) -> Entity | None:
        """The receivable entity at ``path`` (``q``, ``q/$DeadLetterQueue``,
        ``t/Subscriptions/s``, ``t/Subscriptions/s/$DeadLetterQueue``)."""
        parts = [p for p in path.strip("/").split("/") if p]
        dead = bool(parts) and parts[-1].lower() == DEAD_LETTER_SUFFIX
        if dead:
            parts = parts[:-1]
        entity: Entity | None = None
        if len(parts) == 1:
            entity = self.queues.get(parts[0].lower())
        elif len(parts) == 3 and parts[1].lower() == "subscriptions":
            topic = self.topics.get(parts[0].lower())
            entity = None if topic is None else topic.subscriptions.get(parts[2].lower())
        if entity is None:
            return None
        return entity.dlq if dead else entity

    def is_send_target(self, path: str) -> bool:
        key = path.strip("/").lower()
        return key in self.queues or key in self.topics

    # -- sending

    def enqueue(self, path: str, message: Any, *, scheduled: bool = False) -> int:
        """Store ``message`` in a queue or a topic's subscriptions; returns its sequence number."""
        key = path.strip("/").lower()
        self._seq[key] = seq = self._seq.get(key, 0) + 1
        targets = (
            [self.queues[key]]
            if key in self.queues
            else list(self.topics[key].subscriptions.values())
        )
        now = time.time()
        annotations: dict[Any, Any] = message.annotations or {}
        when = annotations.get(_SCHEDULED) if scheduled else None
        for entity in targets:
            copies = (
                [copy_message(message)]
                if entity.rules is None
                else route(entity.rules, message, copy_message)
            )
            for n, copy in enumerate(copies):
                if n:  # a second copy in one subscription (several rules with actions)
                    self._seq[key] = self._seq[key] + 1
                this_seq = seq if not n else self._seq[key]
                ttl = copy.ttl if copy.ttl else None
                if entity.props.default_ttl is not None:
                    ttl = min(ttl, entity.props.default_ttl) if ttl else entity.props.default_ttl
                stored = Stored(
                    seq=this_seq,
                    message=copy,
                    enqueued=now,
                    expires=None if ttl is None else now + ttl,
                    session=copy.group_id,
                )
                if when is not None and float(when) / 1000 > now:
                    entity.scheduled[this_seq] = stored
                else:
                    entity.add(stored)
            if copies and (when is None or float(when) / 1000 <= now):
                self.on_ready(entity)
        return seq

    def cancel_scheduled(self, path: str, seqs: list[int]) -> None:
        key = path.strip("/").lower()
        entities = (
            [self.queues[key]]
            if key in self.queues
            else list(self.topics[key].subscriptions.values())
        )
        for entity in entities:
            for seq in seqs:
                entity.scheduled.pop(seq, None)

    def entities(self) -> Iterator[Entity]:
        for queue in self.queues.values():
            yield queue
            assert queue.dlq is not None
            yield queue.dlq
        for topic in self.topics.values():
            for sub in topic.subscriptions.values():
                yield sub
                assert sub.dlq is not None
                yield sub.dlq
