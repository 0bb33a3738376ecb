"""acklane's Service Bus emulator through the official SDK (sync and async), one behaviour each."""

from __future__ import annotations

import time

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.exceptions import ServiceBusAuthenticationError

from acklane.integration.emulator import Emulator
from acklane.integration.servicebus import (
    EmulatorConfig,
    ServiceBusEmulator,
    connection_string,
    parse_duration,
)


@pytest.fixture
def bus(servicebus_emulator: Emulator) -> ServiceBusEmulator:
    assert isinstance(servicebus_emulator, ServiceBusEmulator)
    return servicebus_emulator


def client(bus: ServiceBusEmulator) -> ServiceBusClient:
    return ServiceBusClient.from_connection_string(bus.connection_string)


def test_durations_and_config_file() -> None:
    assert parse_duration("PT1M") == 60
    assert parse_duration("PT0.5S") == 0.5
    assert parse_duration("P1DT1H") == 90000
    config = EmulatorConfig.from_json(
        {
            "UserConfig": {
                "Namespaces": [
                    {
                        "Name": "ns",
                        "Queues": [{"Name": "q", "Properties": {"MaxDeliveryCount": 3}}],
                        "Topics": [{"Name": "t", "Subscriptions": [{"Name": "s"}]}],
                    }
                ]
            }
        }
    )
    assert config.queues["q"].max_delivery_count == 3
    assert "s" in config.topics["t"].subscriptions


def test_a_wrong_key_is_refused(bus: ServiceBusEmulator) -> None:
    queue = bus.create_queue()
    assert bus.port is not None
    wrong = connection_string(bus.host, bus.port, key="not-the-key")
    with (
        pytest.raises(ServiceBusAuthenticationError),
        ServiceBusClient.from_connection_string(wrong, retry_total=0) as c,
        c.get_queue_sender(queue) as sender,
    ):
        sender.send_messages(ServiceBusMessage(b"x"))


def test_send_receive_complete_with_annotations(bus: ServiceBusEmulator) -> None:
    queue = bus.create_queue(lock_duration=10)
    with client(bus) as c:
        with c.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage(b"hello", application_properties={"k": "v"}))
        with c.get_queue_receiver(queue, max_wait_time=2) as receiver:
            [message] = receiver.receive_messages(max_message_count=1, max_wait_time=2)
            assert str(message) == "hello"
            assert message.application_properties == {
                b"k": "v"
            } or message.application_properties == {b"k": b"v"}
            assert message.sequence_number == 1
            assert message.delivery_count == 0
            assert message.enqueued_time_utc is not None
            assert message.locked_until_utc is not None
            receiver.complete_message(message)
    assert bus.counts(queue)["messages"] == 0


def test_batch_is_unpacked(bus: ServiceBusEmulator) -> None:
    queue = bus.create_queue(lock_duration=10)
    with client(bus) as c:
        with c.get_queue_sender(queue) as sender:
            sender.send_messages([ServiceBusMessage(b"a"), ServiceBusMessage(b"b")])
        with c.get_queue_receiver(queue, max_wait_time=2) as receiver:
            got = receiver.receive_messages(max_message_count=2, max_wait_time=2)
            assert [str(m) for m in got] == ["a", "b"]
            for m in got:
                receiver.complete_message(m)


def test_abandon_counts_a_delivery(bus: ServiceBusEmulator) -> None:
    queue = bus.create_queue(lock_duration=10)
    with client(bus) as c:
        with c.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage(b"a"))
        with c.get_queue_receiver(queue, max_wait_time=2) as receiver:
            [m] = receiver.receive_messages(max_message_count=1, max_wait_time=2)
            receiver.abandon_message(m)
            [m] = receiver.receive_messages(max_message_count=1, max_wait_time=2)
            assert m.delivery_count == 1
            receiver.complete_message(m)


def test_dead_letter_with_reason_and_max_delivery_count(bus: ServiceBusEmulator) -> None:
    queue = bus.create_queue(lock_duration=10, max_delivery_count=1)
    with client(bus) as c:
        with c.get_queue_sender(queue) as sender:
            sender.send_messages([ServiceBusMessage(b"poison"), ServiceBusMessage(b"tired")])
        with c.get_queue_receiver(queue, max_wait_time=2) as receiver:
            first, second = receiver.receive_messages(max_message_count=2, max_wait_time=2)
            receiver.dead_letter_message(first, reason="bad", error_description="very bad")
            receiver.abandon_message(second)
        with c.get_queue_receiver(queue, sub_queue="deadletter", max_wait_time=2) as dlq:
            got = dlq.receive_messages(max_message_count=2, max_wait_time=2)
            reasons = {str(m): (m.dead_letter_reason, m.dead_letter_error_description) for m in got}
            assert reasons["poison"] == ("bad", "very bad")
            assert reasons["tired"][0] == "MaxDeliveryCountExceeded"
            for m in got:
                dlq.complete_message(m)


def test_lock_expiry_redelivers_and_renewal_keeps_it(bus: ServiceBusEmulator) -> None:
    queue = bus.create_queue(lock_duration=1)
    with client(bus) as c:
        with c.get_queue_sender(queue) as sender:
            sender.send_messages([ServiceBusMessage(b"kept"), ServiceBusMessage(b"lapsed")])
        with c.get_queue_receiver(queue, max_wait_time=2) as receiver:
            kept, _lapsed = receiver.receive_messages(max_message_count=2, max_wait_time=2)
            for _ in range(4):
                time.sleep(0.4)
                receiver.renew_message_lock(kept)
            [again] = receiver.receive_messages(max_message_count=1, max_wait_time=3)
            assert str(again) == "lapsed" and again.delivery_count == 1
            receiver.complete_message(kept)
            receiver.complete_message(again)


def test_defer_peek_and_receive_deferred(bus: ServiceBusEmulator) -> None:
    queue = bus.create_queue(lock_duration=10)
    with client(bus) as c:
        with c.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage(b"later"))
        with c.get_queue_receiver(queue, max_wait_time=2) as receiver:
            [m] = receiver.receive_messages(max_message_count=1, max_wait_time=2)
            receiver.defer_message(m)
            [peeked] = receiver.peek_messages(
                max_message_count=5, sequence_number=m.sequence_number
            )
            assert peeked.sequence_number == m.sequence_number
            [d] = receiver.receive_deferred_messages([m.sequence_number])
            assert str(d) == "later"
            receiver.complete_message(d)
            assert receiver.peek_messages(max_message_count=5, sequence_number=1) == []


def test_schedule_and_cancel(bus: ServiceBusEmulator) -> None:
    from datetime import UTC, datetime, timedelta

    queue = bus.create_queue(lock_duration=10)
    with client(bus) as c:
        with c.get_queue_sender(queue) as sender:
            soon = datetime.now(UTC) + timedelta(seconds=1)
            [keep] = sender.schedule_messages(ServiceBusMessage(b"soon"), soon)
            [drop] = sender.schedule_messages(ServiceBusMessage(b"never"), soon)
            sender.cancel_scheduled_messages(drop)
            assert keep != drop
        with c.get_queue_receiver(queue, max_wait_time=4) as receiver:
            got = receiver.receive_messages(max_message_count=2, max_wait_time=4)
            assert [str(m) for m in got] == ["soon"]
            receiver.complete_message(got[0])


def test_receive_and_delete(bus: ServiceBusEmulator) -> None:
    from azure.servicebus import ServiceBusReceiveMode

    queue = bus.create_queue()
    with client(bus) as c:
        with c.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage(b"gone"))
        with c.get_queue_receiver(
            queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, max_wait_time=2
        ) as receiver:
            [m] = receiver.receive_messages(max_message_count=1, max_wait_time=2)
            assert str(m) == "gone"
    assert bus.counts(queue)["messages"] == 0


def test_topic_fans_out_to_subscriptions(bus: ServiceBusEmulator) -> None:
    topic = bus.create_topic(subscriptions=["a", "b"], lock_duration=10)
    with client(bus) as c:
        with c.get_topic_sender(topic) as sender:
            sender.send_messages(ServiceBusMessage(b"fan"))
        for sub in ("a", "b"):
            with c.get_subscription_receiver(topic, sub, max_wait_time=2) as receiver:
                [m] = receiver.receive_messages(max_message_count=1, max_wait_time=2)
                assert str(m) == "fan"
                receiver.complete_message(m)


def test_unknown_entity_is_not_found(bus: ServiceBusEmulator) -> None:
    from azure.servicebus.exceptions import ServiceBusError

    with (
        pytest.raises(ServiceBusError),
        ServiceBusClient.from_connection_string(bus.connection_string, retry_total=0) as c,
        c.get_queue_sender("no-such-queue") as sender,
    ):
        sender.send_messages(ServiceBusMessage(b"x"))


def test_sessions_next_available_state_and_renew(bus: ServiceBusEmulator) -> None:
    from azure.servicebus import NEXT_AVAILABLE_SESSION

    queue = bus.create_queue(lock_duration=10, requires_session=True)
    with client(bus) as c:
        with c.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage(b"s-1", session_id="s"))
        with c.get_queue_receiver(
            queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2
        ) as receiver:
            session = receiver.session
            assert session is not None and session.session_id == "s"
            session.set_state(b"state")
            assert session.get_state() == b"state"
            session.renew_lock()
            [m] = receiver.receive_messages(max_message_count=1, max_wait_time=2)
            assert m.session_id == "s"
            receiver.complete_message(m)


async def test_async_client_round_trip(bus: ServiceBusEmulator) -> None:
    queue = bus.create_queue(lock_duration=10)
    async with AsyncServiceBusClient.from_connection_string(bus.connection_string) as c:
        async with c.get_queue_sender(queue) as sender:
            await sender.send_messages(ServiceBusMessage(b"async"))
        async with c.get_queue_receiver(queue, max_wait_time=2, prefetch_count=5) as receiver:
            [m] = await receiver.receive_messages(max_message_count=1, max_wait_time=2)
            assert str(m) == "async"
            await receiver.renew_message_lock(m)
            await receiver.complete_message(m)
    assert bus.counts(queue)["messages"] == 0


async def test_what_a_closing_receiver_prefetched_is_released_at_once_uncounted(
    bus: ServiceBusEmulator,
) -> None:
    # The SDK releases what it prefetched and never handed on when a receiver closes,
    # with a pre-settled disposition: Service Bus makes those messages available again
    # at once, their delivery count unchanged (not when their locks lapse, counted).
    queue = bus.create_queue(lock_duration=60)
    async with AsyncServiceBusClient.from_connection_string(bus.connection_string) as c:
        async with c.get_queue_sender(queue) as sender:
            await sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(30)])
        async with c.get_queue_receiver(queue, prefetch_count=20) as first:
            taken = await first.receive_messages(max_message_count=5, max_wait_time=5)
            for m in taken:
                await first.complete_message(m)
            assert bus.counts(queue)["locked"] > 0  # more than the 5 prefetched, locked
        assert bus.counts(queue)["locked"] == 0  # released by the close
        seen: list[int | None] = []
        async with c.get_queue_receiver(queue, prefetch_count=20) as second:
            while len(seen) < 30 - len(taken):  # long before the 60 s locks would lapse
                got = await second.receive_messages(max_message_count=30, max_wait_time=10)
                assert got, "the released messages did not come back"
                for m in got:
                    seen.append(m.delivery_count)
                    await second.complete_message(m)
    assert seen == [0] * (30 - len(taken))
    assert bus.counts(queue)["messages"] == 0
