"""The SQS producer against a real SQS endpoint (moto locally, LocalStack under Docker).

The producer is driven directly: the test pulls from ``open_stream`` and hands
``advance`` the outcomes the engine would. Each test has its own queues.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from sqs_harness import open_stream

from acklane.connectors.sqs import (
    PACKED_ATTRIBUTES,
    SqsConfig,
    SqsConnectorError,
    SqsStreamProducer,
)
from acklane.core.producer import AdvanceItem, AdvanceOutcome
from acklane.integration.sqs import SqsQueues
from acklane.integration.testing import CLEAN, FAILED, UNCLAIMED, eventually, rejected


async def is_empty(queues: SqsQueues, url: str) -> bool:
    return await queues.counts(url) == (0, 0)


# ----------------------------------------------------------------- the raw event


async def test_raw_event_exposes_body_attributes_receive_count_and_message_id(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create()
    [message_id] = await queues.send(url, ['{"n": 1}'], attributes={"kind": "order"})
    async with open_stream(settings, queue_url=url) as stream:
        [(message, delivery)] = await stream.pull()
        assert message.broker_message_id == message.sqs_message_id == message_id
        # the identity filters see is the event store's: the queue's ARN, then the MessageId
        arn = await queues.arn(url)
        assert message.message_id == stream.producer.message_id(delivery) == f"{arn}/{message_id}"
        assert message.json() == {"n": 1}
        assert message.attributes == {"kind": "order"}
        assert message.delivery_attempt == message.receive_count == 1
        assert message.group_id is None
        assert message.publish_time is not None
        assert message.queue_url == url
        assert "SentTimestamp" in message.system_attributes


async def test_standard_queue_lane_is_the_message_itself(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create()
    await queues.send(url, ["a", "b"])
    async with open_stream(settings, queue_url=url) as stream:
        pulled = await stream.pull(2)
        lanes = {stream.producer.get_advance_lane(d) for _, d in pulled}
        assert lanes == {d.message_id for _, d in pulled}


async def test_queue_name_is_resolved_to_its_url(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create()
    await queues.send(url, ["a"])
    async with open_stream(settings, queue_name=url.rsplit("/", 1)[1]) as stream:
        [(message, _)] = await stream.pull()
        assert stream.producer.queue_url == url
        assert message.text() == "a"


async def test_unknown_queue_name_fails_naming_the_queue(settings: dict[str, Any]) -> None:
    async with open_stream(settings, queue_name="acklane-no-such-queue") as stream:
        with pytest.raises(SqsConnectorError, match="acklane-no-such-queue"):
            await stream.pull()


# ------------------------------------------------------------------------ advance


async def test_clean_batch_is_deleted_in_one_call(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create()
    await queues.send(url, [f"m{i}" for i in range(5)])
    async with open_stream(settings, queue_url=url) as stream:
        pulled = await stream.pull(5)
        await stream.advance(*((p, CLEAN) for p in pulled))
        await stream.settle()
        assert await is_empty(queues, url)
        assert stream.producer.deleted == 5
        assert stream.producer.api_calls["DeleteMessageBatch"] == 1


async def test_failed_item_is_redelivered_promptly_with_rising_receive_count(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(visibility_timeout=300)
    await queues.send(url, ["retry me"])
    async with open_stream(settings, queue_url=url) as stream:
        [first] = await stream.pull()
        await stream.advance((first, FAILED))
        # Back long before the queue's 300 s visibility timeout would have let it go.
        [(again, _)] = await stream.pull(timeout=20)
        assert again.message_id == first[0].message_id
        assert again.receive_count == 2


async def test_unclaimed_item_is_made_visible_again(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(visibility_timeout=300)
    await queues.send(url, ["nobody listened"])
    async with open_stream(settings, queue_url=url) as stream:
        [first] = await stream.pull()
        await stream.advance((first, UNCLAIMED))
        await stream.settle()
        assert await queues.counts(url) == (1, 0)


async def test_redelivery_backoff_keeps_a_failed_item_invisible_for_a_while(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(visibility_timeout=300)
    await queues.send(url, ["slow down"])
    async with open_stream(
        settings, queue_url=url, redelivery_backoff={"base": 2, "max": 2}
    ) as stream:
        [first] = await stream.pull()
        await stream.advance((first, FAILED))
        await stream.settle()
        assert await queues.counts(url) == (0, 1)  # invisible for the backoff
        [(again, _)] = await stream.pull(timeout=20)
        assert again.receive_count == 2


async def test_rejected_item_lands_in_the_configured_dead_letter_queue(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create()
    dlq = await queues.create("dlq")
    [message_id] = await queues.send(url, ["poison"], attributes={"kind": "order"})
    async with open_stream(settings, queue_url=url, dead_letter=dlq) as stream:
        [pulled] = await stream.pull()
        await stream.advance((pulled, rejected("schema: missing id", "not for us")))
        await stream.settle()
        assert await is_empty(queues, url)
        assert stream.producer.dead_lettered == 1
        counters = stream.producer.counters()  # what the metrics export
        assert (counters["dead_lettered"], counters["dropped"]) == (1, 0)
        assert counters["api_calls"] == stream.producer.total_api_calls > 0
    [copy] = await queues.receive(dlq)
    attributes = {k: v["StringValue"] for k, v in copy["MessageAttributes"].items()}
    assert copy["Body"] == "poison"
    assert attributes == {
        "kind": "order",
        "acklane.origin.queue": url,
        "acklane.origin.message_id": message_id,
        "acklane.reject.reason": "schema: missing id; not for us",
    }


async def test_rejected_item_lands_in_the_redrive_policy_target_when_none_is_configured(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    dlq = await queues.create("redrive-dlq")
    url = await queues.create(dead_letter_arn=await queues.arn(dlq), max_receive_count=5)
    [message_id] = await queues.send(url, ["poison"])
    async with open_stream(settings, queue_url=url) as stream:
        [pulled] = await stream.pull()
        assert stream.producer.dead_letter_queue_url == dlq
        await stream.advance((pulled, rejected()))
        await stream.settle()
        assert await is_empty(queues, url)
    [copy] = await queues.receive(dlq)
    attributes = {k: v["StringValue"] for k, v in copy["MessageAttributes"].items()}
    assert attributes["acklane.origin.queue"] == url
    assert attributes["acklane.origin.message_id"] == message_id
    assert attributes["acklane.reject.reason"] == "rejected by 1 watcher"


async def test_dead_letter_copy_packs_original_attributes_beyond_sqs_limit(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create()
    dlq = await queues.create("dlq")
    many = {f"a{i}": str(i) for i in range(9)}
    await queues.send(url, ["poison"], attributes=many)
    async with open_stream(settings, queue_url=url, dead_letter=dlq) as stream:
        [pulled] = await stream.pull()
        await stream.advance((pulled, rejected("bad")))
        await stream.settle()
    [copy] = await queues.receive(dlq)
    packed = json.loads(copy["MessageAttributes"][PACKED_ATTRIBUTES]["StringValue"])
    assert {k: v["StringValue"] for k, v in packed.items()} == many
    assert copy["MessageAttributes"]["acklane.reject.reason"]["StringValue"] == "bad"


async def test_rejected_item_without_any_dead_letter_queue_is_dropped_with_a_warning(
    settings: dict[str, Any], queues: SqsQueues, caplog: pytest.LogCaptureFixture
) -> None:
    url = await queues.create()
    await queues.send(url, ["poison"])
    with caplog.at_level(logging.WARNING, logger="acklane.connectors.sqs"):
        async with open_stream(settings, queue_url=url) as stream:
            [pulled] = await stream.pull()
            assert "rejected messages will be deleted and counted as dropped" in caplog.text
            await stream.advance((pulled, rejected("bad")))
            await stream.settle()
            assert stream.producer.dropped == 1
            assert await is_empty(queues, url)


async def test_failure_wins_over_reject_in_the_same_outcome(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(visibility_timeout=300)
    dlq = await queues.create("dlq")
    await queues.send(url, ["half rejected"])
    async with open_stream(settings, queue_url=url, dead_letter=dlq) as stream:
        [pulled] = await stream.pull()
        await stream.advance((pulled, AdvanceOutcome(acked=0, failed=1, rejected=1)))
        await stream.settle()
        assert await queues.counts(url) == (1, 0)  # redelivered, not dead-lettered
        assert await queues.counts(dlq) == (0, 0)


async def test_vanished_receipt_handle_is_logged_not_fatal(
    settings: dict[str, Any], queues: SqsQueues, caplog: pytest.LogCaptureFixture
) -> None:
    url = await queues.create()
    await queues.send(url, ["gone"])
    async with open_stream(settings, queue_url=url) as stream:
        [pulled] = await stream.pull()
        await queues.client.purge_queue(QueueUrl=url)
        with caplog.at_level(logging.WARNING, logger="acklane.connectors.sqs"):
            await stream.advance((pulled, CLEAN))
            await stream.settle()
        assert "receipt handle no longer valid" in caplog.text
        await queues.send(url, ["next"])
        await stream.advance(*((p, CLEAN) for p in await stream.pull()))  # still working


async def test_aclose_makes_unadvanced_messages_visible_at_once_without_a_lease_hold(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(visibility_timeout=300)
    await queues.send(url, ["abandoned"])
    async with open_stream(settings, queue_url=url, restart_lease_hold=0) as stream:
        await stream.pull()
    assert await queues.counts(url) == (1, 0)
    assert stream.producer.parked == 0


async def test_aclose_releases_received_messages_never_handed_out_even_with_a_lease_hold(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(visibility_timeout=300)
    await queues.send(url, ["a", "b", "c"])
    async with open_stream(settings, queue_url=url, restart_lease_hold=60) as stream:
        await stream.pull()  # the engine saw one; two were still in the producer's hands
        assert stream.producer.outstanding == 3  # one receive returned all three
    assert stream.producer.parked == 1
    assert await queues.counts(url) == (2, 1)


# ---------------------------------------------------------------------- heartbeat


async def test_heartbeat_keeps_a_slow_message_invisible_past_the_visibility_timeout(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(visibility_timeout=2)
    await queues.send(url, ["slow"])
    async with open_stream(settings, queue_url=url) as stream:
        [pulled] = await stream.pull()
        for _ in range(10):  # 5 s: two and a half visibility timeouts
            await asyncio.sleep(0.5)
            assert await queues.counts(url) == (0, 1)
        assert stream.producer.extended >= 2
        await stream.advance((pulled, FAILED))  # e.g. the engine's ack timeout
        await stream.settle()
        assert await queues.counts(url) == (1, 0)


async def test_heartbeat_never_extends_past_the_visibility_cap(
    settings: dict[str, Any], queues: SqsQueues, caplog: pytest.LogCaptureFixture
) -> None:
    url = await queues.create(visibility_timeout=2)
    await queues.send(url, ["held too long"])
    async with open_stream(settings, queue_url=url) as stream:
        stream.producer.max_visibility = 4  # stands in for SQS's 12 hours
        [pulled] = await stream.pull()
        with caplog.at_level(logging.WARNING, logger="acklane.connectors.sqs"):
            await eventually(lambda: _visible(queues, url), "visible again at the cap")
        assert "visibility cap" in caplog.text
        assert pulled[1].extension_stopped


async def _visible(queues: SqsQueues, url: str) -> bool:
    visible, _ = await queues.counts(url)
    return visible == 1


# --------------------------------------------------------------------------- FIFO


async def test_fifo_lanes_keep_order_per_group_and_a_held_group_does_not_block_others(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(fifo=True)
    await queues.send(url, ["a1", "a2"], group_id="A")
    await queues.send(url, ["b1", "b2", "b3"], group_id="B")
    async with open_stream(settings, queue_url=url, batch_size=1) as stream:
        lane = stream.producer.get_advance_lane
        [a1] = await stream.pull()
        assert (a1[0].text(), lane(a1[1])) == ("a1", "A")
        # a1 is held (not advanced): group B still flows, in order.
        seen_b = []
        for _ in range(3):
            [b] = await stream.pull()
            assert lane(b[1]) == "B"
            seen_b.append(b[0].text())
            await stream.advance((b, CLEAN))
            await stream.settle()
        assert seen_b == ["b1", "b2", "b3"]
        await stream.advance((a1, CLEAN))
        [a2] = await stream.pull()
        assert a2[0].text() == "a2"


async def test_fifo_failed_message_is_redelivered_before_its_group_successors(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(fifo=True, visibility_timeout=300)
    await queues.send(url, ["a1", "a2", "a3"], group_id="A")
    async with open_stream(settings, queue_url=url) as stream:
        a1, a2, a3 = await stream.pull(3)
        await stream.advance((a1, FAILED), (a2, CLEAN), (a3, CLEAN))
        again = await stream.pull(3, timeout=20)
        assert [m.text() for m, _ in again] == ["a1", "a2", "a3"]
        assert [m.receive_count for m, _ in again] == [2, 2, 2]


async def test_fifo_rejected_item_keeps_its_group_in_a_fifo_dead_letter_queue(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(fifo=True)
    dlq = await queues.create("dlq", fifo=True)
    await queues.send(url, ["poison"], group_id="G")
    async with open_stream(settings, queue_url=url, dead_letter=dlq) as stream:
        [pulled] = await stream.pull()
        await stream.advance((pulled, rejected("bad")))
        await stream.settle()
        assert await is_empty(queues, url)
    [copy] = await queues.receive(dlq)
    assert copy["Attributes"]["MessageGroupId"] == "G"
    assert copy["MessageAttributes"]["acklane.reject.reason"]["StringValue"] == "bad"


# -- regressions found in review ---------------------------------------------------


async def test_a_refused_heartbeat_fails_the_group_instead_of_letting_leases_lapse(
    settings: dict[str, Any],
) -> None:
    from botocore.exceptions import ClientError

    async with SqsQueues(settings) as q:
        url = await q.create(visibility_timeout=2)
        await q.send(url, ["x"])
        p = SqsStreamProducer(SqsConfig(**{**settings, "queue_url": url, "wait_time_seconds": 1}))
        stream = p.open_stream()
        try:
            await anext(stream)
            assert p._client is not None

            async def denied(**_: Any) -> Any:
                raise ClientError(
                    {"Error": {"Code": "AccessDenied", "Message": "no"}},
                    "ChangeMessageVisibilityBatch",
                )

            p._client.change_message_visibility_batch = denied
            async with asyncio.timeout(10):
                while p._tasks.failure is None:
                    await asyncio.sleep(0.1)
            with pytest.raises(ClientError):
                await anext(stream)  # the stream raises it: the group fails loudly
        finally:
            await stream.aclose()
            await p.aclose()


async def test_the_heartbeat_outlives_the_stream_until_aclose(settings: dict[str, Any]) -> None:
    # after a stop the poll ends but watchers may still be working: leases must hold
    async with SqsQueues(settings) as q:
        url = await q.create(visibility_timeout=2)
        await q.send(url, ["x"])
        p = SqsStreamProducer(SqsConfig(**{**settings, "queue_url": url, "wait_time_seconds": 1}))
        stream = p.open_stream()
        _, delivery = await anext(stream)
        await stream.aclose()
        await asyncio.sleep(3.5)  # past the visibility timeout
        assert await q.receive(url) == []
        await p.advance([AdvanceItem(delivery, AdvanceOutcome(1, 0))])
        await p.aclose()


async def test_aclose_lets_an_in_flight_delete_finish(settings: dict[str, Any]) -> None:
    async with SqsQueues(settings) as q:
        url = await q.create(visibility_timeout=2)
        await q.send(url, ["x"])
        p = SqsStreamProducer(
            SqsConfig(**{**settings, "queue_url": url, "wait_time_seconds": 1, "advance_linger": 0})
        )
        stream = p.open_stream()
        _, delivery = await anext(stream)
        original = p._run_batch

        async def slow(op: str, url_: str, entries: Any) -> Any:
            if op == "delete_message_batch":
                await asyncio.sleep(0.5)
            return await original(op, url_, entries)

        p._run_batch = slow  # type: ignore[method-assign]
        await p.advance([AdvanceItem(delivery, AdvanceOutcome(1, 0))])
        await asyncio.sleep(0.1)  # the flusher is inside DeleteMessageBatch now
        await stream.aclose()
        await p.aclose()
        await asyncio.sleep(2.5)
        assert await q.receive(url) == []  # deleted, not dropped and redelivered
