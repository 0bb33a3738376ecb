"""SQS through the engine: watchers sharing one poll, ack timeout, reject, FIFO lanes.

The test plays the event store: every trigger event a watcher yields is bound
and confirmed persisted at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, ClassVar

import pytest

from acklane.connectors.sqs import SqsMessage, SqsMessageTrigger, SqsStreamProducer
from acklane.core.trigger import AckTimeout, TriggerEvent, reject_shared_stream_event
from acklane.integration.sqs import SqsQueues
from acklane.integration.testing import eventually, run_engine


class Watcher(SqsMessageTrigger):
    """Yields one event per message; remembers the producers the engine made."""

    producers: ClassVar[list[SqsStreamProducer]] = []

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SqsStreamProducer:
        producer = super().create_shared_stream_producer(kwargs)
        Watcher.producers.append(producer)
        return producer


class SlowOn(Watcher):
    """Works ``work_seconds`` on messages whose body is ``slow_body`` before moving on."""

    slow_body: str
    work_seconds: float

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for message in stream:
            if message.text() == self.slow_body:
                await asyncio.sleep(self.work_seconds)
            yield TriggerEvent(self.event_payload(message))


class Rejecting(Watcher):
    """Rejects messages whose body is ``poison``, with a reason."""

    def accepts(self, message: SqsMessage) -> bool:
        if message.text() == "poison":
            reject_shared_stream_event("poison pill")
            return False
        return True


@pytest.fixture
def settings(settings: dict[str, Any]) -> dict[str, Any]:
    return {**settings, "wait_time_seconds": 1}


@pytest.fixture(autouse=True)
def _fresh_producer_log() -> None:
    Watcher.producers.clear()


def in_group(group_id: str) -> Callable[[str, Mapping[str, Any]], bool]:
    """Hold back the events of this FIFO group (``EngineDriver.hold``)."""
    return lambda _trigger_id, payload: payload["group_id"] == group_id


async def test_watchers_of_one_queue_share_one_poll_and_clean_messages_are_deleted(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create()
    bodies = [f"m{i}" for i in range(30)]
    await queues.send(url, bodies)
    async with run_engine() as e:
        e.watch("a", Watcher(queue_url=url, **settings))
        e.watch("b", Watcher(queue_url=url, **settings))
        await eventually(lambda: len(e.seen["a"]) == len(e.seen["b"]) == 30, "both saw all")
        producer = Watcher.producers[0]
        await eventually(lambda: producer.deleted == 30, "all deleted")
    assert len(Watcher.producers) == 1
    assert sorted(e.bodies("a")) == sorted(e.bodies("b")) == sorted(bodies)
    assert await queues.counts(url) == (0, 0)
    assert producer.api_calls["DeleteMessageBatch"] <= 6  # batched across one-message lanes


async def test_heartbeat_outlasts_visibility_and_ack_timeout_then_redelivers(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(visibility_timeout=2)
    await queues.send(url, ["slow"])
    async with run_engine(ack_timeout=4.0) as e:
        e.watch("fast", Watcher(queue_url=url, **settings))
        e.watch("slow", SlowOn(queue_url=url, slow_body="slow", work_seconds=5.0, **settings))
        await eventually(lambda: len(e.seen["fast"]) == 1, "fast watcher saw it")
        # Past the queue's 2 s visibility timeout the message is still ours...
        for _ in range(5):
            await asyncio.sleep(0.5)
            assert await queues.counts(url) == (0, 1)
        # ...until the ack timeout fails the slow watcher: released, redelivered, deleted.
        await eventually(lambda: len(e.seen["fast"]) == 2, "redelivered to the fast watcher")
        assert [p["receive_count"] for p in e.seen["fast"]] == [1, 2]
        await eventually(lambda: isinstance(e.errors.get("slow"), AckTimeout), "slow timed out")
        await eventually(lambda: Watcher.producers[0].deleted == 1, "deleted after redelivery")
    assert await queues.counts(url) == (0, 0)


async def test_rejected_message_reaches_the_dead_letter_queue_with_the_watchers_reason(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create()
    dlq = await queues.create("dlq")
    [poison_id] = await queues.send(url, ["poison"])
    await queues.send(url, ["fine"])
    async with run_engine() as e:
        e.watch("w", Rejecting(queue_url=url, dead_letter=dlq, **settings))
        await eventually(lambda: e.bodies("w") == ["fine"], "the fine one fired")
        await eventually(lambda: Watcher.producers[0].dead_lettered == 1, "dead-lettered")
    [copy] = await queues.receive(dlq)
    attributes = {k: v["StringValue"] for k, v in copy["MessageAttributes"].items()}
    assert attributes["acklane.reject.reason"] == "poison pill"
    assert attributes["acklane.origin.message_id"] == poison_id
    assert await queues.counts(url) == (0, 0)


async def test_fifo_group_held_unresolved_does_not_block_other_groups(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(fifo=True)
    await queues.send(url, ["h1", "h2"], group_id="held")
    await queues.send(url, [f"f{i}" for i in range(3)], group_id="free")
    async with run_engine() as e:
        e.hold = in_group("held")
        e.watch("w", Watcher(queue_url=url, batch_size=1, **settings))
        # h1 stays unresolved (its trigger event not yet persisted): SQS holds back h2,
        # while the other group's lane advances and SQS keeps delivering it.
        await eventually(lambda: e.bodies("w") == ["h1", "f0", "f1", "f2"], "free flowed")
        e.release_held()
        await eventually(lambda: e.bodies("w")[4:] == ["h2"], "held group resumed")
        await eventually(lambda: Watcher.producers[0].deleted == 5, "all deleted")


async def test_a_restarted_group_takes_over_its_unresolved_messages_without_receiving_again(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    # A broken watcher fails the group while h1 and h2 are unresolved (their events
    # not yet stored). The restarted group gets them back with their receive count
    # unchanged, so restarts do not walk them towards the queue's redrive policy.
    url = await queues.create(fifo=True, visibility_timeout=300)
    await queues.send(url, ["h1", "h2"], group_id="held")
    async with run_engine() as e:
        e.hold = in_group("held")
        first = Watcher(queue_url=url, **settings)
        key = first.shared_stream_key()
        e.watch("w", first)
        await eventually(lambda: e.bodies("w") == ["h1", "h2"], "both fired, unresolved")
        e.manager.fail_group(key, RuntimeError("a broken watcher"))
        await eventually(lambda: isinstance(e.errors.get("w"), RuntimeError), "the group failed")
        await e.manager.wait_key_closed(key)  # as the runner does before a restart
        assert Watcher.producers[0].parked == 2
        assert await queues.counts(url) == (0, 2)

        e.hold = None
        e.watch("w2", Watcher(queue_url=url, **settings))
        await eventually(lambda: e.bodies("w2") == ["h1", "h2"], "taken over, in order")
        assert [p["receive_count"] for p in e.seen["w2"]] == [1, 1]
        assert Watcher.producers[1].taken_over == 2
        await eventually(lambda: Watcher.producers[1].deleted == 2, "both deleted")
    assert await queues.counts(url) == (0, 0)
