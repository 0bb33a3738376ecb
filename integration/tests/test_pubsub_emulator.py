"""acklane's Pub/Sub emulator, driven only by the official client (google-cloud-pubsub).

One behaviour per test, each one the connector relies on. The session's emulator
runs in relaxed mode (ack deadlines from 1 s); the limits test starts a strict
one in this process.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.pubsub_v1 import types

from acklane.integration.emulator import Emulator
from acklane.integration.pubsub import DEFAULT_PROJECT, ServerThread, subscription_stats

PROJECT = DEFAULT_PROJECT
pytestmark = pytest.mark.filterwarnings("ignore:The return_immediately flag:DeprecationWarning")


class Clients:
    def __init__(self, publisher: Any, subscriber: Any) -> None:
        self.publisher = publisher
        self.subscriber = subscriber
        self.topics: list[str] = []
        self.subscriptions: list[str] = []

    def topic(self) -> str:
        name = f"projects/{PROJECT}/topics/t-{uuid.uuid4().hex[:10]}"
        self.publisher.create_topic(name=name)
        self.topics.append(name)
        return name

    def subscription(self, topic: str, **fields: Any) -> str:
        name = f"projects/{PROJECT}/subscriptions/s-{uuid.uuid4().hex[:10]}"
        self.subscriber.create_subscription(
            request=types.Subscription(name=name, topic=topic, **fields)
        )
        self.subscriptions.append(name)
        return name

    def publish(self, topic: str, *bodies: str, key: str = "", **attributes: str) -> list[str]:
        futures = [
            self.publisher.publish(topic, b.encode(), ordering_key=key, **attributes)
            for b in bodies
        ]
        return [f.result(timeout=10) for f in futures]

    def pull(self, subscription: str, n: int = 10) -> list[Any]:
        response = self.subscriber.pull(subscription=subscription, max_messages=n, timeout=10)
        return list(response.received_messages)

    def pull_now(self, subscription: str, n: int = 10) -> list[Any]:
        """A pull that answers at once, empty or not (``return_immediately``)."""
        request = types.PullRequest(
            subscription=subscription, max_messages=n, return_immediately=True
        )
        return list(self.subscriber.pull(request=request, timeout=10).received_messages)

    def pull_until(self, subscription: str, count: int, within: float = 10.0) -> list[Any]:
        got: list[Any] = []
        deadline = time.monotonic() + within
        while len(got) < count and time.monotonic() < deadline:
            got += self.pull(subscription)
        return got

    def ack(self, subscription: str, received: list[Any]) -> None:
        self.subscriber.acknowledge(subscription=subscription, ack_ids=[r.ack_id for r in received])


def _clients(host: str, monkeypatch: pytest.MonkeyPatch) -> Clients:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", host)
    options = pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    return Clients(
        pubsub_v1.PublisherClient(publisher_options=options), pubsub_v1.SubscriberClient()
    )


@pytest.fixture
def ps(pubsub_emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[Clients]:
    clients = _clients(pubsub_emulator.endpoint, monkeypatch)
    yield clients
    for name in clients.subscriptions:
        with contextlib.suppress(exceptions.NotFound):
            clients.subscriber.delete_subscription(subscription=name)
    clients.subscriber.close()
    clients.publisher.stop()


def test_topics_are_created_got_listed_and_deleted(ps: Clients) -> None:
    topic = ps.topic()
    assert ps.publisher.get_topic(topic=topic).name == topic
    with pytest.raises(exceptions.AlreadyExists):
        ps.publisher.create_topic(name=topic)
    names = [t.name for t in ps.publisher.list_topics(project=f"projects/{PROJECT}")]
    assert topic in names
    ps.publisher.delete_topic(topic=topic)
    with pytest.raises(exceptions.NotFound):
        ps.publisher.get_topic(topic=topic)
    with pytest.raises(exceptions.NotFound):
        ps.publisher.publish(topic, b"x").result(timeout=10)


def test_subscriptions_are_created_got_listed_and_deleted(ps: Clients) -> None:
    topic = ps.topic()
    sub = ps.subscription(topic, ack_deadline_seconds=30)
    got = ps.subscriber.get_subscription(subscription=sub)
    assert (got.topic, got.ack_deadline_seconds) == (topic, 30)
    assert sub in [s.name for s in ps.subscriber.list_subscriptions(project=f"projects/{PROJECT}")]
    assert list(ps.publisher.list_topic_subscriptions(topic=topic)) == [sub]
    with pytest.raises(exceptions.NotFound):
        ps.subscription(f"projects/{PROJECT}/topics/missing-{uuid.uuid4().hex[:6]}")
    ps.subscriber.delete_subscription(subscription=sub)
    with pytest.raises(exceptions.NotFound):
        ps.subscriber.get_subscription(subscription=sub)


def test_publish_assigns_ids_unique_within_the_topic_and_a_publish_time(ps: Clients) -> None:
    topic = ps.topic()
    sub = ps.subscription(topic)
    before = time.time()
    ids = ps.publish(topic, "a", "b", "c")
    assert len(set(ids)) == 3
    received = ps.pull_until(sub, 3)
    assert sorted(r.message.message_id for r in received) == sorted(ids)
    for r in received:
        assert before - 1 <= r.message.publish_time.timestamp() <= time.time() + 1


def test_attributes_and_ordering_key_reach_the_subscriber(ps: Clients) -> None:
    topic = ps.topic()
    sub = ps.subscription(topic)
    ps.publish(topic, "hello", key="k1", color="red")
    [r] = ps.pull_until(sub, 1)
    assert r.message.data == b"hello"
    assert dict(r.message.attributes) == {"color": "red"}
    assert r.message.ordering_key == "k1"


def test_every_subscription_gets_its_own_copy(ps: Clients) -> None:
    topic = ps.topic()
    one, two = ps.subscription(topic), ps.subscription(topic)
    ps.publish(topic, "x")
    assert len(ps.pull_until(one, 1)) == 1
    assert len(ps.pull_until(two, 1)) == 1


def test_an_acknowledged_message_is_not_delivered_again(ps: Clients) -> None:
    topic = ps.topic()
    sub = ps.subscription(topic, ack_deadline_seconds=1)
    ps.publish(topic, "x")
    received = ps.pull_until(sub, 1)
    ps.ack(sub, received)
    time.sleep(1.2)
    assert ps.pull_now(sub) == []


def test_an_expired_ack_deadline_redelivers_with_a_new_ack_id(ps: Clients) -> None:
    topic = ps.topic()
    sub = ps.subscription(topic, ack_deadline_seconds=1)
    ps.publish(topic, "x")
    [first] = ps.pull_until(sub, 1)
    assert ps.pull_now(sub) == []  # leased: not delivered meanwhile
    [again] = ps.pull_until(sub, 1)
    assert again.message.message_id == first.message.message_id
    assert again.ack_id != first.ack_id
    ps.ack(sub, [first])  # too late: ignored
    ps.ack(sub, [again])


def test_modify_ack_deadline_extends_the_lease(ps: Clients) -> None:
    topic = ps.topic()
    sub = ps.subscription(topic, ack_deadline_seconds=1)
    ps.publish(topic, "x")
    [r] = ps.pull_until(sub, 1)
    ps.subscriber.modify_ack_deadline(subscription=sub, ack_ids=[r.ack_id], ack_deadline_seconds=5)
    time.sleep(1.5)
    assert ps.pull_now(sub) == []  # past the subscription's deadline, still leased
    ps.ack(sub, [r])
    assert ps.pull_now(sub) == []


def test_inspection_reads_backlog_and_leases_without_leasing(
    ps: Clients, pubsub_emulator: Emulator
) -> None:
    if pubsub_emulator.backend != "local":
        pytest.skip("the inspection call is acklane's emulator's own")
    host = pubsub_emulator.endpoint
    topic = ps.topic()
    sub = ps.subscription(topic, ack_deadline_seconds=60)
    ps.publish(topic, "a", "b", "c")
    assert subscription_stats(host, sub) == {"backlog": 3, "leased": 0, "delayed": 0}
    assert subscription_stats(host, sub) == {"backlog": 3, "leased": 0, "delayed": 0}
    received = ps.pull_until(sub, 3)  # the inspection leased nothing: all three come
    assert len(received) == 3
    assert subscription_stats(host, sub) == {"backlog": 3, "leased": 3, "delayed": 0}
    ps.ack(sub, received[:2])
    assert subscription_stats(host, sub) == {"backlog": 1, "leased": 1, "delayed": 0}
    ps.ack(sub, received[2:])
    assert subscription_stats(host, sub) == {"backlog": 0, "leased": 0, "delayed": 0}
    with pytest.raises(grpc.RpcError) as missing:
        subscription_stats(host, f"projects/{PROJECT}/subscriptions/missing-{uuid.uuid4().hex}")
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


def test_modify_ack_deadline_zero_is_a_nack(ps: Clients) -> None:
    topic = ps.topic()
    sub = ps.subscription(topic, ack_deadline_seconds=60)
    ps.publish(topic, "x")
    [r] = ps.pull_until(sub, 1)
    ps.subscriber.modify_ack_deadline(subscription=sub, ack_ids=[r.ack_id], ack_deadline_seconds=0)
    [again] = ps.pull(sub)
    assert again.message.message_id == r.message.message_id


def test_delivery_attempt_is_set_only_with_a_dead_letter_policy(ps: Clients) -> None:
    topic, dead = ps.topic(), ps.topic()
    plain = ps.subscription(topic)
    policy = types.DeadLetterPolicy(dead_letter_topic=dead, max_delivery_attempts=5)
    counted = ps.subscription(topic, dead_letter_policy=policy)
    ps.publish(topic, "x")
    [p] = ps.pull_until(plain, 1)
    assert p.delivery_attempt == 0
    [c] = ps.pull_until(counted, 1)
    assert c.delivery_attempt == 1
    ps.subscriber.modify_ack_deadline(
        subscription=counted, ack_ids=[c.ack_id], ack_deadline_seconds=0
    )
    [c2] = ps.pull_until(counted, 1)
    assert c2.delivery_attempt == 2


def test_dead_letter_policy_forwards_after_max_delivery_attempts(ps: Clients) -> None:
    topic, dead = ps.topic(), ps.topic()
    dead_sub = ps.subscription(dead)
    policy = types.DeadLetterPolicy(dead_letter_topic=dead, max_delivery_attempts=2)
    sub = ps.subscription(topic, dead_letter_policy=policy)
    [mid] = ps.publish(topic, "poison", origin="app")
    for attempt in (1, 2):
        [r] = ps.pull_until(sub, 1)
        assert r.delivery_attempt == attempt
        ps.subscriber.modify_ack_deadline(
            subscription=sub, ack_ids=[r.ack_id], ack_deadline_seconds=0
        )
    assert ps.pull_now(sub) == []
    [copy] = ps.pull_until(dead_sub, 1)
    attrs = dict(copy.message.attributes)
    assert copy.message.data == b"poison"
    assert attrs["origin"] == "app"
    assert attrs["CloudPubSubDeadLetterSourceDeliveryCount"] == "2"
    assert attrs["CloudPubSubDeadLetterSourceSubscription"] == sub.rsplit("/", 1)[1]
    assert attrs["CloudPubSubDeadLetterSourceSubscriptionProject"] == PROJECT
    assert attrs["CloudPubSubDeadLetterSourceTopicPublishTime"]
    assert copy.message.message_id  # a new id in the dead-letter topic
    assert mid


def test_ordering_key_delivers_the_next_message_only_after_an_ack(ps: Clients) -> None:
    topic = ps.topic()
    sub = ps.subscription(topic, enable_message_ordering=True, ack_deadline_seconds=60)
    ps.publish(topic, "k1", "k2", "k3", key="k")
    ps.publish(topic, "other")
    first = ps.pull_until(sub, 2)
    assert sorted(r.message.data for r in first) == [b"k1", b"other"]
    assert ps.pull_now(sub) == []  # k2 waits for k1
    ps.subscriber.modify_ack_deadline(
        subscription=sub,
        ack_ids=[r.ack_id for r in first if r.message.data == b"k1"],
        ack_deadline_seconds=0,
    )
    [again] = ps.pull_until(sub, 1)
    assert again.message.data == b"k1"  # the nacked one first, never k2
    ps.ack(sub, [again])
    [second] = ps.pull_until(sub, 1)
    assert second.message.data == b"k2"


def test_streaming_pull_respects_flow_control_and_nack_redelivers(ps: Clients) -> None:
    topic = ps.topic()
    sub = ps.subscription(topic, ack_deadline_seconds=10)
    ps.publish(topic, *[f"m{i}" for i in range(6)])
    lock = threading.Lock()
    held: list[Any] = []
    seen: list[str] = []
    peak = 0
    done = threading.Event()

    def callback(message: Any) -> None:
        nonlocal peak
        with lock:
            held.append(message)
            seen.append(message.data.decode())
            peak = max(peak, len(held))
        if message.data == b"m0" and seen.count("m0") == 1:
            with lock:
                held.remove(message)
            message.nack()
            return
        time.sleep(0.1)
        with lock:
            held.remove(message)
        message.ack()
        if len(set(seen)) == 6 and seen.count("m0") == 2:
            done.set()

    future = ps.subscriber.subscribe(
        sub, callback, flow_control=pubsub_v1.types.FlowControl(max_messages=2)
    )
    try:
        assert done.wait(15), seen
    finally:
        future.cancel()
        future.result(timeout=10)
    assert peak <= 2
    assert seen.count("m0") == 2


def test_service_limits_are_enforced_and_relaxed_mode_lowers_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    strict = ServerThread(relaxed=False)
    strict.start()
    try:
        ps = _clients(strict.endpoint, monkeypatch)
        topic, dead = ps.topic(), ps.topic()
        with pytest.raises(exceptions.InvalidArgument):
            ps.subscription(topic, ack_deadline_seconds=5)
        with pytest.raises(exceptions.InvalidArgument):
            ps.subscription(topic, ack_deadline_seconds=601)
        policy = types.DeadLetterPolicy(dead_letter_topic=dead, max_delivery_attempts=3)
        with pytest.raises(exceptions.InvalidArgument):
            ps.subscription(topic, dead_letter_policy=policy)
        sub = ps.subscription(topic)  # default deadline: 10 s
        assert ps.subscriber.get_subscription(subscription=sub).ack_deadline_seconds == 10
        ps.publish(topic, "x")
        [r] = ps.pull_until(sub, 1)
        with pytest.raises(exceptions.InvalidArgument):
            ps.subscriber.modify_ack_deadline(
                subscription=sub, ack_ids=[r.ack_id], ack_deadline_seconds=601
            )
        ps.subscriber.close()
        ps.publisher.stop()
    finally:
        strict.stop()
    relaxed = ServerThread(relaxed=True)
    relaxed.start()
    try:
        ps = _clients(relaxed.endpoint, monkeypatch)
        topic, dead = ps.topic(), ps.topic()
        policy = types.DeadLetterPolicy(dead_letter_topic=dead, max_delivery_attempts=1)
        sub = ps.subscription(topic, ack_deadline_seconds=1, dead_letter_policy=policy)
        assert ps.subscriber.get_subscription(subscription=sub).ack_deadline_seconds == 1
        ps.subscriber.close()
        ps.publisher.stop()
    finally:
        relaxed.stop()


# ---------------------------------------------------------------- fidelity: nothing ignored


@pytest.mark.parametrize(
    ("expression", "attributes", "expected"),
    [
        ('attributes.kind = "order"', {"kind": "order"}, True),
        ('attributes.kind = "order"', {"kind": "refund"}, False),
        ('attributes.kind != "order"', {"kind": "refund"}, True),
        ('attributes.kind != "order"', {}, False),
        ("attributes:kind", {"kind": ""}, True),
        ("NOT attributes:kind", {"kind": ""}, False),
        ("-attributes:kind", {}, True),
        ('hasPrefix(attributes.kind, "ord")', {"kind": "order"}, True),
        ('hasPrefix(attributes.kind, "ord")', {}, False),
        ('attributes."iana.org/language_tag" = "en"', {"iana.org/language_tag": "en"}, True),
        (
            '(attributes.a = "1" OR attributes.b = "2") AND NOT attributes:test',
            {"b": "2"},
            True,
        ),
        (
            '(attributes.a = "1" OR attributes.b = "2") AND NOT attributes:test',
            {"b": "2", "test": "y"},
            False,
        ),
        ('attributes.quote = "say \\"hi\\""', {"quote": 'say "hi"'}, True),
    ],
)
def test_the_filter_language_on_attributes(
    expression: str, attributes: dict[str, str], expected: bool
) -> None:
    from acklane.integration.pubsub._filter import compile_filter

    predicate = compile_filter(expression)
    assert predicate is not None
    assert predicate(attributes) is expected


@pytest.mark.parametrize(
    "expression",
    [
        'attributes.a = "1" AND attributes.b = "2" OR attributes:c',  # AND/OR unparenthesised
        "attributes.a = 1",  # values are string literals
        "hasPrefix(attributes.a)",
        "data = 'x'",  # only attributes can be filtered
        "attributes:" + "k" * 300,  # over 256 bytes
    ],
)
def test_a_filter_the_service_refuses_is_refused(ps: Clients, expression: str) -> None:
    topic = ps.topic()
    with pytest.raises(exceptions.InvalidArgument, match="filter"):
        ps.subscription(topic, filter=expression)


def test_a_subscription_filter_delivers_only_the_matching_messages(ps: Clients) -> None:
    topic = ps.topic()
    sub = ps.subscription(topic, filter='attributes.kind = "order" AND NOT attributes:test')
    ps.publish(topic, "a", kind="order")
    ps.publish(topic, "b", kind="refund")
    ps.publish(topic, "c", kind="order", test="1")
    ps.publish(topic, "d", kind="order")
    got = ps.pull_until(sub, 2)
    assert sorted(r.message.data for r in got) == [b"a", b"d"]
    ps.ack(sub, got)
    assert ps.pull_now(sub) == []  # the others were acknowledged by the service
    with pytest.raises(exceptions.InvalidArgument, match="filter cannot be changed"):
        ps.subscriber.update_subscription(
            request={
                "subscription": {"name": sub, "filter": ""},
                "update_mask": {"paths": ["filter"]},
            }
        )


def test_exactly_once_reports_an_expired_ack_id_and_acks_a_valid_one(ps: Clients) -> None:
    topic = ps.topic()
    sub = ps.subscription(topic, enable_exactly_once_delivery=True, ack_deadline_seconds=1)
    ps.publish(topic, "late", "in-time")
    got = ps.pull_until(sub, 2)
    late = next(r for r in got if r.message.data == b"late")
    in_time = next(r for r in got if r.message.data == b"in-time")
    ps.subscriber.modify_ack_deadline(
        subscription=sub, ack_ids=[in_time.ack_id], ack_deadline_seconds=30
    )
    time.sleep(1.3)  # the lease of "late" lapses
    with pytest.raises(exceptions.InvalidArgument) as caught:
        ps.subscriber.acknowledge(subscription=sub, ack_ids=[late.ack_id, in_time.ack_id])
    assert caught.value.reason == "EXACTLY_ONCE_ACKID_FAILURE"
    (info,) = [d for d in caught.value.details if hasattr(d, "metadata")]
    assert dict(info.metadata) == {late.ack_id: "PERMANENT_FAILURE_INVALID_ACK_ID"}
    again = ps.pull_until(sub, 1)  # "late" is delivered again; "in-time" was acked
    assert [r.message.data for r in again] == [b"late"]


def test_exactly_once_is_reported_to_the_streaming_subscriber(ps: Clients) -> None:
    from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeStatus

    topic = ps.topic()
    sub = ps.subscription(topic, enable_exactly_once_delivery=True, ack_deadline_seconds=10)
    ps.publish(topic, "once")
    results: list[Any] = []
    done = threading.Event()

    def callback(message: Any) -> None:
        results.append((message.data, message.ack_with_response().result(timeout=10)))
        done.set()

    future = ps.subscriber.subscribe(sub, callback)
    try:
        assert done.wait(15)
    finally:
        future.cancel()
        with contextlib.suppress(Exception):
            future.result(timeout=10)
    assert results == [(b"once", AcknowledgeStatus.SUCCESS)]


def test_seek_to_a_time_redelivers_retained_acked_messages(ps: Clients) -> None:
    from google.protobuf import timestamp_pb2

    topic = ps.topic()
    sub = ps.subscription(topic, retain_acked_messages=True)
    ps.publish(topic, "old")
    time.sleep(0.05)
    middle = timestamp_pb2.Timestamp()
    middle.GetCurrentTime()
    time.sleep(0.05)
    ps.publish(topic, "new")
    got = ps.pull_until(sub, 2)
    ps.ack(sub, got)
    assert ps.pull_now(sub) == []
    ps.subscriber.seek(request={"subscription": sub, "time": middle})
    again = ps.pull_until(sub, 1)
    assert [r.message.data for r in again] == [b"new"]
    ps.ack(sub, again)
    ps.subscriber.seek(request={"subscription": sub, "time": {"seconds": 0}})
    assert sorted(r.message.data for r in ps.pull_until(sub, 2)) == [b"new", b"old"]


def test_a_snapshot_brings_back_what_was_unacked_and_what_came_after(ps: Clients) -> None:
    topic = ps.topic()
    sub = ps.subscription(topic)
    ps.publish(topic, "acked-before")
    ps.ack(sub, ps.pull_until(sub, 1))
    ps.publish(topic, "pending")
    name = f"projects/{PROJECT}/snapshots/snap-{uuid.uuid4().hex[:8]}"
    snapshot = ps.subscriber.create_snapshot(request={"name": name, "subscription": sub})
    assert snapshot.topic == topic
    ps.publish(topic, "after")
    ps.ack(sub, ps.pull_until(sub, 2))
    assert ps.pull_now(sub) == []
    ps.subscriber.seek(request={"subscription": sub, "snapshot": name})
    assert sorted(r.message.data for r in ps.pull_until(sub, 2)) == [b"after", b"pending"]
    listed = ps.subscriber.list_snapshots(request={"project": f"projects/{PROJECT}"})
    assert name in [s.name for s in listed]
    assert list(ps.publisher.list_topic_snapshots(request={"topic": topic})) == [name]
    ps.subscriber.delete_snapshot(request={"snapshot": name})
    with pytest.raises(exceptions.NotFound):
        ps.subscriber.get_snapshot(request={"snapshot": name})


def test_update_topic_and_detach_subscription(ps: Clients) -> None:
    topic = ps.topic()
    updated = ps.publisher.update_topic(
        request={
            "topic": {"name": topic, "labels": {"team": "data"}},
            "update_mask": {"paths": ["labels"]},
        }
    )
    assert dict(updated.labels) == {"team": "data"}
    assert dict(ps.publisher.get_topic(topic=topic).labels) == {"team": "data"}
    sub = ps.subscription(topic)
    ps.publish(topic, "x")
    ps.publisher.detach_subscription(request={"subscription": sub})
    assert ps.subscriber.get_subscription(subscription=sub).detached
    with pytest.raises(exceptions.FailedPrecondition, match="detached"):
        ps.pull_now(sub)
    assert sub not in list(ps.publisher.list_topic_subscriptions(topic=topic))


@pytest.mark.parametrize(
    ("fields", "feature"),
    [
        ({"push_config": {"push_endpoint": "https://example.com/push"}}, "push subscriptions"),
        ({"bigquery_config": {"table": "p.d.t"}}, "bigquery_config"),
        ({"cloud_storage_config": {"bucket": "b"}}, "cloud_storage_config"),
    ],
)
def test_what_the_emulator_does_not_model_is_refused_by_name(
    ps: Clients, fields: dict[str, Any], feature: str
) -> None:
    topic = ps.topic()
    with pytest.raises(exceptions.MethodNotImplemented, match=feature):
        ps.subscription(topic, **fields)


def test_iam_is_refused_by_name(ps: Clients) -> None:
    topic = ps.topic()
    with pytest.raises(exceptions.MethodNotImplemented, match="IAM"):
        ps.publisher.get_iam_policy(request={"resource": topic})


AVRO_ORDER = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "int"}],
    }
)
PROTO_ORDER = 'syntax = "proto3";\nmessage Order {\n  string id = 1;\n  int32 amount = 2;\n}\n'


def _schema_client(host: str) -> Any:
    from google.pubsub_v1 import SchemaServiceClient
    from google.pubsub_v1.services.schema_service.transports import SchemaServiceGrpcTransport

    channel = grpc.insecure_channel(host)
    return SchemaServiceClient(transport=SchemaServiceGrpcTransport(channel=channel))


def test_a_topic_with_an_avro_schema_validates_what_is_published(
    ps: Clients, pubsub_emulator: Emulator
) -> None:
    schemas = _schema_client(pubsub_emulator.endpoint)
    schema_id = f"order-{uuid.uuid4().hex[:8]}"
    created = schemas.create_schema(
        request={
            "parent": f"projects/{PROJECT}",
            "schema_id": schema_id,
            "schema": {"type_": types.Schema.Type.AVRO, "definition": AVRO_ORDER},
        }
    )
    assert created.revision_id
    topic = f"projects/{PROJECT}/topics/t-{uuid.uuid4().hex[:10]}"
    ps.publisher.create_topic(
        request={
            "name": topic,
            "schema_settings": {"schema": created.name, "encoding": types.Encoding.JSON},
        }
    )
    sub = ps.subscription(topic)
    ps.publish(topic, json.dumps({"id": "o-1", "amount": 5}))
    with pytest.raises(exceptions.InvalidArgument, match="schema validation"):
        ps.publisher.publish(topic, json.dumps({"id": "o-2"}).encode()).result(timeout=10)
    (got,) = ps.pull_until(sub, 1)
    assert got.message.attributes["googclient_schemaname"] == created.name
    assert got.message.attributes["googclient_schemaencoding"] == "JSON"
    with pytest.raises(exceptions.InvalidArgument, match="Avro"):
        schemas.validate_schema(
            request={
                "parent": f"projects/{PROJECT}",
                "schema": {"type_": types.Schema.Type.AVRO, "definition": "{not json"},
            }
        )
    revised = schemas.commit_schema(
        request={"name": created.name, "schema": {"definition": AVRO_ORDER}}
    )
    revisions = list(schemas.list_schema_revisions(request={"name": created.name}))
    assert [r.revision_id for r in revisions] == [revised.revision_id, created.revision_id]
    schemas.delete_schema(request={"name": created.name})


def test_a_protobuf_schema_validates_binary_messages(
    ps: Clients, pubsub_emulator: Emulator
) -> None:
    schemas = _schema_client(pubsub_emulator.endpoint)
    created = schemas.create_schema(
        request={
            "parent": f"projects/{PROJECT}",
            "schema_id": f"proto-{uuid.uuid4().hex[:8]}",
            "schema": {"type_": types.Schema.Type.PROTOCOL_BUFFER, "definition": PROTO_ORDER},
        }
    )
    # an Order {id: "o-1", amount: 5}, encoded by hand: field 1 (string), field 2 (varint)
    order = b"\x0a\x03o-1\x10\x05"
    schemas.validate_message(
        request={
            "parent": f"projects/{PROJECT}",
            "name": created.name,
            "message": order,
            "encoding": types.Encoding.BINARY,
        }
    )
    topic = f"projects/{PROJECT}/topics/t-{uuid.uuid4().hex[:10]}"
    ps.publisher.create_topic(
        request={
            "name": topic,
            "schema_settings": {"schema": created.name, "encoding": types.Encoding.BINARY},
        }
    )
    ps.publisher.publish(topic, order).result(timeout=10)
    with pytest.raises(exceptions.InvalidArgument, match="schema validation"):
        ps.publisher.publish(topic, b"\xff\xff\xff").result(timeout=10)
    with pytest.raises(exceptions.InvalidArgument, match="exactly one top-level message"):
        schemas.create_schema(
            request={
                "parent": f"projects/{PROJECT}",
                "schema_id": f"two-{uuid.uuid4().hex[:8]}",
                "schema": {
                    "type_": types.Schema.Type.PROTOCOL_BUFFER,
                    "definition": PROTO_ORDER + "message Other { string x = 1; }\n",
                },
            }
        )
