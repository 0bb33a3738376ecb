"""``kind: broker``: each event reaches every broker as a message (its document as JSON,
its event id as an attribute), read back with the broker's own SDK on its emulator; the
broker's own dedupe key is the event id where it has one (SQS FIFO, Service Bus); a
batch arrives whole; a message the broker refuses for good is parked alone; an
unreachable broker is retryable; and the configuration problems are named."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from acklane.core.config import StreamConfig, parse_config
from acklane.core.sinks import (
    Delivery,
    DeliveryResult,
    RefusedDelivery,
    RetryableDelivery,
    SinkContext,
    SinkError,
    event_id_for,
    sink_class,
)
from acklane.core.sinks.broker import BrokerSink, BrokerSinkSettings
from acklane.integration.emulator import free_port

BROKERS = ["kafka", "sqs", "pubsub", "servicebus"]


@dataclass(frozen=True)
class Received:
    """One message as the broker's SDK read it back."""

    body: bytes
    attributes: dict[str, str]
    key: str | None = None
    #: Service Bus MessageId, SQS FIFO MessageDeduplicationId.
    dedupe: str | None = None

    def document(self) -> Any:
        return json.loads(self.body)


@dataclass
class Target:
    """A fresh topic or queue on one broker's emulator: the stream block that names it,
    and how to read what arrived."""

    block: dict[str, Any]
    read: Callable[[int], Awaitable[list[Received]]]
    extra: dict[str, Any] = field(default_factory=dict)


def _streams(**blocks: dict[str, Any]) -> dict[str, StreamConfig]:
    document = {
        "store": {"url": "sqlite:///:memory:"},
        "streams": blocks,
        "watchers": [{"name": f"w-{name}", "stream": name} for name in blocks],
    }
    return dict(parse_config(json.dumps(document), env={}).streams)


def _delivery(n: int, payload: Any = None, *, attempt: int = 1) -> Delivery:
    created = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    message_id = f"upstream/{n}"
    return Delivery(
        event_id=event_id_for(
            watcher="orders",
            stream="orders-key",
            message_id=message_id,
            position=0,
            store_id=n,
            created_at=created,
        ),
        store_id=n,
        watcher="orders",
        stream="orders-key",
        message_id=message_id,
        position=0,
        payload={"id": n, "amount": 10 * n} if payload is None else payload,
        created_at=created,
        attempt=attempt,
    )


def _sink(streams: dict[str, StreamConfig], **fields: Any) -> BrokerSink:
    settings = BrokerSinkSettings.model_validate(
        {"name": "forward", "kind": "broker", "stream": "out", **fields}
    )
    return BrokerSink(settings, SinkContext(streams=streams))


async def _deliver(target: Target, batch: list[Delivery], **fields: Any) -> list[DeliveryResult]:
    async with _sink(_streams(out=target.block), **fields) as sink:
        return await sink.deliver(batch)


# -- one fresh destination per broker


async def _kafka(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    kit = request.getfixturevalue("kafka_kit")
    topic = kit.new_topic("sink")

    async def read(n: int) -> list[Received]:
        records = await asyncio.to_thread(kit.read, topic, n)
        return [
            Received(
                r.value(),
                {k: v.decode() for k, v in r.headers() or []},
                None if r.key() is None else r.key().decode(),
            )
            for r in records
        ]

    block = {
        "connector": "kafka",
        "bootstrap_servers": kit.bootstrap_servers,
        "topics": [topic],
        "group_id": "g",
    }
    yield Target(block, read)


def _sqs_received(message: dict[str, Any]) -> Received:
    attributes = {k: v["StringValue"] for k, v in message.get("MessageAttributes", {}).items()}
    system = message.get("Attributes", {})
    return Received(
        message["Body"].encode(),
        attributes,
        system.get("MessageGroupId"),
        system.get("MessageDeduplicationId"),
    )


async def _sqs(request: pytest.FixtureRequest, *, fifo: bool = False) -> AsyncIterator[Target]:
    from acklane.integration.sqs import sqs_client

    settings = request.getfixturevalue("sqs_emulator").client_settings()
    client = sqs_client(settings)
    name = f"sink-{uuid.uuid4().hex[:8]}" + (".fifo" if fifo else "")
    attributes = {"FifoQueue": "true"} if fifo else {}
    url = client.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]

    def receive(n: int) -> list[Received]:
        out: list[Received] = []
        for _ in range(10):
            got = client.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=10,
                MessageAttributeNames=["All"],
                MessageSystemAttributeNames=["All"],
                WaitTimeSeconds=1,
            ).get("Messages", [])
            for message in got:
                client.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
            out += [_sqs_received(m) for m in got]
            if len(out) >= n:
                break
        return out

    async def read(n: int) -> list[Received]:
        return await asyncio.to_thread(receive, n)

    block = {"connector": "sqs", **settings, "queue_name": name}
    yield Target(block, read, {"client": client, "url": url})
    client.delete_queue(QueueUrl=url)


async def _pubsub(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    from acklane.integration.pubsub import PubSubKit

    settings = request.getfixturevalue("pubsub_emulator").client_settings()
    async with PubSubKit(settings) as kit:
        topic = await kit.create_topic("sink")
        subscription = await kit.create_subscription(topic, ordering=True)

        async def read(n: int) -> list[Received]:
            got = await kit.drain(subscription, expect=n, within=10)
            return [
                Received(
                    r.message.data,
                    dict(r.message.attributes),
                    r.message.ordering_key or None,
                )
                for r in got
            ]

        yield Target({"connector": "pubsub", **settings, "subscription": subscription}, read)


async def _servicebus(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    from acklane.integration.servicebus import ServiceBusKit

    emulator = request.getfixturevalue("servicebus_emulator")
    queue = emulator.create_queue()
    connection = emulator.client_settings()["connection_string"]

    async def read(n: int) -> list[Received]:
        got = await asyncio.to_thread(ServiceBusKit(connection).receive, queue, n, wait=5)
        return [
            Received(
                b"".join(m.body),
                {k.decode(): v.decode() for k, v in (m.application_properties or {}).items()},
                m.session_id,
                m.message_id,
            )
            for m in got
        ]

    yield Target({"connector": "servicebus", "connection_string": connection, "queue": queue}, read)
    emulator.delete_entity(queue)


_TARGETS = {"kafka": _kafka, "sqs": _sqs, "pubsub": _pubsub, "servicebus": _servicebus}


@pytest.fixture(params=BROKERS)
async def target(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    """A fresh destination on each broker's emulator in turn."""
    async for made in _TARGETS[request.param](request):
        yield made


@pytest.fixture
async def fifo(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    async for made in _sqs(request, fifo=True):
        yield made


# -- what every broker gets


def test_the_registry_names_the_broker_sink() -> None:
    assert sink_class("broker") is BrokerSink


async def test_each_broker_gets_the_event_document_and_its_event_id_attribute(
    target: Target,
) -> None:
    event = _delivery(1)
    assert await _deliver(target, [event]) == [None]
    [got] = await target.read(1)
    assert got.document() == {**event.acklane_fields(), "payload": {"id": 1, "amount": 10}}
    assert got.attributes == {
        "acklane-event-id": event.event_id,
        "acklane-watcher": "orders",
        "acklane-stream": "orders-key",
    }


async def test_a_batch_reaches_each_broker_whole(target: Target) -> None:
    batch = [_delivery(n) for n in range(1, 6)]
    assert await _deliver(target, batch, batch_size=5) == [None] * 5
    got = await target.read(5)
    assert sorted(r.attributes["acklane-event-id"] for r in got) == sorted(
        e.event_id for e in batch
    )
    assert sorted(r.document()["payload"]["id"] for r in got) == [1, 2, 3, 4, 5]


async def test_an_unreachable_broker_is_retryable() -> None:
    from acklane.integration.servicebus import connection_string

    port = free_port()  # nothing listens there
    blocks = {
        "kafka": {
            "connector": "kafka",
            "bootstrap_servers": f"127.0.0.1:{port}",
            "topics": ["orders"],
            "group_id": "g",
            "dead_letter_flush_timeout": 1,
        },
        "sqs": {
            "connector": "sqs",
            "endpoint_url": f"http://127.0.0.1:{port}",
            "region": "us-east-1",
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
            "queue_url": f"http://127.0.0.1:{port}/123456789012/orders",
        },
        "pubsub": {
            "connector": "pubsub",
            "project": "p",
            "emulator_host": f"127.0.0.1:{port}",
            "subscription": "orders",
        },
        "servicebus": {
            "connector": "servicebus",
            "connection_string": connection_string("127.0.0.1", port),
            "queue": "orders",
        },
    }

    async def attempt(block: dict[str, Any]) -> list[DeliveryResult]:
        target = Target(block, read=lambda n: asyncio.sleep(0, []))
        return await _deliver(target, [_delivery(1)], timeout=3, destination=None)

    async with asyncio.TaskGroup() as tg:
        tasks = {name: tg.create_task(attempt(block)) for name, block in blocks.items()}
    for name, task in tasks.items():
        [result] = task.result()
        assert isinstance(result, RetryableDelivery), (name, result)
        assert result.reason, name


# -- the broker's own dedupe key


async def test_an_sqs_fifo_queue_keeps_one_copy_of_an_event_sent_twice(fifo: Target) -> None:
    event = _delivery(1)
    assert await _deliver(fifo, [event]) == [None]
    assert await _deliver(fifo, [_delivery(1, attempt=2)]) == [None]  # a retry, same id
    client, url = fifo.extra["client"], fifo.extra["url"]
    counts = client.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    assert counts["ApproximateNumberOfMessages"] == "1"
    [got] = await fifo.read(1)
    assert got.dedupe == event.event_id


async def test_a_servicebus_message_id_is_the_event_id(request: pytest.FixtureRequest) -> None:
    async for target in _servicebus(request):
        event = _delivery(1)
        assert await _deliver(target, [event]) == [None]
        [got] = await target.read(1)
        assert got.dedupe == event.event_id


async def test_the_key_setting_becomes_the_record_key(request: pytest.FixtureRequest) -> None:
    async for target in _kafka(request):
        assert await _deliver(target, [_delivery(1)], key="watcher") == [None]
        [got] = await target.read(1)
        assert got.key == "orders"


# -- what is parked, what is retried


#: What each broker says of a message over its size limit, and the events that arrive.
#: Kafka's producer (here limited to 100 kB) and Service Bus's publisher had sent the
#: first event before they met the big one; sent again alone, it arrives twice (Service
#: Bus's MessageId dedupes it on an entity with duplicate detection).
TOO_LARGE = {
    "kafka": ("MSG_SIZE_TOO_LARGE", [1, 1, 3]),
    "sqs": ("BatchRequestTooLong", [1, 3]),
    "servicebus": ("MessageSizeExceededError", [1, 1, 3]),
}


@pytest.mark.parametrize("broker", sorted(TOO_LARGE))
async def test_a_message_too_large_for_the_broker_is_parked_alone(
    request: pytest.FixtureRequest, broker: str
) -> None:
    big = _delivery(2, {"id": 2, "blob": "x" * 1_100_000})  # over SQS's and Service Bus's 1 MiB
    batch = [_delivery(1), big, _delivery(3)]
    said, expected = TOO_LARGE[broker]
    async for target in _TARGETS[broker](request):
        if broker == "kafka":
            target.block["dead_letter_client"] = {"message.max.bytes": 100_000}
        results = await _deliver(target, batch, batch_size=3)
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], RefusedDelivery)
        assert said in results[1].reason
        got = await target.read(len(expected))
        assert sorted(r.document()["payload"]["id"] for r in got) == expected


def _publish_error(text: str, cause: BaseException | None = None) -> BaseException:
    """A PublishError as the publishers raise it: from the SDK's exception, when any."""
    from acklane.core.connectors import PublishError

    try:
        try:
            if cause is not None:
                raise cause
        except Exception as exc:
            raise PublishError(text) from exc
        raise PublishError(text)
    except PublishError as error:
        return error


def _sdk_errors() -> list[tuple[str, BaseException, bool]]:
    from azure.servicebus.exceptions import ServiceBusConnectionError, ServiceBusServerBusyError
    from botocore.exceptions import ClientError
    from confluent_kafka import KafkaError, KafkaException
    from google.api_core import exceptions as google

    def client_error(code: str) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": "..."}}, "SendMessageBatch")

    return [
        (
            "pubsub too large",
            _publish_error(
                "pubsub topic t: InvalidArgument: 400 Request payload size exceeds the limit",
                google.InvalidArgument("Request payload size exceeds the limit"),
            ),
            True,
        ),
        (
            "pubsub unavailable",
            _publish_error("pubsub topic t: ServiceUnavailable", google.ServiceUnavailable("x")),
            False,
        ),
        ("pubsub topic gone", _publish_error("pubsub topic t", google.NotFound("t")), False),
        (
            "kafka broker refused the size",
            _publish_error(
                "kafka topic t: 1 record(s) refused, the first: MSG_SIZE_TOO_LARGE: Broker: "
                "Message size too large"
            ),
            True,
        ),
        (
            "kafka local size check",
            KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)),
            True,
        ),
        (
            "kafka timed out",
            _publish_error("kafka topic t: 1 record(s) refused, the first: _MSG_TIMED_OUT: x"),
            False,
        ),
        (
            "kafka not authorised",
            _publish_error("kafka topic t: TOPIC_AUTHORIZATION_FAILED: Broker: not authorized"),
            False,
        ),
        (
            "sqs entry refused",
            _publish_error(
                "sqs queue q: 1 message(s) refused, the first: InvalidMessageContents: bad char"
            ),
            True,
        ),
        (
            "sqs throttled",
            _publish_error("sqs queue q: throttled", client_error("ThrottlingException")),
            False,
        ),
        (
            "sqs queue gone",
            _publish_error("sqs queue q: gone", client_error("QueueDoesNotExist")),
            False,
        ),
        (
            "servicebus busy",
            _publish_error("servicebus queue q: busy", ServiceBusServerBusyError(message="busy")),
            False,
        ),
        (
            "servicebus unreachable",
            _publish_error("servicebus queue q: down", ServiceBusConnectionError(message="x")),
            False,
        ),
        ("anything else", ConnectionResetError("reset by peer"), False),
    ]


@pytest.mark.parametrize(
    ("error", "refused"), [c[1:] for c in _sdk_errors()], ids=[c[0] for c in _sdk_errors()]
)
def test_only_what_a_broker_refuses_for_good_is_parked(error: BaseException, refused: bool) -> None:
    """Pure logic, on the SDKs' own exceptions: the cases the emulators cannot produce."""
    from acklane.core.sinks.broker import delivery_outcome

    outcome = delivery_outcome(error, "the destination")
    assert type(outcome) is (RefusedDelivery if refused else RetryableDelivery)
    assert outcome.reason


def test_a_known_secret_never_reaches_a_reason() -> None:
    from acklane.core.observe.redact import forget_all, remember
    from acklane.core.sinks.broker import delivery_outcome

    remember(["planted-secret-42"])
    try:
        outcome = delivery_outcome(
            _publish_error("sqs queue q: signature of key planted-secret-42 refused"), "q"
        )
    finally:
        forget_all()
    assert "planted-secret-42" not in outcome.reason
    assert outcome.reason.startswith("sqs queue q: signature of key ")


async def test_a_queue_that_appears_later_is_delivered_to(request: pytest.FixtureRequest) -> None:
    from acklane.integration.sqs import sqs_client

    settings = request.getfixturevalue("sqs_emulator").client_settings()
    name = f"later-{uuid.uuid4().hex[:8]}"
    streams = _streams(out={"connector": "sqs", **settings, "queue_name": name})
    async with _sink(streams) as sink:
        [missing] = await sink.deliver([_delivery(1)])
        assert isinstance(missing, RetryableDelivery)
        assert "not found" in missing.reason
        client = sqs_client(settings)
        client.create_queue(QueueName=name)
        assert await sink.deliver([_delivery(1, attempt=2)]) == [None]


# -- validate --connect


async def test_check_reaches_the_stream_and_names_what_failed(
    request: pytest.FixtureRequest,
) -> None:
    async for target in _sqs(request):
        ok = dict(target.block)
        missing = {**target.block, "queue_name": "no-such-queue"}
        await _sink(_streams(out=ok)).check()
        with pytest.raises(SinkError, match="sink 'forward': sqs queue=no-such-queue"):
            await _sink(_streams(out=missing)).check()


# -- configuration problems (no broker needed)

KAFKA = {"connector": "kafka", "bootstrap_servers": "127.0.0.1:9", "group_id": "g"}
SQS = {
    "connector": "sqs",
    "queue_name": "orders",
    "region": "us-east-1",
    "endpoint_url": "http://127.0.0.1:9",
}


def _problems(block: dict[str, Any], **fields: Any) -> list[str]:
    settings = BrokerSinkSettings.model_validate(
        {"name": "forward", "kind": "broker", "stream": "out", **fields}
    )
    return BrokerSink.check_config(settings, _streams(out=block))


def test_a_stream_that_is_not_configured_is_named() -> None:
    settings = BrokerSinkSettings.model_validate(
        {"name": "forward", "kind": "broker", "stream": "ordrs"}
    )
    problems = BrokerSink.check_config(settings, _streams(out={**KAFKA, "topics": ["t"]}))
    assert problems == ["stream: no stream named 'ordrs' (streams: out)"]


def test_a_stream_whose_connector_cannot_publish_is_refused() -> None:
    [problem] = _problems({"connector": "memory", "topics": ["orders"]})
    assert problem.startswith("stream: stream 'out' cannot be published to: ")


def test_a_kafka_stream_of_several_topics_needs_a_destination() -> None:
    block = {**KAFKA, "topics": ["a", "b"]}
    [problem] = _problems(block)
    assert problem.startswith("destination: stream 'out': the stream reads 2 topic(s)")
    assert problem.endswith("name the one to publish to (destination)")
    assert _problems(block, destination="b") == []


def test_a_destination_on_a_stream_that_publishes_only_to_its_own_queue_is_refused() -> None:
    assert _problems(SQS, destination="other") == [
        "destination: stream 'out': an SQS stream reads one queue: it takes no destination"
    ]


def test_a_key_on_a_standard_sqs_queue_is_refused() -> None:
    [problem] = _problems(SQS, key="watcher")
    assert problem.startswith("key: on SQS a key is a FIFO queue's MessageGroupId")
    assert _problems({**SQS, "queue_name": "orders.fifo"}, key="watcher") == []


def test_a_batch_size_above_what_the_publisher_sends_at_once_is_refused() -> None:
    assert _problems(SQS, batch_size=500) == [
        "batch_size: 500 is more than the sqs publisher sends at once (100)"
    ]


async def test_opening_a_sink_with_a_configuration_problem_raises_sink_error() -> None:
    sink = _sink(_streams(out={**KAFKA, "topics": ["a", "b"]}))
    with pytest.raises(SinkError, match="sink 'forward': destination: "):
        await sink.open()
