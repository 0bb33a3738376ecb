"""acklane's Pub/Sub emulator, driven only by the official client (google-cloud-pubsub).

One behaviour per test, each one the connector relies on. The session's emulator
runs in relaxed mode (ack deadlines from 1 s); the limits test starts a strict
one in this process.
"""

from __future__ import annotations

import contextlib
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
