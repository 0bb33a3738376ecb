"""One broker kit per connector: what a conformance test needs of a broker, seen from outside.

A :class:`BrokerKit` makes throw-away sources on a live broker (a topic, a queue, a
subscription, each with its dead-letter destination), publishes to them, reads the
dead-letter copies back, and tells how many messages of a source are not advanced yet
(not committed past, deleted, acked, completed or dead-lettered), all with the
broker's own client, never through acklane. It also gives the stream block that reads
a source (:meth:`BrokerKit.fields`), and the ways the suite makes the broker fail an
advance (:meth:`BrokerKit.advance_failure`) or start a source's life again
(:meth:`BrokerKit.recreate`).

``tests/test_conformance.py`` runs one suite of the connector rules on every kit,
under the same test names. A new connector implements a kit, adds it to
:data:`KITS`, and passes the suite (``docs/connectors/README.md``).

- :class:`MemoryBrokerKit`: the in-process broker, no emulator;
- :class:`KafkaBrokerKit`: a Kafka emulator (tansu), through confluent-kafka;
- :class:`SqsBrokerKit`: moto, through aioboto3 (:class:`~acklane.integration.sqs.SqsQueues`);
- :class:`PubSubBrokerKit`: acklane's Pub/Sub emulator, through google-cloud-pubsub;
- :class:`ServiceBusBrokerKit`: acklane's Service Bus emulator, through azure-servicebus.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, ClassVar, NamedTuple, Self

from acklane.core.connectors.deadletter import REJECT_REASON
from acklane.core.producer import AdvanceOutcome

from .emulator import Emulator, EmulatorError

__all__ = [
    "KITS",
    "AdvanceFailure",
    "BrokerKit",
    "DeadLetter",
    "KafkaBrokerKit",
    "MemoryBrokerKit",
    "PubSubBrokerKit",
    "ServiceBusBrokerKit",
    "Source",
    "SqsBrokerKit",
    "Unusable",
    "kit_for",
    "yaml_block",
]

#: The outcome of a message its watchers rejected, for the advance failures below.
_REJECTED = AdvanceOutcome(acked=0, failed=0, rejected=1, reject_reasons=("refused copy",))
_CLEAN = AdvanceOutcome(acked=1, failed=0)


@dataclass(slots=True)
class Source:
    """A source a kit made: where messages are published and what reads them."""

    #: The topic, the queue (URL) or the subscription, as the kit names it.
    name: str
    #: Whether its messages keep their order per lane (a partition, a FIFO group, an
    #: ordering key, a session); one lane when :meth:`BrokerKit.publish` gives none.
    ordered: bool
    #: The stream block's settings that read it (``connector`` excepted).
    fields: dict[str, Any]
    #: What else the kit keeps of it (the topic behind a subscription, a group...).
    extra: dict[str, Any] = field(default_factory=dict)
    #: Messages published to it so far.
    published: int = 0


class DeadLetter(NamedTuple):
    """A dead-letter copy as the broker holds it: the original body and acklane's reason."""

    body: bytes
    reason: str


class AdvanceFailure(NamedTuple):
    """How the broker is made to fail an advance: publish ``body``, read it with the
    stream ``fields`` (over the source's own), advance it with ``outcome``."""

    fields: dict[str, Any]
    body: str
    outcome: AdvanceOutcome


class Unusable(NamedTuple):
    """A stream block the broker cannot be used with, and what ``acklane run`` says of it.

    ``secret``: a credential in ``fields`` that must never be printed (``""``: none).
    """

    fields: dict[str, Any]
    says: str
    secret: str = ""


class BrokerKit(ABC):
    """One broker's side of the conformance suite (see the module's docstring).

    Use as ``async with kit``: whatever it made is removed on the way out.
    """

    #: The connector's name (the YAML's ``connector:``).
    connector: ClassVar[str]
    #: Rules of the suite this broker cannot be put through, with why (they are skipped).
    cannot: ClassVar[Mapping[str, str]] = {}

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:  # noqa: B027 - optional: nothing to remove by default
        """Remove what the kit made (best effort)."""

    @abstractmethod
    async def create(self, *, ordered: bool = False) -> Source:
        """A new, empty source with a dead-letter destination of its own."""

    @abstractmethod
    async def publish(
        self, source: Source, bodies: Sequence[str], *, lane: str | None = None
    ) -> None:
        """Publish ``bodies`` in order, all in ``lane`` (a key, a group, a session) when
        given; return once the broker holds them all."""

    @abstractmethod
    async def dead_letters(
        self, source: Source, *, expect: int = 1, within: float = 10.0
    ) -> list[DeadLetter]:
        """The dead-letter copies of the source's rejected messages, read until ``expect``
        are there or ``within`` seconds passed."""

    @abstractmethod
    async def remaining(self, source: Source) -> int:
        """Messages of the source not advanced yet, as the broker says (read only)."""

    @abstractmethod
    async def recreate(self, source: Source) -> None:
        """Delete the source and make it again under the same name, empty: its life
        starts again (offsets and sequence numbers from the start)."""

    @abstractmethod
    async def advance_failure(self, source: Source) -> AdvanceFailure:
        """Arrange for the broker to fail the advance of one message of ``source``."""

    def unreachable(self, source: Source) -> Unusable:
        """The stream block of ``source`` with the broker's address where nothing answers,
        and the words ``acklane run`` tells it with (once)."""
        raise NotImplementedError(f"{type(self).__name__} has no unreachable broker")

    async def refused(self, source: Source) -> Unusable:
        """The stream block of ``source`` with credentials the broker refuses, and the
        words of the one line ``acklane run`` stops with."""
        raise NotImplementedError(f"{type(self).__name__} refuses no credentials")

    def fields(self, source: Source, **more: Any) -> dict[str, Any]:
        """The stream block that reads ``source`` (``connector`` excepted), with ``more``."""
        return {**source.fields, **more}

    def stream_yaml(self, source: Source, **more: Any) -> str:
        """:meth:`fields` as the YAML lines of a stream block (one setting a line)."""
        return yaml_block(self.fields(source, **more))


def yaml_block(fields: Mapping[str, Any]) -> str:
    """Stream settings as the YAML lines of a stream block, one setting a line."""
    return "".join(f"{name}: {json.dumps(value)}\n" for name, value in fields.items())


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def _until(read: Callable[[], Any], enough: Callable[[Any], bool], within: float) -> Any:
    """``read()`` (sync or async) again every 100 ms until ``enough`` of it or ``within``."""
    deadline = time.monotonic() + within
    while True:
        got = read()
        if asyncio.iscoroutine(got):
            got = await got
        if enough(got) or time.monotonic() >= deadline:
            return got
        await asyncio.sleep(0.1)


# -- memory --------------------------------------------------------------------------------


class MemoryBrokerKit(BrokerKit):
    """The in-process broker: one of its own per kit, forgotten on the way out."""

    connector = "memory"
    cannot: ClassVar[Mapping[str, str]] = {
        "two_processes": "the memory broker lives inside one process",
        "unreachable": "the memory broker lives inside the process: it is always reachable",
        "refused": "the memory broker takes no credentials",
    }

    def __init__(self) -> None:
        from acklane.connectors.memory import MemoryBroker

        self.name = _unique("conformance")
        self.broker = MemoryBroker.get(self.name)

    async def aclose(self) -> None:
        from acklane.connectors.memory import MemoryBroker

        MemoryBroker.remove(self.name)

    async def create(self, *, ordered: bool = False) -> Source:
        topic = _unique("orders")
        self.broker.create_topic(topic, 1)
        fields = {
            "broker": self.name,
            "topics": [topic],
            "group_id": _unique("group"),
            "partitions": 1,
            "dead_letter": f"{topic}.dlq",
            "poll_interval": 0.05,
        }
        return Source(topic, ordered, fields)

    async def publish(
        self, source: Source, bodies: Sequence[str], *, lane: str | None = None
    ) -> None:
        for body in bodies:
            self.broker.publish(source.name, body, key=lane, partition=0)
        source.published += len(bodies)

    async def dead_letters(
        self, source: Source, *, expect: int = 1, within: float = 10.0
    ) -> list[DeadLetter]:
        def read() -> list[DeadLetter]:
            records = self.broker.records(source.fields["dead_letter"])
            return [DeadLetter(r.value, r.headers.get(REJECT_REASON, "")) for r in records]

        result: list[DeadLetter] = await _until(read, lambda got: len(got) >= expect, within)
        return result

    async def remaining(self, source: Source) -> int:
        committed = self.broker.committed(source.fields["group_id"], source.name, 0)
        return source.published - committed

    async def recreate(self, source: Source) -> None:
        # The memory broker keeps no topic beyond its own life: a new broker of the same
        # name (a process restart) starts the topic again, under a new incarnation.
        from acklane.connectors.memory import MemoryBroker

        MemoryBroker.remove(self.name)
        self.broker = MemoryBroker.get(self.name)
        self.broker.create_topic(source.name, 1)
        source.published = 0

    async def advance_failure(self, source: Source) -> AdvanceFailure:
        self.broker.refuse_commits(source.fields["group_id"])
        return AdvanceFailure({}, "refused commit", _CLEAN)


# -- Kafka ---------------------------------------------------------------------------------


class KafkaBrokerKit(BrokerKit):
    """A Kafka emulator: one-partition topics, a consumer group per source."""

    connector = "kafka"

    def __init__(self, emulator: Emulator) -> None:
        from .kafka import KafkaKit

        self.kit = KafkaKit.of(emulator)
        self._topics: list[str] = []

    async def aclose(self) -> None:
        if self._topics:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._delete, self._topics)
        self.kit.close()

    def _delete(self, topics: list[str]) -> None:
        for future in self.kit._admin.delete_topics(topics, operation_timeout=10).values():
            future.result(timeout=15)

    async def create(self, *, ordered: bool = False) -> Source:
        from .kafka import KafkaKit

        topic, dlq = self.kit.unique("orders"), self.kit.unique("orders-dlq")
        for name in (topic, dlq):
            await asyncio.to_thread(self.kit.create_topic, name)
            self._topics.append(name)
        fields = {
            "bootstrap_servers": self.kit.bootstrap_servers,
            "topics": [topic],
            "group_id": self.kit.unique("group"),
            "dead_letter": dlq,
            "poll_timeout": 0.05,
            "client": dict(KafkaKit.FAST_GROUP),
        }
        return Source(topic, ordered, fields)

    async def publish(
        self, source: Source, bodies: Sequence[str], *, lane: str | None = None
    ) -> None:
        await asyncio.to_thread(self.kit.produce, source.name, bodies, partition=0, key=lane)
        source.published += len(bodies)

    async def dead_letters(
        self, source: Source, *, expect: int = 1, within: float = 10.0
    ) -> list[DeadLetter]:
        records = await asyncio.to_thread(
            self.kit.read, source.fields["dead_letter"], expect, timeout=within
        )
        out = []
        for record in records:
            headers = {name: (value or b"").decode() for name, value in record.headers() or []}
            out.append(DeadLetter(record.value() or b"", headers.get(REJECT_REASON, "")))
        return out

    async def remaining(self, source: Source) -> int:
        committed = await asyncio.to_thread(
            self.kit.committed, source.fields["group_id"], source.name, 1
        )
        return source.published - (committed.get(0) or 0)

    async def recreate(self, source: Source) -> None:
        await asyncio.to_thread(self._delete, [source.name])
        for _ in range(50):  # the deletion may take a moment to be done
            try:
                await asyncio.to_thread(self.kit.create_topic, source.name)
                break
            except Exception:
                await asyncio.sleep(0.1)
        else:
            raise EmulatorError(f"topic {source.name} could not be made again")
        source.published = 0

    def unreachable(self, source: Source) -> Unusable:
        from .emulator import free_port

        return Unusable(
            self.fields(source, bootstrap_servers=f"127.0.0.1:{free_port()}"),
            "broker unreachable",
        )

    async def refused(self, source: Source) -> Unusable:
        # tansu speaks no SASL mechanism a client can complete: the broker refuses the
        # login, a real authentication failure.
        secret = "Secr3tSasl"
        login = {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN",
            "sasl_username": "alice",
            "sasl_password": secret,
        }
        return Unusable(self.fields(source, **login), "Kafka authentication failed", secret)

    async def advance_failure(self, source: Source) -> AdvanceFailure:
        # The dead-letter producer refuses a copy larger than its message.max.bytes: the
        # copy fails, so does the advance, and nothing is committed past the record.
        limit = {"message.max.bytes": 1000}
        return AdvanceFailure({"dead_letter_client": limit}, "y" * 5000, _REJECTED)


# -- SQS -----------------------------------------------------------------------------------


class SqsBrokerKit(BrokerKit):
    """An SQS emulator (moto): a queue and a dead-letter queue per source; FIFO when ordered."""

    connector = "sqs"
    #: Seconds a received message stays invisible: what a killed runner held comes back soon.
    VISIBILITY = 5

    def __init__(self, emulator: Emulator) -> None:
        from .sqs import SqsQueues

        self.settings = emulator.client_settings()
        self.queues = SqsQueues(self.settings)
        self._strict: Any = None  # a moto server that checks credentials, made on demand

    async def __aenter__(self) -> Self:
        await self.queues.__aenter__()
        return self

    async def aclose(self) -> None:
        try:
            await self.queues.__aexit__(None, None, None)
        finally:
            if self._strict is not None:
                await asyncio.to_thread(self._strict.stop)

    async def create(self, *, ordered: bool = False) -> Source:
        url = await self.queues.create("orders", fifo=ordered, visibility_timeout=self.VISIBILITY)
        dlq = await self.queues.create("orders-dlq", fifo=ordered)
        fields = {**self.settings, "queue_url": url, "dead_letter": dlq, "wait_time_seconds": 1}
        return Source(url, ordered, fields, {"fifo": ordered})

    async def publish(
        self, source: Source, bodies: Sequence[str], *, lane: str | None = None
    ) -> None:
        group = (lane or "lane") if source.ordered else None
        await self.queues.send(source.name, bodies, group_id=group)
        source.published += len(bodies)

    async def dead_letters(
        self, source: Source, *, expect: int = 1, within: float = 10.0
    ) -> list[DeadLetter]:
        out: list[DeadLetter] = []
        deadline = time.monotonic() + within
        while len(out) < expect and time.monotonic() < deadline:
            for m in await self.queues.receive(
                source.fields["dead_letter"], wait=1, visibility_timeout=int(within) + 30
            ):
                attributes = m.get("MessageAttributes") or {}
                reason = attributes.get(REJECT_REASON, {}).get("StringValue", "")
                out.append(DeadLetter(str(m["Body"]).encode(), str(reason)))
        return out

    async def remaining(self, source: Source) -> int:
        visible, in_flight = await self.queues.counts(source.name)
        return visible + in_flight

    async def recreate(self, source: Source) -> None:
        name = source.name.rsplit("/", 1)[-1]
        await self.queues.client.delete_queue(QueueUrl=source.name)
        attributes = {"VisibilityTimeout": str(self.VISIBILITY)}
        if source.extra.get("fifo"):
            attributes["FifoQueue"] = "true"
        await self.queues.client.create_queue(QueueName=name, Attributes=attributes)
        source.published = 0

    def unreachable(self, source: Source) -> Unusable:
        from .emulator import free_port

        endpoint = f"http://127.0.0.1:{free_port()}"
        queue = f"{endpoint}/123456789012/orders"
        fields = self.fields(source, endpoint_url=endpoint, queue_url=queue)
        fields.pop("dead_letter")
        return Unusable(fields, "SQS endpoint unreachable")

    async def refused(self, source: Source) -> Unusable:
        # moto with its IAM checks on answers keys it does not know with
        # InvalidClientTokenId, as AWS does.
        if self._strict is None:
            self._strict = _StrictMoto()
            await asyncio.to_thread(self._strict.start)
        endpoint = self._strict.endpoint
        secret = "WrongSecret123"
        fields = self.fields(
            source,
            endpoint_url=endpoint,
            queue_url=f"{endpoint}/123456789012/orders",
            aws_access_key_id="AKIAWRONG0KEY",
            aws_secret_access_key=secret,
        )
        fields.pop("dead_letter")
        return Unusable(fields, "SQS authentication failed", secret)

    async def advance_failure(self, source: Source) -> AdvanceFailure:
        # A dead-letter queue that takes smaller messages than the copy: SQS refuses the
        # copy, the producer fails the group and never deletes the original.
        small = await self.queues.create(
            "small-dlq", fifo=source.ordered, attributes={"MaximumMessageSize": "1024"}
        )
        return AdvanceFailure({"dead_letter": small}, "z" * 2000, _REJECTED)


# -- Pub/Sub -------------------------------------------------------------------------------


class PubSubBrokerKit(BrokerKit):
    """acklane's Pub/Sub emulator: a topic, its subscription (ordered when asked), and a
    dead-letter topic with a subscription that reads the copies."""

    connector = "pubsub"
    #: Seconds of the subscription's ack deadline: what a killed runner held comes back soon.
    ACK_DEADLINE = 2
    #: Seconds of the dead-letter reader's ack deadline: what a pull gives a letter until
    #: the reader moves its deadline (a reader killed in between holds it this long).
    READER_ACK_DEADLINE = 10

    def __init__(self, emulator: Emulator) -> None:
        from .pubsub import PubSubKit

        self.settings = emulator.client_settings()
        self.kit = PubSubKit(self.settings)
        self._refusing: Any = None  # a gRPC server refusing every call, made on demand

    async def __aenter__(self) -> Self:
        await self.kit.__aenter__()
        return self

    async def aclose(self) -> None:
        try:
            await self.kit.__aexit__(None, None, None)
        finally:
            if self._refusing is not None:
                self._refusing.stop(grace=None)

    async def create(self, *, ordered: bool = False) -> Source:
        topic = await self.kit.create_topic("orders")
        sub = await self.kit.create_subscription(
            topic, ack_deadline=self.ACK_DEADLINE, ordering=ordered
        )
        dlq = await self.kit.create_topic("orders-dlq")
        reader = await self.kit.create_subscription(
            dlq, "orders-dlq-reader", ack_deadline=self.READER_ACK_DEADLINE
        )
        fields = {
            **self.settings,
            "subscription": sub,
            "dead_letter": dlq,
            "advance_linger": 0.01,
        }
        return Source(sub, ordered, fields, {"topic": topic, "reader": reader})

    async def publish(
        self, source: Source, bodies: Sequence[str], *, lane: str | None = None
    ) -> None:
        key = (lane or "lane") if source.ordered else ""
        await self.kit.publish(source.extra["topic"], bodies, ordering_key=key)
        source.published += len(bodies)

    async def dead_letters(
        self, source: Source, *, expect: int = 1, within: float = 10.0
    ) -> list[DeadLetter]:
        received = await self.kit.drain(source.extra["reader"], expect=expect, within=within)
        return [
            DeadLetter(bytes(r.message.data), r.message.attributes.get(REJECT_REASON, ""))
            for r in received
        ]

    async def remaining(self, source: Source) -> int:
        return (await self.kit.stats(source.name))["backlog"]

    async def recreate(self, source: Source) -> None:
        from google.pubsub_v1 import types

        topic = source.extra["topic"]
        await self.kit.subscriber.delete_subscription(subscription=source.name)
        await self.kit.publisher.delete_topic(topic=topic)
        await self.kit.publisher.create_topic(name=topic)
        request = types.Subscription(
            name=source.name,
            topic=topic,
            ack_deadline_seconds=self.ACK_DEADLINE,
            enable_message_ordering=source.ordered,
        )
        await self.kit.subscriber.create_subscription(request=request)
        source.published = 0

    def unreachable(self, source: Source) -> Unusable:
        from .emulator import free_port

        fields = self.fields(source, emulator_host=f"127.0.0.1:{free_port()}")
        return Unusable(fields, "Pub/Sub endpoint unreachable")

    async def refused(self, source: Source) -> Unusable:
        # The emulator checks no credentials: a gRPC server answering every call
        # UNAUTHENTICATED, as Google's service answers refused credentials, which the
        # official client reads as it would Google's.
        if self._refusing is None:
            self._refusing, self._refusing_port = _refusing_grpc_server("UNAUTHENTICATED")
        fields = self.fields(source, emulator_host=f"127.0.0.1:{self._refusing_port}")
        return Unusable(fields, "UNAUTHENTICATED")

    async def advance_failure(self, source: Source) -> AdvanceFailure:
        # A dead-letter topic that does not exist: the copy's publish fails (NOT_FOUND).
        return AdvanceFailure({"dead_letter": _unique("no-such-topic")}, "lost copy", _REJECTED)


# -- Service Bus ---------------------------------------------------------------------------


#: The Service Bus SDK's own retries of each open, still made, with short pauses
#: between them (0.8 s doubling by default): an unusable namespace is told in about a
#: second rather than ten.
_QUICK_RETRIES: dict[str, float] = {"retry_backoff_factor": 0.1, "retry_backoff_max": 0.5}


class ServiceBusBrokerKit(BrokerKit):
    """acklane's Service Bus emulator: a queue per source (session-enabled when ordered),
    whose own dead-letter sub-queue receives the rejects."""

    connector = "servicebus"
    #: Seconds of a message's lock: what a killed runner held comes back soon.
    LOCK_DURATION = 2

    def __init__(self, emulator: Emulator) -> None:
        from .servicebus import ServiceBusEmulator, ServiceBusKit

        if not isinstance(emulator, ServiceBusEmulator):
            raise EmulatorError("the Service Bus kit needs acklane's emulator (its admin calls)")
        self.emulator = emulator
        self.kit = ServiceBusKit(emulator.connection_string)
        self._queues: list[str] = []

    async def aclose(self) -> None:
        for queue in self._queues:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.emulator.delete_entity, queue)

    def _make(self, name: str, ordered: bool) -> str:
        return self.emulator.create_queue(
            name,
            lock_duration=self.LOCK_DURATION,
            max_delivery_count=100,  # acklane dead-letters, never the broker's count
            requires_session=ordered,
        )

    async def create(self, *, ordered: bool = False) -> Source:
        queue = await asyncio.to_thread(self._make, _unique("orders"), ordered)
        self._queues.append(queue)
        fields: dict[str, Any] = {
            "connection_string": self.emulator.connection_string,
            "queue": queue,
            "max_wait_time": 1,
        }
        if ordered:
            fields.update(sessions=True, session_idle_timeout=1)
        return Source(queue, ordered, fields)

    async def publish(
        self, source: Source, bodies: Sequence[str], *, lane: str | None = None
    ) -> None:
        session = (lane or "lane") if source.ordered else None
        await asyncio.to_thread(self.kit.send, source.name, bodies, session_id=session)
        source.published += len(bodies)

    async def dead_letters(
        self, source: Source, *, expect: int = 1, within: float = 10.0
    ) -> list[DeadLetter]:
        def read() -> list[DeadLetter]:
            copies = self.kit.peek_dead_letters(source.name)
            return [DeadLetter(b"".join(m.body), str(m.dead_letter_reason or "")) for m in copies]

        result: list[DeadLetter] = await _until(
            lambda: asyncio.to_thread(read), lambda got: len(got) >= expect, within
        )
        return result

    async def remaining(self, source: Source) -> int:
        counts = await asyncio.to_thread(self.emulator.counts, source.name)
        return counts["messages"]

    async def recreate(self, source: Source) -> None:
        await asyncio.to_thread(self.emulator.delete_entity, source.name)
        await asyncio.to_thread(self._make, source.name, source.ordered)
        source.published = 0

    def unreachable(self, source: Source) -> Unusable:
        from .emulator import free_port

        connection = _with_part(
            self.emulator.connection_string, "Endpoint=", f"sb://127.0.0.1:{free_port()}"
        )
        return Unusable(
            self.fields(source, connection_string=connection, client_options=_QUICK_RETRIES),
            "Service Bus namespace unreachable",
        )

    async def refused(self, source: Source) -> Unusable:
        # The emulator checks SAS tokens as Azure does: a key it does not hold is refused.
        secret = "NotTheKey123"
        connection = _with_part(self.emulator.connection_string, "SharedAccessKey=", secret)
        return Unusable(
            self.fields(source, connection_string=connection, client_options=_QUICK_RETRIES),
            "Service Bus authentication failed",
            secret,
        )

    async def advance_failure(self, source: Source) -> AdvanceFailure:
        # The namespace answers the next settlements with an error (the emulator's fault).
        # two: the SDK tries the receiver link, then the management link
        await asyncio.to_thread(self.emulator.refuse_settlements, source.name, 2)
        return AdvanceFailure({}, "refused settlement", _CLEAN)


class _StrictMoto:
    """moto's server with its IAM checks on (``INITIAL_NO_AUTH_ACTION_COUNT=0``): keys it
    does not know are refused, as AWS refuses them."""

    def __init__(self) -> None:
        from .emulator import free_port

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        from .emulator import wait_for_port

        self._process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port("127.0.0.1", self.port, 60)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.terminate()
            process.wait(timeout=30)


def _with_part(connection_string: str, name: str, value: str) -> str:
    """A Service Bus connection string with its ``name`` part (``Endpoint=``) set to ``value``."""
    return ";".join(
        f"{name}{value}" if part.startswith(name) else part for part in connection_string.split(";")
    )


def _refusing_grpc_server(code: str) -> tuple[Any, int]:
    """A gRPC server (in this process) answering every call with the status ``code``; its
    port."""
    from concurrent import futures

    import grpc

    status = getattr(grpc.StatusCode, code)

    class Refusing(grpc.GenericRpcHandler):  # type: ignore[misc]
        def service(self, handler_call_details: Any) -> Any:
            def refuse(request: bytes, context: grpc.ServicerContext) -> bytes:
                context.abort(status, "request had invalid authentication credentials")
                raise AssertionError("abort raises")

            return grpc.unary_unary_rpc_method_handler(refuse)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((Refusing(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


#: Every kit, by connector name, and what it is made from (``None``: no emulator).
KITS: dict[str, type[BrokerKit]] = {
    kit.connector: kit
    for kit in (MemoryBrokerKit, KafkaBrokerKit, SqsBrokerKit, PubSubBrokerKit, ServiceBusBrokerKit)
}


def kit_for(connector: str, emulator: Emulator | None = None) -> BrokerKit:
    """The kit of ``connector`` on ``emulator`` (none for the memory broker)."""
    try:
        kit_class = KITS[connector]
    except KeyError:
        raise EmulatorError(f"no broker kit for connector {connector!r}") from None
    if kit_class is MemoryBrokerKit:
        return MemoryBrokerKit()
    if emulator is None:
        raise EmulatorError(f"the {connector} kit needs the broker's emulator")
    factory: Any = kit_class
    kit: BrokerKit = factory(emulator)
    return kit
