"""What happens to SQS leases when a producer closes: restarts, stops, cut-off receives.

A producer that closes with messages the engine never resolved keeps their lease
for ``restart_lease_hold`` seconds, and the next producer of the queue in this
process takes them over without receiving them again, so a restart does not raise
their receive count (which would walk them towards the queue's own redrive to the
dead-letter queue). Messages the engine advanced as failed are released as before.
A receive in flight when the poll stops is finished and what it got released.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import aioboto3
import pytest
from sqs_harness import Stream, open_stream

from acklane.connectors.sqs import SqsConfig, SqsConnectorError, SqsStreamProducer
from acklane.core.producer import AdvanceItem
from acklane.integration.sqs import SqsQueues
from acklane.integration.testing import CLEAN, FAILED, eventually


async def receive_counts(queues: SqsQueues, url: str) -> dict[str, int]:
    """Receive everything visible directly; ``{body: ApproximateReceiveCount}``."""
    messages = await queues.receive(url, visibility_timeout=300)
    return {m["Body"]: int(m["Attributes"]["ApproximateReceiveCount"]) for m in messages}


def our_tasks() -> list[str]:
    return [
        t.get_name()
        for t in asyncio.all_tasks()
        if t.get_name().startswith("acklane sqs") and not t.done()
    ]


# ------------------------------------------------------------------ restart policy


async def test_a_new_producer_takes_over_unresolved_messages_without_a_new_receive(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(visibility_timeout=300)
    ids = await queues.send(url, ["a", "b", "c"])
    async with open_stream(settings, queue_url=url) as first:
        pulled = await first.pull(3)
        # the group fails here: nothing was resolved, the producer closes
    assert first.producer.parked == 3
    assert await queues.counts(url) == (0, 3)  # still ours, not back on the queue

    async with open_stream(settings, queue_url=url) as second:
        again = await second.pull(3)
        assert [m.sqs_message_id for m, _ in again] == ids == [m.sqs_message_id for m, _ in pulled]
        assert [m.receive_count for m, _ in again] == [1, 1, 1]  # unchanged
        assert second.producer.taken_over == 3
        assert second.producer.api_calls["ReceiveMessage"] == 0  # yielded before receiving
        assert second.producer.counters()["taken_over"] == 3
        await second.advance(*((p, FAILED) for p in again))
        await second.producer.flush()
    # Received once by acklane across the restart, once more here.
    assert await receive_counts(queues, url) == {"a": 2, "b": 2, "c": 2}


async def test_a_taken_over_message_keeps_its_heartbeat(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(visibility_timeout=2)
    await queues.send(url, ["slow"])
    async with open_stream(settings, queue_url=url) as first:
        await first.pull()
    async with open_stream(settings, queue_url=url) as second:
        [pulled] = await second.pull()
        for _ in range(8):  # 4 s: twice the visibility timeout
            await asyncio.sleep(0.5)
            assert await queues.counts(url) == (0, 1)
        assert second.producer.extended >= 1
        await second.advance((pulled, CLEAN))
        await second.producer.flush()
    assert await queues.counts(url) == (0, 0)


async def test_messages_advanced_as_failed_are_released_not_parked(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(visibility_timeout=300)
    await queues.send(url, ["failed", "abandoned"])
    async with open_stream(settings, queue_url=url) as first:
        failed, _abandoned = await first.pull(2)
        await first.advance((failed, FAILED))
    assert first.producer.parked == 1
    assert await queues.counts(url) == (1, 1)
    assert await receive_counts(queues, url) == {"failed": 2}


async def test_restart_lease_hold_zero_releases_at_once(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(visibility_timeout=300)
    await queues.send(url, ["abandoned"])
    async with open_stream(settings, queue_url=url, restart_lease_hold=0) as first:
        await first.pull()
    assert first.producer.parked == 0
    assert await receive_counts(queues, url) == {"abandoned": 2}


async def test_a_parked_lease_whose_hold_ran_out_is_left_to_sqs(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(visibility_timeout=300)
    await queues.send(url, ["late"])
    async with open_stream(settings, queue_url=url, restart_lease_hold=2) as first:
        first.producer.takeover_margin = 0.5
        await first.pull()
    assert first.producer.parked == 1
    await asyncio.sleep(2.5)  # the restart took longer than the hold
    async with open_stream(settings, queue_url=url) as second:
        second.producer.takeover_margin = 0.5
        [(message, _)] = await second.pull()
        assert second.producer.taken_over == 0
        assert message.receive_count == 2  # SQS delivered it again


async def test_a_producer_already_running_takes_over_what_a_closing_one_parks(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    # The engine makes a fresh group at once after a failure: the new producer may
    # start before the old one has closed.
    url = await queues.create(visibility_timeout=300)
    await queues.send(url, ["x"])
    first = Stream(SqsStreamProducer(SqsConfig(**settings, queue_url=url, wait_time_seconds=1)))
    await first.pull()
    async with open_stream(settings, queue_url=url) as second:
        pending = asyncio.ensure_future(second.pull())
        await asyncio.sleep(0.3)  # the second producer is in its first receive
        await first.close()
        [(message, _)] = await asyncio.wait_for(pending, 10)
        assert (message.text(), message.receive_count) == ("x", 1)
        assert second.producer.taken_over == 1


async def test_closing_with_parked_messages_leaves_no_task_behind(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(visibility_timeout=300)
    await queues.send(url, ["x"])
    async with open_stream(settings, queue_url=url) as first:
        await first.pull()
        assert our_tasks()
    assert first.producer.parked == 1
    assert our_tasks() == []  # the hold is the visibility timeout, nothing runs it


async def test_fifo_parked_messages_come_first_and_in_order(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(fifo=True, visibility_timeout=300)
    await queues.send(url, ["a1", "a2", "a3"], group_id="A")
    await queues.send(url, ["b1"], group_id="B")
    async with open_stream(settings, queue_url=url) as first:
        pulled = await first.pull(4)
        order = [m.text() for m, _ in pulled]
        await first.advance((pulled[order.index("b1")], CLEAN))
    assert first.producer.parked == 3
    await queues.send(url, ["a4"], group_id="A")
    await queues.send(url, ["c1"], group_id="C")
    async with open_stream(settings, queue_url=url) as second:
        parked = await second.pull(3)
        assert [m.text() for m, _ in parked] == ["a1", "a2", "a3"]
        assert [m.receive_count for m, _ in parked] == [1, 1, 1]
        # group A is still ours: SQS gives C, and a4 only once A's head is done
        [(c1, _)] = await second.pull()
        assert c1.text() == "c1"
        await second.advance(*((p, CLEAN) for p in parked))
        [(a4, _)] = await second.pull(timeout=20)
        assert a4.text() == "a4"


async def test_fifo_messages_held_back_behind_a_failure_are_released_not_parked(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(fifo=True, visibility_timeout=300)
    await queues.send(url, ["a1", "a2", "a3"], group_id="A")
    async with open_stream(settings, queue_url=url) as first:
        a1, _a2, _a3 = await first.pull(3)
        await first.advance((a1, FAILED))
    # a1 comes back, so a2 and a3 must come back after it rather than be taken over
    assert first.producer.parked == 0
    async with open_stream(settings, queue_url=url) as second:
        again = await second.pull(3, timeout=20)
        assert [m.text() for m, _ in again] == ["a1", "a2", "a3"]
        assert [m.receive_count for m, _ in again] == [2, 2, 2]


# ------------------------------------------------------------ cut-off receives


async def test_a_receive_cut_off_by_a_stop_makes_what_sqs_handed_out_visible_at_once(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(visibility_timeout=300)
    producer = SqsStreamProducer(SqsConfig(**settings, queue_url=url, wait_time_seconds=2))
    stream = producer.open_stream()
    poll = asyncio.ensure_future(anext(stream))  # the engine's poll task
    await eventually(lambda: producer._client is not None, "the producer started")
    real = producer._client.receive_message
    called, served = asyncio.Event(), asyncio.Event()

    async def answer_in_transit(**request: Any) -> Any:
        called.set()
        response = await real(**request)
        if response.get("Messages"):
            served.set()  # SQS handed it out; its answer is still on the way
            await asyncio.sleep(1.0)
        return response

    producer._client.receive_message = answer_in_transit
    await asyncio.wait_for(called.wait(), 5)  # a receive in flight on an empty queue
    await queues.send(url, ["in transit"])
    await asyncio.wait_for(served.wait(), 10)
    poll.cancel()  # the stream is closed mid-receive
    with pytest.raises(asyncio.CancelledError):
        await poll
    await stream.aclose()
    started = time.monotonic()
    await producer.aclose()
    assert time.monotonic() - started < 2 + 5  # bounded by the receive's wait
    # visible again now, not after the queue's 300 s visibility timeout
    assert await queues.counts(url) == (1, 0)
    assert await receive_counts(queues, url) == {"in transit": 2}
    assert producer.parked == 0  # never handed to the engine: released, not kept


async def test_a_message_arriving_after_the_stop_in_a_pending_long_poll_comes_back(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(visibility_timeout=300)
    producer = SqsStreamProducer(SqsConfig(**settings, queue_url=url, wait_time_seconds=3))
    stream = producer.open_stream()
    poll = asyncio.ensure_future(anext(stream))
    await eventually(lambda: producer.api_calls["ReceiveMessage"] >= 1, "a receive in flight")
    poll.cancel()
    with pytest.raises(asyncio.CancelledError):
        await poll
    await queues.send(url, ["late"])  # SQS hands it to the receive still pending
    await stream.aclose()
    await producer.aclose()
    assert await queues.counts(url) == (1, 0)


async def test_a_stop_with_no_receive_in_flight_does_not_wait(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(visibility_timeout=300)
    await queues.send(url, ["x"])
    producer = SqsStreamProducer(SqsConfig(**settings, queue_url=url, wait_time_seconds=20))
    stream = producer.open_stream()
    _, delivery = await anext(stream)
    await producer.advance([AdvanceItem(delivery, CLEAN)])
    await stream.aclose()  # suspended at a yield: no receive was started
    started = time.monotonic()
    await producer.aclose()
    assert time.monotonic() - started < 5
    assert await queues.counts(url) == (0, 0)


# ------------------------------------------------------------ receives sent ahead


async def test_a_full_batch_sends_the_next_receive_before_the_engine_takes_it(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(visibility_timeout=300)
    await queues.send(url, [f"m{i}" for i in range(15)])
    producer = SqsStreamProducer(
        SqsConfig(**settings, queue_url=url, wait_time_seconds=1, batch_size=5)
    )
    stream = producer.open_stream()
    first, _ = await anext(stream)  # four more of its batch wait to be taken
    await eventually(lambda: producer.outstanding == 10, "the receive sent ahead answered")
    assert producer.api_calls["ReceiveMessage"] == 2
    bodies = [first.body]
    async for message, delivery in stream:
        bodies.append(message.body)
        await producer.advance([AdvanceItem(delivery, CLEAN)])
        if len(bodies) == 15:
            break
    assert sorted(bodies) == sorted(f"m{i}".encode() for i in range(15))  # none twice
    await stream.aclose()
    await producer.aclose()


async def test_what_a_receive_sent_ahead_got_is_released_when_the_stream_closes(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(visibility_timeout=300)
    await queues.send(url, [f"m{i}" for i in range(6)])
    producer = SqsStreamProducer(
        SqsConfig(**settings, queue_url=url, wait_time_seconds=1, batch_size=3)
    )
    stream = producer.open_stream()
    taken = []
    for _ in range(3):  # the whole first batch: the engine resolves it
        _, delivery = await anext(stream)
        taken.append(AdvanceItem(delivery, CLEAN))
    await producer.advance(taken)
    await eventually(lambda: producer.outstanding == 3, "the receive sent ahead answered")
    await stream.aclose()  # suspended at a yield, the next batch never handed out
    await producer.aclose()
    assert producer.parked == 0  # never handed to the engine: released, not kept
    assert await queues.counts(url) == (3, 0)  # visible now, not after 300 s


async def test_a_producer_closed_before_its_stream_releases_what_was_received_ahead(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(visibility_timeout=300)
    await queues.send(url, [f"m{i}" for i in range(4)])
    producer = SqsStreamProducer(
        SqsConfig(**settings, queue_url=url, wait_time_seconds=1, batch_size=2)
    )
    stream = producer.open_stream()
    items = [AdvanceItem((await anext(stream))[1], CLEAN) for _ in range(2)]
    await producer.advance(items)
    await eventually(lambda: producer.outstanding == 2, "the receive sent ahead answered")
    await producer.aclose()  # before the stream: its receive ahead is settled here
    await stream.aclose()  # and not a second time here
    assert producer.parked == 0
    assert producer.released == 2
    assert await queues.counts(url) == (2, 0)


async def test_a_fifo_queue_never_receives_ahead(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(fifo=True, visibility_timeout=300)
    for group in ("a", "b"):
        await queues.send(url, [f"{group}{i}" for i in range(3)], group_id=group)
    producer = SqsStreamProducer(
        SqsConfig(**settings, queue_url=url, wait_time_seconds=1, batch_size=3)
    )
    stream = producer.open_stream()
    await anext(stream)  # a full batch of group a (group b waits behind it)
    assert producer._ahead is None  # a standard queue's would be sent by now
    assert producer.api_calls["ReceiveMessage"] == 1
    await stream.aclose()
    await producer.aclose()


# ------------------------------------------------------ FIFO receive attempt ids


class RecordedReceives:
    """A session whose clients record every ReceiveMessage request; one may be made to fail."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.session = aioboto3.Session(
            aws_access_key_id=settings["aws_access_key_id"],
            aws_secret_access_key=settings["aws_secret_access_key"],
            region_name=settings["region"],
        )
        self.requests: list[dict[str, Any]] = []
        self.fail_next = False
        self.session.events.register(
            "before-parameter-build.sqs.ReceiveMessage", self._before_receive
        )

    def _before_receive(self, params: dict[str, Any], **_: Any) -> None:
        self.requests.append(dict(params))
        if self.fail_next:
            self.fail_next = False
            raise ConnectionResetError("the answer was lost")

    def attempt_ids(self) -> list[str | None]:
        return [r.get("ReceiveRequestAttemptId") for r in self.requests]


async def test_fifo_receives_carry_an_attempt_id_and_a_failed_one_is_retried_with_it(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(fifo=True, visibility_timeout=300)
    recorded = RecordedReceives(settings)
    recorded.fail_next = True
    async with open_stream(settings, queue_url=url, session=recorded.session) as first:
        with pytest.raises(SqsConnectorError) as failed:
            await first.pull()  # the group fails; the runner makes a new producer
        assert isinstance(failed.value.__cause__, ConnectionResetError)  # the cause, kept
    [lost] = recorded.attempt_ids()
    assert lost

    await queues.send(url, ["m1"], group_id="G")
    async with open_stream(settings, queue_url=url, session=recorded.session) as second:
        [(message, _)] = await second.pull()
        assert message.text() == "m1"
        following = asyncio.ensure_future(second.pull())
        await eventually(lambda: len(recorded.requests) >= 3, "a receive after the answer")
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
    ids = recorded.attempt_ids()
    assert ids[1] == lost  # the retry gets the batch SQS may have handed out
    assert ids[2] is not None and ids[2] != lost  # answered: the next is a new attempt


async def test_standard_queue_receives_carry_no_attempt_id(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create()
    await queues.send(url, ["m"])
    recorded = RecordedReceives(settings)
    async with open_stream(settings, queue_url=url, session=recorded.session) as stream:
        await stream.pull()
    assert recorded.attempt_ids()[0] is None
