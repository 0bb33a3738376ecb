"""``kind: broker``: each stored event published as a message on a configured stream's broker.

The sink sends through the publisher of the stream's connector (the one ``acklane
publish`` uses, with the stream's servers and credentials), to the stream's own
topic or queue or to ``destination``. Each message is the event document as JSON::

    {"event_id": "ev_...", "watcher": ..., "stream": ..., "message_id": ...,
     "position": 0, "stored_at": "...", "payload": <the trigger event's payload>}

with the attributes (Kafka headers, SQS message attributes, Pub/Sub attributes,
Service Bus application properties) ``acklane-event-id``, ``acklane-watcher`` and
``acklane-stream``. Where the broker dedupes on a key a sender sets, the event id is
that key: Service Bus's ``MessageId`` and an SQS FIFO queue's
``MessageDeduplicationId``; Pub/Sub and Kafka have none (a consumer dedupes on the
``acklane-event-id`` attribute).

What is parked and what is retried: a broker error that names a message it will
never take (too large, contents or attributes it refuses: see :data:`REFUSALS`) is a
:class:`~acklane.core.sinks.RefusedDelivery`; everything else (unreachable, not
confirmed in time, throttled, a missing topic or queue, refused credentials) is a
:class:`~acklane.core.sinks.RetryableDelivery`. See docs/sinks/broker.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Final, Literal

from pydantic import Field

from ..connectors import OutgoingMessage, PublishError, PublishNotSupported
from ..durations import Duration
from ..errors import BrokerAuthError
from ..names import NAME_PATTERN
from ..redact import redact
from ._base import (
    Delivery,
    DeliveryError,
    DeliveryResult,
    RefusedDelivery,
    RetryableDelivery,
    Sink,
    SinkContext,
    SinkError,
    field_problem,
)
from ._settings import SinkSettings
from ._spans import SinkSpans

if TYPE_CHECKING:
    from ..connectors import Publisher
    from ..connectors._stream import StreamConfig

__all__ = [
    "EVENT_ID_ATTRIBUTE",
    "REFUSALS",
    "STREAM_ATTRIBUTE",
    "WATCHER_ATTRIBUTE",
    "BrokerSink",
    "BrokerSinkSettings",
    "delivery_outcome",
]

log = logging.getLogger("acklane.core.sinks.broker")

#: The attribute (header, application property) that carries the event's stable id.
EVENT_ID_ATTRIBUTE: Final = "acklane-event-id"
#: The attribute that names the watcher whose event it is.
WATCHER_ATTRIBUTE: Final = "acklane-watcher"
#: The attribute that carries the stream (its key, as the event store keeps it).
STREAM_ATTRIBUTE: Final = "acklane-stream"

#: What a broker's SDK calls a message it will never take, in an exception's class
#: name or message: retrying the same message cannot help, so it is parked at once.
REFUSALS: Final = (
    # Kafka (librdkafka's error names): a record over message.max.bytes, one the
    # broker cannot store
    "MSG_SIZE_TOO_LARGE",
    "RECORD_LIST_TOO_LARGE",
    "INVALID_RECORD",
    "INVALID_MSG",
    # SQS (its error codes): over the size limit, characters or parameters it refuses
    "BatchRequestTooLong",
    "InvalidMessageContents",
    "InvalidParameterValue",
    # Pub/Sub (google.api_core's class for gRPC INVALID_ARGUMENT): too large, an
    # attribute or ordering key it refuses
    "InvalidArgument",
    # Service Bus (azure-servicebus): one message over the entity's size limit
    "MessageSizeExceededError",
)
_REFUSAL: Final = re.compile(
    r"(?<![A-Za-z0-9])(?:" + "|".join(map(re.escape, REFUSALS)) + r")(?![A-Za-z0-9])"
)

#: The longest key sent as written: SQS group ids and Service Bus session ids take
#: 128 characters; a longer one is sent as ``sha256:<hex>`` of it (same key, same hash).
MAX_KEY_LENGTH: Final = 128
#: The longest reason kept of a broker's error text.
_MAX_REASON: Final = 1000

# The store's own JSON rules (no NaN, compact); non-ASCII text kept as UTF-8.
_JSON: Final = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)
_JSON_ASCII: Final = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


class BrokerSinkSettings(SinkSettings):
    """``kind: broker``: which stream's broker, where on it, and the message key."""

    kind: Literal["broker"]
    #: The name of a stream of ``streams:``: its connector publishes, with its settings.
    stream: Annotated[str, Field(pattern=NAME_PATTERN, max_length=200)]
    #: Another topic or queue than the stream's own, as its publisher names one (a Kafka
    #: topic, which a stream reading several topics needs; a Pub/Sub topic name or
    #: path); SQS and Service Bus streams publish only to their own queue or entity.
    destination: Annotated[str, Field(min_length=1)] | None = None
    #: What becomes the message key (Kafka record key, SQS FIFO MessageGroupId, Pub/Sub
    #: ordering key, Service Bus session id): the event id, the source message's id
    #: (the event id when it has none), the watcher's name; none by default.
    key: Literal["event_id", "message_id", "watcher"] | None = None
    #: How long one send may wait for the broker's confirmation before it is retried.
    timeout: Annotated[Duration, Field(gt=0)] = 30.0


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _MAX_REASON else line[: _MAX_REASON - 3] + "..."


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from (or while handling), once each."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 16:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _refused_for_good(exc: BaseException) -> bool:
    return any(_REFUSAL.search(type(e).__name__) or _REFUSAL.search(str(e)) for e in _chain(exc))


def delivery_outcome(exc: BaseException, destination: str) -> DeliveryError:
    """What a failed send means for its events: refused for good (parked) when the
    broker names a message it will never take (:data:`REFUSALS`), else retryable; the
    reason is one secret-free line."""
    if isinstance(exc, DeliveryError):
        return exc
    if isinstance(exc, PublishError):
        text = str(exc)  # the publishers name their destination themselves
    else:
        text = f"{destination}: {type(exc).__name__}: {exc}"
    reason = redact(_one_line(text))
    if _refused_for_good(exc):
        return RefusedDelivery(reason)
    return RetryableDelivery(reason)


def _fresh(outcome: DeliveryError) -> DeliveryError:
    """A new exception of the same outcome, for each event of a batch that shares it."""
    if isinstance(outcome, RetryableDelivery):
        return RetryableDelivery(outcome.reason, retry_after=outcome.retry_after)
    return type(outcome)(outcome.reason)


def _sized_key(value: str) -> str:
    if len(value) <= MAX_KEY_LENGTH:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            pass
        else:
            return value
    raw = value.encode("utf-8", "surrogatepass")
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _for_sinks(text: str) -> str:
    # the connectors word their refusals for ``acklane publish``, whose option is --topic
    return text.replace("--topic", "destination")


def _key_problem(settings: BrokerSinkSettings, stream: StreamConfig) -> str | None:
    """A key the stream's broker cannot take (checked here, before any event is sent:
    each send would fail the same way)."""
    if settings.key is None:
        return None
    if stream.connector_name == "sqs" and not getattr(stream.config, "is_fifo_name", True):
        return (
            f"key: on SQS a key is a FIFO queue's MessageGroupId, and the queue of stream "
            f"{stream.name!r} is not FIFO (its name does not end in .fifo); drop key"
        )
    if stream.connector_name == "servicebus" and not getattr(stream.config, "sessions", True):
        return (
            f"key: on Service Bus a key is the session id, and stream {stream.name!r} is not "
            "session-enabled (sessions: false); drop key or enable sessions"
        )
    return None


class BrokerSink(Sink):
    """Publishes each event through the publisher of a configured stream (see the module).

    One publisher per sink, made in :meth:`open` and closed in :meth:`aclose`. A batch
    goes out in as few sends as the publisher's ``max_batch`` allows; when the broker
    refuses a send for good, its events are sent again one by one, so that only the
    message it refuses is parked.
    """

    kind = "broker"
    settings_model = BrokerSinkSettings

    settings: BrokerSinkSettings

    def __init__(self, settings: SinkSettings, context: SinkContext | None = None) -> None:
        if not isinstance(settings, BrokerSinkSettings):
            raise TypeError(
                f"a broker sink takes BrokerSinkSettings, got {type(settings).__name__}"
            )
        super().__init__(settings, context)
        self._publisher: Publisher | None = None

    # -- configuration

    @classmethod
    def config_problems(cls, settings: SinkSettings, context: SinkContext) -> list[tuple[str, str]]:
        assert isinstance(settings, BrokerSinkSettings)
        return [field_problem(p) for p in cls.check_config(settings, context.streams)]

    @classmethod
    def check_config(
        cls, settings: BrokerSinkSettings, streams: Mapping[str, StreamConfig]
    ) -> list[str]:
        """What is wrong with ``settings`` given the configured ``streams``, without
        connecting: each problem one line starting with the field to fix
        (``stream: ...``, ``destination: ...``, ``key: ...``, ``batch_size: ...``)."""
        stream = streams.get(settings.stream)
        if stream is None:
            known = ", ".join(sorted(streams)) or "none"
            return [f"stream: no stream named {settings.stream!r} (streams: {known})"]
        try:
            publisher = stream.connector.create_publisher(
                stream.config, destination=settings.destination
            )
        except PublishNotSupported as exc:
            return [f"stream: stream {stream.name!r} cannot be published to: {exc}"]
        except PublishError as exc:
            return [f"destination: stream {stream.name!r}: {_for_sinks(str(exc))}"]
        problems = []
        if settings.batch_size > publisher.max_batch:
            problems.append(
                f"batch_size: {settings.batch_size} is more than the {stream.connector_name} "
                f"publisher sends at once ({publisher.max_batch})"
            )
        key = _key_problem(settings, stream)
        if key is not None:
            problems.append(key)
        return problems

    def _stream(self) -> StreamConfig:
        problems = self.check_config(self.settings, self.context.streams)
        if problems:
            raise SinkError(redact(f"sink {self.name!r}: " + "; ".join(problems)))
        return self.context.streams[self.settings.stream]

    # -- the Sink interface

    @property
    def max_batch(self) -> int:
        if self._publisher is None:
            return self.settings.batch_size
        return min(self.settings.batch_size, self._publisher.max_batch)

    @property
    def destination(self) -> str:
        if self._publisher is not None:
            return redact(self._publisher.destination)
        return f"broker of stream {self.settings.stream}"

    async def open(self) -> None:
        if self._publisher is not None:
            return
        stream = self._stream()
        try:
            self._publisher = stream.connector.create_publisher(
                stream.config, destination=self.settings.destination
            )
        except (PublishNotSupported, PublishError) as exc:
            raise SinkError(redact(f"sink {self.name!r}: {_for_sinks(str(exc))}")) from None

    async def aclose(self) -> None:
        publisher, self._publisher = self._publisher, None
        if publisher is None:
            return
        try:
            await publisher.aclose()
        except Exception as exc:  # closing cannot lose anything that was confirmed
            log.warning(
                "sink %s: closing %s failed: %s",
                self.name,
                redact(publisher.destination),
                redact(_one_line(f"{type(exc).__name__}: {exc}")),
            )

    async def check(self) -> None:
        """The stream's connection check (what ``validate --connect`` runs for the
        stream), bounded by ``timeout``; a connector without one: only the settings."""
        stream = self._stream()
        timeout = self.settings.timeout
        try:
            async with asyncio.timeout(timeout * 2 + 5):
                found = await stream.connector.check_connection(stream.config, call_timeout=timeout)
        except TimeoutError:
            raise SinkError(
                redact(f"sink {self.name!r}: {stream.describe()}: no answer within {timeout:g}s")
            ) from None
        except Exception as exc:
            log.debug("sink %s: connection check failed", self.name, exc_info=True)
            settings = ""
            if isinstance(exc, BrokerAuthError) and exc.settings:
                names = ", ".join(f"streams.{stream.name}.{f}" for f in exc.settings)
                settings = f" (check {names})"
            reason = _one_line(str(exc) or type(exc).__name__)
            raise SinkError(
                redact(f"sink {self.name!r}: {stream.describe()}: {reason}{settings}")
            ) from None
        if found is not None:
            log.debug("sink %s: %s", self.name, redact(found))

    def message(
        self, delivery: Delivery, trace: Mapping[str, str] | None = None
    ) -> OutgoingMessage:
        """The message of one event: its document as JSON, its attributes (with the
        delivery span's ``traceparent`` when tracing is on), its key, and the event id
        as the broker's dedupe key."""
        document = {**delivery.acklane_fields(), "payload": delivery.payload}
        try:
            text = _JSON.encode(document)
        except (TypeError, ValueError) as exc:
            raise RefusedDelivery(f"event {delivery.event_id}: not JSON-able: {exc}") from None
        try:
            body = text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: escaped, as the store keeps it
            body = _JSON_ASCII.encode(document).encode("ascii")
        return OutgoingMessage(
            body,
            key=self._key(delivery),
            attributes={
                EVENT_ID_ATTRIBUTE: delivery.event_id,
                WATCHER_ATTRIBUTE: delivery.watcher,
                STREAM_ATTRIBUTE: delivery.stream,
                **(trace or {}),
            },
            dedupe_id=delivery.event_id,
        )

    def _key(self, delivery: Delivery) -> str | None:
        match self.settings.key:
            case None:
                return None
            case "event_id":
                value = delivery.event_id
            case "message_id":
                value = delivery.message_id or delivery.event_id
            case "watcher":
                value = delivery.watcher
        return _sized_key(value)

    async def deliver(self, batch: Sequence[Delivery]) -> list[DeliveryResult]:
        with self.delivery_spans(batch) as spans:
            results = await self._deliver(batch, spans)
            spans.results(results)
        return results

    async def _deliver(self, batch: Sequence[Delivery], spans: SinkSpans) -> list[DeliveryResult]:
        await self.open()
        publisher = self._publisher
        assert publisher is not None
        results: list[DeliveryResult] = [None] * len(batch)
        pending: list[tuple[int, OutgoingMessage]] = []
        for i, delivery in enumerate(batch):
            try:
                pending.append((i, self.message(delivery, spans.carrier(i))))
            except RefusedDelivery as exc:
                results[i] = exc
        step = publisher.max_batch
        for start in range(0, len(pending), step):
            chunk = pending[start : start + step]
            outcome = await self._send(publisher, [m for _, m in chunk])
            if isinstance(outcome, RefusedDelivery) and len(chunk) > 1:
                # one message may spoil the send (or only the send's total size): each
                # alone, so that only what the broker refuses is parked
                outcome = await self._one_by_one(publisher, chunk, results)
            elif outcome is not None:
                for i, _ in chunk:
                    results[i] = _fresh(outcome)
            if isinstance(outcome, RetryableDelivery) and self.settings.ordered:
                self._hold_back(pending[start + step :], results)
                break
        return results

    async def _one_by_one(
        self,
        publisher: Publisher,
        chunk: Sequence[tuple[int, OutgoingMessage]],
        results: list[DeliveryResult],
    ) -> DeliveryError | None:
        """Each message of ``chunk`` in its own send; the last retryable outcome (an
        ordered sink stops at the first one)."""
        retry: DeliveryError | None = None
        for n, (i, message) in enumerate(chunk):
            outcome = await self._send(publisher, [message])
            results[i] = outcome
            if isinstance(outcome, RetryableDelivery):
                retry = outcome
                if self.settings.ordered:
                    self._hold_back(chunk[n + 1 :], results)
                    break
        return retry

    @staticmethod
    def _hold_back(
        rest: Sequence[tuple[int, OutgoingMessage]], results: list[DeliveryResult]
    ) -> None:
        for i, _ in rest:
            results[i] = RetryableDelivery(
                "not sent: an earlier event of the batch is to be retried first (ordered)"
            )

    async def _send(
        self, publisher: Publisher, messages: Sequence[OutgoingMessage]
    ) -> DeliveryError | None:
        """One send, bounded by ``timeout``: None when the broker confirmed it all."""
        timeout = self.settings.timeout
        try:
            async with asyncio.timeout(timeout) as bound:
                await publisher.send(messages)
        except Exception as exc:
            log.debug("sink %s: send failed", self.name, exc_info=True)
            if isinstance(exc, TimeoutError) and bound.expired():
                return RetryableDelivery(
                    redact(f"{publisher.destination}: not confirmed within {timeout:g}s (timeout)")
                )
            return delivery_outcome(exc, publisher.destination)
        return None
