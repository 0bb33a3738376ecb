"""Dead-letter copies that might not fit: a bounded reason, a start-time check, a clear refusal.

SQS limits a message's size (body and attributes) per queue (``MaximumMessageSize``).
A dead-letter copy carries the original plus acklane's origin and reason
attributes; the reason is bounded, the producer compares the two queues' limits at
start, and a copy the dead-letter queue cannot take is refused loudly: counted,
logged with the message, its size, the limit and the setting to change, the group
fails, and the original is never deleted.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from sqs_harness import open_stream

from acklane.connectors.sqs import SqsAdvanceError
from acklane.core.connectors.deadletter import REASON_MAX_BYTES, TRUNCATED_MARK
from acklane.integration.sqs import SqsQueues
from acklane.integration.testing import CLEAN, rejected

SMALLEST = {"MaximumMessageSize": "1024"}  # SQS's lowest allowed limit


def reason_of(copy: dict[str, Any]) -> str:
    return str(copy["MessageAttributes"]["acklane.reject.reason"]["StringValue"])


def copy_size(copy: dict[str, Any]) -> int:
    size = len(copy["Body"].encode("utf-8"))
    for name, value in copy["MessageAttributes"].items():
        size += len(name.encode("utf-8")) + len(value["DataType"])
        size += len(value.get("StringValue", "").encode("utf-8"))
    return size


async def test_the_reason_a_copy_carries_is_bounded(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create()
    dlq = await queues.create("dlq")
    await queues.send(url, ["poison"])
    async with open_stream(settings, queue_url=url, dead_letter=dlq) as stream:
        [pulled] = await stream.pull()
        await stream.advance((pulled, rejected("x" * 5000, "y" * 5000)))
        await stream.producer.flush()
    [copy] = await queues.receive(dlq)
    reason = reason_of(copy)
    assert len(reason.encode("utf-8")) <= REASON_MAX_BYTES
    assert reason.startswith("xxx") and reason.endswith(TRUNCATED_MARK)


async def test_start_warns_when_the_dead_letter_queue_takes_smaller_messages(
    settings: dict[str, Any], queues: SqsQueues, caplog: pytest.LogCaptureFixture
) -> None:
    url = await queues.create()
    dlq = await queues.create("dlq", attributes=SMALLEST)
    await queues.send(url, ["x"])
    with caplog.at_level(logging.WARNING, logger="acklane.connectors.sqs"):
        async with open_stream(settings, queue_url=url, dead_letter=dlq) as stream:
            await stream.pull()
            assert stream.producer.dead_letter_max_size == 1024
            assert stream.producer.max_message_size is not None
            assert stream.producer.max_message_size > 1024
    [warning] = [r.getMessage() for r in caplog.records if "takes messages of at most" in r.message]
    assert dlq in warning and "1024" in warning and "MaximumMessageSize" in warning


async def test_no_size_warning_when_the_dead_letter_queue_takes_as_much(
    settings: dict[str, Any], queues: SqsQueues, caplog: pytest.LogCaptureFixture
) -> None:
    url = await queues.create()
    dlq = await queues.create("dlq")
    await queues.send(url, ["x"])
    with caplog.at_level(logging.WARNING, logger="acklane.connectors.sqs"):
        async with open_stream(settings, queue_url=url, dead_letter=dlq) as stream:
            await stream.pull()
    assert "MaximumMessageSize" not in caplog.text


async def test_a_copy_too_large_for_the_dead_letter_queue_is_refused_counted_and_kept(
    settings: dict[str, Any], queues: SqsQueues, caplog: pytest.LogCaptureFixture
) -> None:
    url = await queues.create(visibility_timeout=300)
    dlq = await queues.create("dlq", attributes=SMALLEST)
    [message_id] = await queues.send(url, ["z" * 2000])
    async with open_stream(settings, queue_url=url, dead_letter=dlq) as stream:
        [pulled] = await stream.pull()
        with (
            caplog.at_level(logging.ERROR, logger="acklane.connectors.sqs"),
            pytest.raises(SqsAdvanceError) as refused,
        ):
            await stream.advance((pulled, rejected("too big to copy")))
        await stream.producer.flush()
        text = str(refused.value)
        for part in (message_id, dlq, "1024 bytes", "MaximumMessageSize"):
            assert part in text
        assert f"the copy is {2000 + 66 + 18 + len(url) + 36 + 15} bytes" in text
        assert text in caplog.text  # logged as an error, not only raised
        counters = stream.producer.counters()  # what acklane_connector_actions exports
        assert (counters["dead_letter_refused"], counters["dead_lettered"]) == (1, 0)
        assert stream.producer.api_calls["SendMessageBatch"] == 0  # known too large
    # never deleted: back on the queue (its receive count grows), nothing in the DLQ
    assert await queues.counts(url) == (1, 0)
    assert await queues.counts(dlq) == (0, 0)


async def test_sqs_refusing_a_copy_for_its_size_is_reported_even_when_the_limit_is_unknown(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(visibility_timeout=300)
    dlq = await queues.create("dlq", attributes=SMALLEST)
    await queues.send(url, ["small"])
    [big_id] = await queues.send(url, ["z" * 2000])
    async with open_stream(settings, queue_url=url, dead_letter=dlq) as stream:
        small, big = await stream.pull(2)
        assert small[0].text() == "small"
        stream.producer.dead_letter_max_size = None  # as if its attributes were unreadable
        with pytest.raises(SqsAdvanceError) as refused:
            await stream.advance((small, rejected("bad")), (big, rejected("bad")))
        await stream.producer.flush()
        text = str(refused.value)
        for part in (big_id, "1024 bytes", "MaximumMessageSize", dlq):
            assert part in text
        assert stream.producer.dead_letter_refused == 1
        assert stream.producer.dead_lettered == 1  # the one that fits was not held up
    [copy] = await queues.receive(dlq)
    assert copy["Body"] == "small"
    [(body, _)] = [(m["Body"], m) for m in await queues.receive(url)]
    assert body == "z" * 2000  # the refused one was not deleted


async def test_the_reason_is_cut_to_fit_a_dead_letter_queue_just_large_enough(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create()
    dlq = await queues.create("dlq", attributes=SMALLEST)
    await queues.send(url, ["b" * 700])
    async with open_stream(settings, queue_url=url, dead_letter=dlq) as stream:
        [pulled] = await stream.pull()
        await stream.advance((pulled, rejected("r" * 900)))
        await stream.producer.flush()
        assert (stream.producer.dead_lettered, stream.producer.dead_letter_refused) == (1, 0)
    [copy] = await queues.receive(dlq)
    assert copy_size(copy) <= 1024
    assert reason_of(copy).endswith(TRUNCATED_MARK)
    assert await queues.counts(url) == (0, 0)


async def test_a_refused_reject_on_a_fifo_queue_brings_its_group_back_in_order(
    settings: dict[str, Any], queues: SqsQueues
) -> None:
    url = await queues.create(fifo=True, visibility_timeout=300)
    dlq = await queues.create("dlq", fifo=True, attributes=SMALLEST)
    await queues.send(url, ["z" * 2000, "after"], group_id="G")
    async with open_stream(settings, queue_url=url, dead_letter=dlq) as stream:
        big, after = await stream.pull(2)
        with pytest.raises(SqsAdvanceError, match="MaximumMessageSize"):
            await stream.advance((big, rejected("bad")), (after, CLEAN))
        await stream.producer.flush()
    # neither was deleted nor kept for a restart: SQS redelivers the group in order
    assert stream.producer.parked == 0
    again = await queues.receive(url)
    assert [len(m["Body"]) for m in again] == [2000, 5]
    assert [m["Attributes"]["ApproximateReceiveCount"] for m in again] == ["2", "2"]
