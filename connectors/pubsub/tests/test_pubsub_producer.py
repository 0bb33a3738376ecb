"""The Pub/Sub producer against acklane's emulator: leases, outcomes, ordering, identity.

The producer is driven directly (``open_stream`` and ``advance``); what it did is
checked from outside, with the official client (:class:`PubSubKit`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import ValidationError

from acklane.connectors.pubsub import (
    PubSubConfig,
    PubSubConnector,
    PubSubDelivery,
    PubSubMessage,
    PubSubStreamProducer,
)
from acklane.core.connectors import load_connector
from acklane.core.producer import AdvanceItem, AdvanceOutcome
from acklane.integration.emulator import Emulator
from acklane.integration.pubsub import PubSubKit
from acklane.integration.testing import CLEAN, FAILED, UNCLAIMED, rejected

pytestmark = pytest.mark.filterwarnings("ignore:The return_immediately flag:DeprecationWarning")


@pytest.fixture
def settings(pubsub_emulator: Emulator) -> dict[str, Any]:
    return {**pubsub_emulator.client_settings(), "advance_linger": 0.01}


@pytest.fixture
async def kit(settings: dict[str, Any]) -> AsyncIterator[PubSubKit]:
    async with PubSubKit(settings) as k:
        yield k


class Open:
    """A producer with its stream open; closed (as the engine does) on exit."""

    def __init__(self, config: PubSubConfig) -> None:
        self.producer: PubSubStreamProducer = PubSubConnector.producer(config)
        self.stream = self.producer.open_stream()

    async def take(self, n: int, within: float = 10.0) -> list[tuple[PubSubMessage, Any]]:
        async with asyncio.timeout(within):
            return [await anext(self.stream) for _ in range(n)]

    async def advance(self, *items: tuple[Any, AdvanceOutcome]) -> None:
        await self.producer.advance([AdvanceItem(p, o) for p, o in items])
        await self.producer.flush()

    async def __aenter__(self) -> Open:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stream.aclose()
        await self.producer.aclose()


async def pull_now(kit: PubSubKit, sub: str) -> list[Any]:
    from google.pubsub_v1 import types

    request = types.PullRequest(subscription=sub, max_messages=100, return_immediately=True)
    return list((await kit.subscriber.pull(request=request)).received_messages)


def test_the_connector_is_found_by_its_entry_point() -> None:
    assert load_connector("pubsub") is PubSubConnector


def test_configuration_errors_name_the_field() -> None:
    with pytest.raises(ValidationError, match="project"):
        PubSubConfig(subscription="orders")
    with pytest.raises(ValidationError, match="ack_deadline"):
        PubSubConfig(project="p", subscription="orders", ack_deadline=601)
    with pytest.raises(ValidationError, match="batch_size"):
        PubSubConfig(project="p", subscription="orders", batch_size=0)
    with pytest.raises(ValidationError, match="extra"):
        PubSubConfig(project="p", subscription="orders", queue="x")  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="subscription"):
        PubSubConfig(project="p", subscription="projects/q/subscriptions/orders")
    with pytest.raises(ValidationError, match="client option"):
        PubSubConfig(project="p", subscription="orders", client_options={"nope": 1})


def test_the_stream_key_is_project_subscription_and_endpoint() -> None:
    a = PubSubConfig(project="p", subscription="orders", emulator_host="h:1", batch_size=5)
    b = PubSubConfig(subscription="projects/p/subscriptions/orders", emulator_host="h:1")
    c = PubSubConfig(project="p", subscription="orders", emulator_host="h:2")
    assert a.stream_key() == b.stream_key() == ("pubsub", "p", a.subscription_path, "h:1")
    assert c.stream_key() != a.stream_key()
    d = PubSubConfig(project="p", subscription="orders", dead_letter="dlq")
    assert d.dead_letter_topic_path == "projects/p/topics/dlq"


async def test_a_clean_batch_is_acked_in_one_call(kit: PubSubKit, settings: dict[str, Any]) -> None:
    topic = await kit.create_topic()
    sub = await kit.create_subscription(topic, ack_deadline=10)
    ids = await kit.publish(topic, [f"m{i}" for i in range(20)], attributes={"a": "b"})
    config = PubSubConfig(subscription=sub, **settings)
    async with Open(config) as o:
        pairs = await o.take(20)
        message, delivery = pairs[0]
        assert isinstance(delivery, PubSubDelivery)
        assert message.attributes == {"a": "b"} and message.delivery_attempt is None
        assert sorted(m.pubsub_message_id for m, _ in pairs) == sorted(ids)
        calls = o.producer.api_calls
        await o.producer.advance([AdvanceItem(p, CLEAN) for _, p in pairs])
        await o.producer.flush()
        assert o.producer.api_calls - calls == 1  # one Acknowledge for the whole batch
        assert o.producer.counters()["acked"] == 20
    await asyncio.sleep(0.1)
    assert await pull_now(kit, sub) == []


async def test_identity_names_topic_message_id_and_publish_time(
    kit: PubSubKit, settings: dict[str, Any]
) -> None:
    topic = await kit.create_topic()
    sub = await kit.create_subscription(topic)
    [mid] = await kit.publish(topic, ["x"])
    async with Open(PubSubConfig(subscription=sub, **settings)) as o:
        [(message, delivery)] = await o.take(1)
        identity = o.producer.message_id(delivery)
        project, name = topic.split("/")[1], topic.split("/")[3]
        assert identity is not None
        assert identity.startswith(f"pubsub:{project}/{name}/{mid}@")
        assert identity.endswith("Z") and message.publish_time is not None
        assert message.message_id == identity  # what filters see is the identity
        assert message.broker_message_id == message.pubsub_message_id == mid
        await o.advance((delivery, CLEAN))


async def test_a_failed_message_keeps_its_lease_past_the_deadline_then_comes_again(
    kit: PubSubKit, settings: dict[str, Any]
) -> None:
    topic = await kit.create_topic()
    sub = await kit.create_subscription(topic, ack_deadline=1)
    await kit.publish(topic, ["slow"])
    config = PubSubConfig(subscription=sub, ack_deadline=2, **settings)
    async with Open(config) as o:
        [(message, delivery)] = await o.take(1)
        for _ in range(6):  # 3 s: three times the subscription's ack deadline
            await asyncio.sleep(0.5)
            assert await pull_now(kit, sub) == []
        assert o.producer.counters()["extended"] >= 2
        await o.advance((delivery, FAILED))
        [(again, delivery2)] = await o.take(1)
        assert again.message_id == message.message_id
        assert o.producer.counters()["redelivered"] == 1
        await o.advance((delivery2, CLEAN))


async def test_an_unclaimed_message_is_not_acked(kit: PubSubKit, settings: dict[str, Any]) -> None:
    topic = await kit.create_topic()
    sub = await kit.create_subscription(topic)
    await kit.publish(topic, ["nobody"])
    async with Open(PubSubConfig(subscription=sub, **settings)) as o:
        [(_, delivery)] = await o.take(1)
        await o.advance((delivery, UNCLAIMED))
        [(again, delivery2)] = await o.take(1)
        assert again.text() == "nobody"
        assert o.producer.counters()["acked"] == 0
        await o.advance((delivery2, CLEAN))


async def test_a_rejected_message_is_copied_to_the_dead_letter_topic_then_acked(
    kit: PubSubKit, settings: dict[str, Any]
) -> None:
    topic, dlq = await kit.create_topic(), await kit.create_topic("dlq")
    sub = await kit.create_subscription(topic)
    dlq_sub = await kit.create_subscription(dlq)
    [mid] = await kit.publish(topic, ["poison"], attributes={"origin": "app"})
    config = PubSubConfig(subscription=sub, dead_letter=dlq, **settings)
    async with Open(config) as o:
        [(_, delivery)] = await o.take(1)
        await o.advance((delivery, rejected("poison pill")))
        assert o.producer.counters()["dead_lettered"] == 1
    [copy] = await kit.drain(dlq_sub, expect=1)
    attributes = dict(copy.message.attributes)
    assert copy.message.data == b"poison"
    assert attributes["origin"] == "app"
    assert attributes["acklane.reject.reason"] == "poison pill"
    assert attributes["acklane.origin.message_id"] == mid
    assert attributes["acklane.origin.queue"] == sub
    assert attributes["acklane.origin.topic"] == topic
    assert attributes["acklane.origin.publish_time"].endswith("Z")
    assert await pull_now(kit, sub) == []


async def test_rejected_without_a_topic_is_nacked_for_the_dead_letter_policy(
    kit: PubSubKit, settings: dict[str, Any]
) -> None:
    topic, dead = await kit.create_topic(), await kit.create_topic("dead")
    dead_sub = await kit.create_subscription(dead)
    sub = await kit.create_subscription(topic, dead_letter_topic=dead, max_delivery_attempts=2)
    await kit.publish(topic, ["poison"])
    async with Open(PubSubConfig(subscription=sub, **settings)) as o:
        for attempt in (1, 2):
            [(message, delivery)] = await o.take(1)
            assert message.delivery_attempt == attempt
            await o.advance((delivery, rejected("poison pill")))
        [copy] = await kit.drain(dead_sub, expect=1)
        assert copy.message.attributes["CloudPubSubDeadLetterSourceDeliveryCount"] == "2"
        assert o.producer.counters()["dropped"] == 0


async def test_rejected_with_no_dead_letter_destination_is_acked_and_counted_dropped(
    kit: PubSubKit, settings: dict[str, Any]
) -> None:
    topic = await kit.create_topic()
    sub = await kit.create_subscription(topic)
    await kit.publish(topic, ["poison"])
    async with Open(PubSubConfig(subscription=sub, **settings)) as o:
        [(_, delivery)] = await o.take(1)
        await o.advance((delivery, rejected("poison pill")))
        assert o.producer.counters()["dropped"] == 1
    assert await pull_now(kit, sub) == []


async def test_an_ordering_key_waits_behind_its_failed_message(
    kit: PubSubKit, settings: dict[str, Any]
) -> None:
    topic = await kit.create_topic()
    sub = await kit.create_subscription(topic, ordering=True, ack_deadline=10)
    await kit.publish(topic, ["k1", "k2"], ordering_key="k")
    async with Open(PubSubConfig(subscription=sub, **settings)) as o:
        [(first, d1)] = await o.take(1)
        assert first.text() == "k1" and first.ordering_key == "k"
        assert o.producer.get_advance_lane(d1) == ("key", "k")
        await o.advance((d1, FAILED))
        [(again, d1b)] = await o.take(1)
        assert again.text() == "k1"  # never k2 before k1 is acked
        await o.advance((d1b, CLEAN))
        [(second, d2)] = await o.take(1)
        assert second.text() == "k2"
        await o.advance((d2, CLEAN))


async def test_messages_of_a_key_delivered_with_a_failed_one_are_not_acked_past_it(
    kit: PubSubKit, settings: dict[str, Any]
) -> None:
    """The service may deliver several messages of a key at once: none is acked past a failure.

    The emulator delivers one message of a key at a time on an ordered subscription, so
    this uses an unordered one and tells the producer to hold keys all the same.
    """
    topic = await kit.create_topic()
    sub = await kit.create_subscription(topic, ack_deadline=10)
    await kit.publish(topic, ["k1", "k2", "k3"], ordering_key="k")
    async with Open(PubSubConfig(subscription=sub, **settings)) as o:
        o.producer.pulls_ahead = 0  # as on an ordered subscription: no pull sent ahead
        pairs = await o.take(3)
        o.producer.ordered = True
        assert [m.text() for m, _ in pairs] == ["k1", "k2", "k3"]
        await o.advance((pairs[0][1], FAILED), (pairs[1][1], CLEAN))
        await o.advance((pairs[2][1], CLEAN))
        assert o.producer.counters()["held"] == 2
        assert o.producer.counters()["acked"] == 0
        again = await o.take(3)
        assert sorted(m.text() for m, _ in again) == ["k1", "k2", "k3"]
        await o.advance(*[(d, CLEAN) for _, d in again])  # pulled after the nack: acked
        assert o.producer.counters()["acked"] == 3


async def test_flow_control_bounds_what_is_outstanding(
    kit: PubSubKit, settings: dict[str, Any]
) -> None:
    topic = await kit.create_topic()
    sub = await kit.create_subscription(topic)
    await kit.publish(topic, [f"m{i}" for i in range(10)])
    config = PubSubConfig(subscription=sub, max_outstanding=4, batch_size=3, **settings)
    async with Open(config) as o:
        first = await o.take(4)
        pending = asyncio.ensure_future(anext(o.stream))
        await asyncio.sleep(0.5)
        assert not pending.done() and o.producer.outstanding == 4
        await o.advance((first[0][1], CLEAN))
        await asyncio.wait_for(pending, 10)
        assert o.producer.outstanding <= 4
        assert o.producer.counters()["paused"] >= 1


async def test_closing_releases_what_was_never_resolved_without_a_hold(
    kit: PubSubKit, settings: dict[str, Any]
) -> None:
    topic = await kit.create_topic()
    sub = await kit.create_subscription(topic, ack_deadline=60)
    await kit.publish(topic, ["a", "b"])
    config = PubSubConfig(subscription=sub, restart_lease_hold=0, **settings)
    async with Open(config) as o:
        await o.take(1)
    assert o.producer.counters()["parked"] == 0
    got = await kit.drain(sub, expect=2, within=5)  # at once, not after 60 s
    assert sorted(r.message.data for r in got) == [b"a", b"b"]


async def test_a_restart_takes_over_parked_leases_with_the_delivery_attempt_unchanged(
    kit: PubSubKit, settings: dict[str, Any]
) -> None:
    topic, dead = await kit.create_topic(), await kit.create_topic("dead")
    sub = await kit.create_subscription(
        topic, ack_deadline=10, dead_letter_topic=dead, max_delivery_attempts=5
    )
    await kit.publish(topic, ["a", "b"])
    config = PubSubConfig(subscription=sub, restart_lease_hold=30, **settings)
    async with Open(config) as first:
        [(message, delivery)] = await first.take(1)  # "b" was pulled, never handed out
        assert message.delivery_attempt == 1
    assert first.producer.counters()["parked"] == 1
    assert first.producer.counters()["redelivered"] == 1  # the one never handed out
    # Parked: still leased, so not delivered to anyone else meanwhile.
    stats = await kit.stats(sub)
    assert (stats["backlog"], stats["leased"]) == (2, 1)
    [other] = await kit.drain(sub, expect=2, within=3, ack=False)
    assert other.message.data != message.data
    async with Open(config) as second:
        [(again, taken)] = await second.take(1)  # first, before anything pulled
        assert second.producer.counters()["taken_over"] == 1
        assert (again.body, again.message_id) == (message.body, message.message_id)
        assert again.delivery_attempt == 1  # no redelivery: no attempt counted
        assert taken.ack_id == delivery.ack_id
        assert second.producer.message_id(taken) == first.producer.message_id(delivery)
        await second.advance((taken, CLEAN))
    stats = await kit.stats(sub)
    assert (stats["backlog"], stats["leased"]) == (1, 1)  # only the kit's lease of "b"


async def test_a_parked_lease_nobody_takes_comes_back_when_the_hold_ends(
    kit: PubSubKit, settings: dict[str, Any]
) -> None:
    from acklane.connectors.pubsub import _producer

    topic = await kit.create_topic()
    sub = await kit.create_subscription(topic, ack_deadline=10)
    await kit.publish(topic, ["a"])
    config = PubSubConfig(subscription=sub, restart_lease_hold=6, **settings)
    async with Open(config) as o:
        await o.take(1)
    assert o.producer.counters()["parked"] == 1
    _producer.PARKING.take(config.stream_key())  # the process is gone, say
    assert await kit.drain(sub, expect=1, within=2) == []
    [again] = await kit.drain(sub, expect=1, within=10)
    assert again.message.data == b"a"


async def test_a_missing_subscription_fails_the_stream(
    kit: PubSubKit, settings: dict[str, Any]
) -> None:
    config = PubSubConfig(subscription="no-such-subscription", **settings)
    async with Open(config) as o:
        with pytest.raises(Exception, match="does not exist"):
            await o.take(1)
