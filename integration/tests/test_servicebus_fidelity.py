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


# ---------------------------------------------------------------- subscription rules


class _Msg:
    """What a rule reads of a message: proton's attribute names."""

    def __init__(self, properties: dict[str, object] | None = None, **system: object) -> None:
        self.properties = properties or {}
        self.id = system.get("id")
        self.correlation_id = system.get("correlation_id")
        self.subject = system.get("subject")
        self.content_type = system.get("content_type")
        self.address = self.reply_to = self.group_id = self.reply_to_group_id = None


@pytest.mark.parametrize(
    ("expression", "message", "expected"),
    [
        ("color = 'red'", _Msg({"color": "red"}), True),
        ("color = 'red'", _Msg({"color": "blue"}), False),
        ("color = 'red'", _Msg(), False),
        ("quantity > 10 AND quantity <= 20", _Msg({"quantity": 15}), True),
        ("quantity + 5 = 20", _Msg({"quantity": 15}), True),
        ("quantity % 2 = 1", _Msg({"quantity": 15}), True),
        ("color IN ('red', 'green')", _Msg({"color": "green"}), True),
        ("color NOT IN ('red', 'green')", _Msg({"color": "green"}), False),
        ("color NOT IN ('red', 'green')", _Msg(), False),
        ("name LIKE 'ord%'", _Msg({"name": "order-1"}), True),
        ("name LIKE 'ord_r%'", _Msg({"name": "order-1"}), True),
        ("name LIKE '50!%' ESCAPE '!'", _Msg({"name": "50%"}), True),
        ("name LIKE '50!%' ESCAPE '!'", _Msg({"name": "500"}), False),
        ("color IS NULL", _Msg(), True),
        ("color IS NOT NULL", _Msg({"color": "x"}), True),
        ("EXISTS(color)", _Msg({"color": "x"}), True),
        ("NOT EXISTS([odd name])", _Msg({"odd name": 1}), False),
        ("sys.Label = 'urgent'", _Msg(subject="urgent"), True),
        ("sys.label = 'urgent' OR user.color = 'red'", _Msg({"color": "red"}), True),
        ("(a = 1 OR b = 2) AND c = 3", _Msg({"b": 2, "c": 3}), True),
        ("(a = 1 OR b = 2) AND c = 3", _Msg({"b": 2, "c": 4}), False),
        ("color = 1", _Msg({"color": "1"}), False),  # types that do not compare
        ("1=1", _Msg(), True),
        ("TRUE", _Msg(), True),
        ("name = 'it''s'", _Msg({"name": "it's"}), True),
    ],
)
def test_the_sql_filter_language(expression: str, message: _Msg, expected: bool) -> None:
    from acklane.integration.servicebus._rules import compile_sql_filter

    assert compile_sql_filter(expression)(message) is expected


@pytest.mark.parametrize(
    "expression", ["color = ", "color == 'red'", "sys.Nope = 1", "color LIKE 5", "AND"]
)
def test_a_sql_filter_the_service_refuses_is_refused(expression: str) -> None:
    from acklane.integration.servicebus._rules import RuleError, compile_sql_filter

    with pytest.raises(RuleError):
        compile_sql_filter(expression)


def test_an_action_sets_and_removes_properties() -> None:
    from acklane.integration.servicebus._rules import compile_action

    message = _Msg({"a": 1, "gone": True})
    compile_action("SET b = a + 1; SET sys.Label = 'routed'; REMOVE gone")(message)
    assert message.properties == {"a": 1, "b": 2}
    assert message.subject == "routed"


def _received(c: ServiceBusClient, topic: str, sub: str, wait: float = 2) -> list[object]:
    # Prefetching (the 20 asked for) and without a keep-alive thread: a receiver without
    # prefetch gets one that pings every 5 s, and its close waits out the thread's 1 s
    # nap (about 1 s a receiver, four of them a test); what comes is the same. (The
    # senders below do without one for the same reason.)
    with c.get_subscription_receiver(
        topic, sub, max_wait_time=wait, prefetch_count=20, keep_alive=0
    ) as receiver:
        got = receiver.receive_messages(max_message_count=20, max_wait_time=wait)
        for message in got:
            receiver.complete_message(message)
        return got


def test_subscription_rules_route_what_each_subscription_receives(
    bus: ServiceBusEmulator,
) -> None:
    topic = bus.create_topic(
        subscriptions=("red", "orders", "everything", "none"),
        rules={
            "red": [{"name": "red-only", "sql": "color = 'red' AND quantity >= 2"}],
            "orders": [
                {
                    "name": "by-correlation",
                    "correlation": {"Label": "order", "properties": {"region": "eu"}},
                    "action": "SET routed = 'yes'; SET sys.Label = 'eu-order'",
                }
            ],
            "none": [{"name": "nothing", "filter_type": "false"}],
        },
    )
    messages = [
        ServiceBusMessage(b"1", application_properties={"color": "red", "quantity": 3}),
        ServiceBusMessage(b"2", application_properties={"color": "red", "quantity": 1}),
        ServiceBusMessage(b"3", subject="order", application_properties={"region": "eu"}),
        ServiceBusMessage(b"4", subject="order", application_properties={"region": "us"}),
    ]
    with client(bus) as c:
        with c.get_topic_sender(topic, keep_alive=0) as sender:
            sender.send_messages(messages)
        assert [str(m) for m in _received(c, topic, "red")] == ["1"]
        [order] = _received(c, topic, "orders")
        assert str(order) == "3"
        assert order.subject == "eu-order"
        assert order.application_properties[b"routed"] in ("yes", b"yes")
        assert sorted(str(m) for m in _received(c, topic, "everything")) == ["1", "2", "3", "4"]
        assert _received(c, topic, "none", wait=1) == []


def test_rules_are_managed_over_management(bus: ServiceBusEmulator) -> None:
    from azure.servicebus._common import mgmt_handlers

    topic = bus.create_topic(subscriptions=("s",))
    with (
        client(bus) as c,
        c.get_subscription_receiver(topic, "s", max_wait_time=1) as receiver,
    ):

        def call(operation: bytes, body: dict[str, object]) -> object:
            return receiver._mgmt_request_response(  # the SDK's own $management client
                operation, body, mgmt_handlers.default
            )

        call(
            b"com.microsoft:add-rule",
            {"rule-name": "big", "rule-description": {"sql-filter": {"expression": "n > 100"}}},
        )
        call(b"com.microsoft:remove-rule", {"rule-name": "$Default"})
        listed = call(b"com.microsoft:enumerate-rules", {"top": 10, "skip": 0})
        names = [r[b"rule-description"][b"rule-name"] for r in listed[b"rules"]]  # type: ignore[index]
        assert names in (["big"], [b"big"])
    with client(bus) as c:
        with c.get_topic_sender(topic, keep_alive=0) as sender:
            sender.send_messages(
                [ServiceBusMessage(str(n), application_properties={"n": n}) for n in (5, 500)]
            )
        assert [str(m) for m in _received(c, topic, "s")] == ["500"]


def test_config_json_rules_and_unmodelled_properties() -> None:
    from acklane.integration.servicebus import EmulatorConfig

    config = {
        "UserConfig": {
            "Namespaces": [
                {
                    "Name": "sbemulatorns",
                    "Topics": [
                        {
                            "Name": "events",
                            "Subscriptions": [
                                {
                                    "Name": "eu",
                                    "Rules": [
                                        {
                                            "Name": "eu-only",
                                            "Properties": {
                                                "FilterType": "Correlation",
                                                "CorrelationFilter": {
                                                    "Properties": {"region": "eu"}
                                                },
                                            },
                                        }
                                    ],
                                }
                            ],
                        }
                    ],
                }
            ]
        }
    }
    parsed = EmulatorConfig.from_json(config)
    assert [r.name for r in parsed.topics["events"].rules["eu"]] == ["eu-only"]
    queue = {"Name": "q", "Properties": {"RequiresDuplicateDetection": True}}
    config["UserConfig"]["Namespaces"][0]["Queues"] = [queue]  # type: ignore[index]
    with pytest.raises(ValueError, match="duplicate detection"):
        EmulatorConfig.from_json(config)


def test_concurrent_lock_renewals_from_many_threads_keep_the_connection(
    bus: ServiceBusEmulator,
) -> None:
    from azure.servicebus import AutoLockRenewer

    # A lock of 6 s (the service's shortest is 5 s). The SDK's renewer starts about 2 s
    # after register(), and its worker threads share one socket lock with reads that
    # block for 0.2 s each, so the first renewal's response can wait a further 2 s on a
    # loaded machine: with a 4 s lock the first renewal sometimes arrived too late.
    queue = bus.create_queue(lock_duration=6)
    renewer = AutoLockRenewer(max_workers=8)
    try:
        with client(bus) as c:
            with c.get_queue_sender(queue) as sender:
                sender.send_messages([ServiceBusMessage(str(i)) for i in range(10)])
            with c.get_queue_receiver(queue, max_wait_time=2) as receiver:
                got = receiver.receive_messages(max_message_count=10, max_wait_time=3)
                assert len(got) == 10
                for message in got:
                    renewer.register(receiver, message, max_lock_renewal_duration=30)
                time.sleep(7)  # past the 6 s lock: only the renewals keep the messages
                for message in got:
                    receiver.complete_message(message)
    finally:
        renewer.close()
    assert bus.counts(queue)["messages"] == 0
