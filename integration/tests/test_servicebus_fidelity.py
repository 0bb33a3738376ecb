"""The Service Bus emulator where it used to differ from the service, through the official SDK.

Each test is a behaviour of the service that the emulator once broke or ignored: the
not-found error, bodies proton cannot read, failed sends that hung, peeked states,
listing sessions and the session receiver's timeout.
"""

from __future__ import annotations

import asyncio
import datetime
import time

import pytest
from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusMessageState,
)
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.amqp import AmqpAnnotatedMessage, AmqpMessageBodyType
from azure.servicebus.exceptions import MessagingEntityNotFoundError, OperationTimeoutError

from acklane.integration.emulator import Emulator
from acklane.integration.servicebus import ServiceBusEmulator


@pytest.fixture
def bus(servicebus_emulator: Emulator) -> ServiceBusEmulator:
    assert isinstance(servicebus_emulator, ServiceBusEmulator)
    return servicebus_emulator


def client(bus: ServiceBusEmulator) -> ServiceBusClient:
    return ServiceBusClient.from_connection_string(bus.connection_string, retry_total=0)


def test_a_send_to_an_entity_that_does_not_exist_is_entity_not_found(
    bus: ServiceBusEmulator,
) -> None:
    with (
        client(bus) as c,
        pytest.raises(MessagingEntityNotFoundError, match="could not be found"),
        c.get_queue_sender("no-such-queue") as sender,
    ):
        sender.send_messages(ServiceBusMessage(b"x"))


def test_a_send_to_a_deleted_entity_fails_at_once_instead_of_hanging(
    bus: ServiceBusEmulator,
) -> None:
    queue = bus.create_queue()
    with client(bus) as c, c.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage(b"before"))
        bus.delete_entity(queue)
        started = time.monotonic()
        with pytest.raises(MessagingEntityNotFoundError):
            sender.send_messages(ServiceBusMessage(b"after"), timeout=30)
        assert time.monotonic() - started < 20  # an answer, not the send's own timeout


@pytest.mark.parametrize(
    "body",
    [
        {"value_body": {b"binary-key": 1, b"other": [1, 2]}},
        {"value_body": [b"\x00\x01", {b"nested": {b"k": b"v"}}]},
        {"sequence_body": [[1, b"two"], [{b"k": 3}]]},
        {"data_body": [b"one", b"two"]},
    ],
)
def test_any_amqp_body_the_sdk_sends_comes_back_as_sent(
    bus: ServiceBusEmulator, body: dict[str, object]
) -> None:
    queue = bus.create_queue()
    with client(bus) as c:
        with c.get_queue_sender(queue) as sender:
            sender.send_messages(AmqpAnnotatedMessage(**body), timeout=10)  # type: ignore[arg-type]
        with c.get_queue_receiver(queue, max_wait_time=2) as receiver:
            [message] = receiver.receive_messages(max_wait_time=3)
            receiver.complete_message(message)
    kind, expected = next(iter(body.items()))
    if kind == "data_body":
        assert message.body_type == AmqpMessageBodyType.DATA
        assert list(message.body) == expected
    elif kind == "sequence_body":
        assert message.body_type == AmqpMessageBodyType.SEQUENCE
        assert list(message.body) == expected
    else:
        assert message.body_type == AmqpMessageBodyType.VALUE
        assert message.body == expected


def test_peek_shows_deferred_and_scheduled_messages_with_their_states(
    bus: ServiceBusEmulator,
) -> None:
    queue = bus.create_queue(lock_duration=10)
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
    with client(bus) as c:
        with c.get_queue_sender(queue) as sender:
            sender.send_messages([ServiceBusMessage(b"active"), ServiceBusMessage(b"deferred")])
            sender.schedule_messages(ServiceBusMessage(b"scheduled"), later)
        with c.get_queue_receiver(queue, max_wait_time=2) as receiver:
            received = receiver.receive_messages(max_message_count=2, max_wait_time=3)
            by_body = {str(m): m for m in received}
            receiver.defer_message(by_body["deferred"])
            receiver.abandon_message(by_body["active"])
            peeked = receiver.peek_messages(max_message_count=10, sequence_number=1)
            states = {str(m): m.state for m in peeked}
            assert states == {
                "active": ServiceBusMessageState.ACTIVE,
                "deferred": ServiceBusMessageState.DEFERRED,
                "scheduled": ServiceBusMessageState.SCHEDULED,
            }
            [again] = receiver.receive_deferred_messages([by_body["deferred"].sequence_number])
            assert again.state == ServiceBusMessageState.DEFERRED
            receiver.complete_message(again)


def test_list_sessions_names_those_with_messages_or_state(bus: ServiceBusEmulator) -> None:
    queue = bus.create_queue(requires_session=True, lock_duration=10)
    with client(bus) as c:
        with c.get_queue_sender(queue) as sender:
            sender.send_messages(
                [ServiceBusMessage(b"x", session_id=s) for s in ("s-b", "s-a", "s-b")]
            )
        assert sorted(c.list_queue_sessions(queue)) == ["s-a", "s-b"]
        before = datetime.datetime.now(datetime.UTC)
        time.sleep(0.05)
        with c.get_queue_receiver(queue, session_id="s-a", max_wait_time=2) as receiver:
            receiver.session.set_state(b"checkpoint")
            for message in receiver.receive_messages(max_wait_time=2):
                receiver.complete_message(message)
        assert list(c.list_queue_sessions(queue, state_updated_after=before)) == ["s-a"]
        assert sorted(c.list_queue_sessions(queue)) == ["s-a", "s-b"]  # s-a keeps its state


def test_the_async_session_receiver_times_out_when_no_session_is_free(
    bus: ServiceBusEmulator,
) -> None:
    queue = bus.create_queue(requires_session=True)

    async def receive() -> None:
        async with (
            AsyncServiceBusClient.from_connection_string(bus.connection_string, retry_total=0) as c,
            c.get_queue_receiver(queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1),
        ):
            raise AssertionError("a session receiver opened on a queue with no session")

    started = time.monotonic()
    with pytest.raises(OperationTimeoutError):
        asyncio.run(asyncio.wait_for(receive(), 30))
    assert time.monotonic() - started < 20
