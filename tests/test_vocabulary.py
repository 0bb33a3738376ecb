"""One vocabulary on every broker: the same name for the same idea in every stream block,
each old name still read (from YAML, with a warning at its file and line; from Python),
the classes named alike, the old class names kept as deprecated aliases, and one
``Action`` word per broker step.

Every connector at once, so it lives here, not beside one of them.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from acklane.connectors.memory import MemoryBroker
from acklane.core.config import load_config
from acklane.core.connectors import (
    Action,
    Connector,
    ConnectorTrigger,
    HeartbeatSettings,
    LeaseStreamSettings,
    StreamSettings,
    deprecated_names,
    load_connector,
)
from acklane.integration.testing import write_pipeline

BROKERS = ("memory", "kafka", "sqs", "pubsub", "servicebus")
SB_CONNECTION = "Endpoint=sb://localhost:5672/;SharedAccessKeyName=k;SharedAccessKey=s"
#: The least each connector's stream block takes, as Python fields.
MINIMAL: dict[str, dict[str, Any]] = {
    "memory": {"topics": ["orders"]},
    "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topics": ["orders"], "group_id": "g"},
    "sqs": {"queue_url": "http://127.0.0.1:4566/000000000000/orders", "region": "us-east-1"},
    "pubsub": {"project": "p", "subscription": "orders-sub"},
    "servicebus": {"connection_string": SB_CONNECTION, "queue": "orders"},
}
#: A value for each old name of each connector (a rename without one fails a test below).
OLD_VALUES: dict[tuple[str, str], Any] = {
    ("memory", "dlq_topic"): "orders.dlq",
    ("kafka", "dlq_topic"): "orders.dlq",
    ("kafka", "dlq_flush_timeout"): 5.0,
    ("kafka", "dlq_client"): {"linger.ms": 5},
    ("sqs", "dead_letter_queue_url"): "http://127.0.0.1:4566/000000000000/orders-dlq",
    ("sqs", "max_messages"): 5,
    ("pubsub", "dead_letter_topic"): "orders-dlq",
    ("pubsub", "max_messages"): 5,
    ("pubsub", "heartbeat_interval"): 5.0,
    ("servicebus", "max_batch"): 5,
    ("servicebus", "renew_interval"): 5.0,
}
#: The Python trigger class of each broker that has one.
TRIGGERS = {
    "kafka": "acklane.connectors.kafka:KafkaMessageTrigger",
    "sqs": "acklane.connectors.sqs:SqsMessageTrigger",
    "pubsub": "acklane.connectors.pubsub:PubSubMessageTrigger",
    "servicebus": "acklane.connectors.servicebus:ServiceBusMessageTrigger",
}
#: Old class names: (package, old name, new name).
OLD_CLASSES = [
    ("acklane.connectors.servicebus", "ServiceBusTrigger", "ServiceBusMessageTrigger"),
    ("acklane.connectors.servicebus", "ServiceBusRecord", "ServiceBusMessage"),
    ("acklane.connectors.memory", "MemoryProducer", "MemoryStreamProducer"),
    ("acklane.connectors.memory", "MemoryPayload", "MemoryDelivery"),
    ("acklane.connectors.sqs", "HeartbeatSettings", "SqsHeartbeat"),
]


def connector(name: str) -> type[Connector]:
    return load_connector(name)


def old_names() -> list[tuple[str, str, str]]:
    return [
        (broker, old, new)
        for broker in BROKERS
        for old, new in deprecated_names(connector(broker).config_model).items()
    ]


def value_at(config: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        config = getattr(config, part)
    return config


def imported(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


# -- the same names ---------------------------------------------------------------------------


@pytest.mark.parametrize("broker", BROKERS)
def test_every_stream_block_has_the_shared_names(broker: str) -> None:
    model = connector(broker).config_model
    assert issubclass(model, StreamSettings)
    assert {"max_attempts", "dead_letter", "batch_size"} <= set(model.model_fields)


@pytest.mark.parametrize("broker", ["sqs", "pubsub"])
def test_the_lease_brokers_share_the_lease_settings(broker: str) -> None:
    model = connector(broker).config_model
    assert issubclass(model, LeaseStreamSettings)
    names = {"redelivery_backoff", "restart_lease_hold", "advance_linger", "heartbeat"}
    assert names <= set(model.model_fields)


@pytest.mark.parametrize("broker", ["sqs", "pubsub", "servicebus"])
def test_every_lease_heartbeat_is_set_as_heartbeat_interval(broker: str) -> None:
    config = connector(broker).config({**MINIMAL[broker], "heartbeat": {"interval": 2.0}})
    assert isinstance(config.heartbeat, HeartbeatSettings)  # type: ignore[attr-defined]
    assert config.heartbeat.interval == 2.0  # type: ignore[attr-defined]


def test_service_bus_refuses_a_dead_letter_destination_saying_where_rejects_go() -> None:
    with pytest.raises(ValueError, match="entity's own dead-letter sub-queue"):
        connector("servicebus").config({**MINIMAL["servicebus"], "dead_letter": "elsewhere"})


# -- the old names still work -----------------------------------------------------------------


def test_every_old_name_has_a_value_here() -> None:
    assert {(b, o) for b, o, _ in old_names()} == set(OLD_VALUES)


@pytest.mark.parametrize(("broker", "old", "new"), old_names())
def test_a_yaml_with_an_old_name_loads_with_a_warning_at_its_file_and_line(
    tmp_path: Path, broker: str, old: str, new: str
) -> None:
    fields = {**MINIMAL[broker], old: OLD_VALUES[(broker, old)]}
    block = "".join(f"{name}: {json.dumps(value)}\n" for name, value in fields.items())
    path = write_pipeline(tmp_path, broker, block)
    with pytest.warns(FutureWarning) as caught:
        config = load_config(path)
    assert value_at(config.streams["orders"].config, new) == OLD_VALUES[(broker, old)]
    [warning] = [w for w in caught if f"streams.orders.{old} " in str(w.message)]
    assert f"now called {new}" in str(warning.message)
    line = 5 + list(fields).index(old)  # the stream's settings start at line 5
    assert (warning.filename, warning.lineno) == (str(path), line)
    assert [(d.line, d.path) for d in config.deprecations] == [(line, f"streams.orders.{old}")]


@pytest.mark.parametrize(("broker", "old", "new"), old_names())
def test_an_old_name_in_python_is_read_as_the_new_one_with_a_warning(
    broker: str, old: str, new: str
) -> None:
    value = OLD_VALUES[(broker, old)]
    with pytest.warns(FutureWarning, match=f"{old} is deprecated, now called {new}"):
        config = connector(broker).config({**MINIMAL[broker], old: value})
    assert value_at(config, new) == value
    trigger_path = TRIGGERS.get(broker)
    if trigger_path is not None:  # a Python trigger's kwargs are read the same way
        trigger_class: type[ConnectorTrigger[Any]] = imported(trigger_path)
        with pytest.warns(FutureWarning):
            trigger = trigger_class(**MINIMAL[broker], **{old: value})
        assert trigger.stream_config() == config


# -- the classes named alike ------------------------------------------------------------------


@pytest.mark.parametrize(("package", "old", "new"), OLD_CLASSES)
def test_an_old_class_name_is_the_new_class_with_a_deprecation_warning(
    package: str, old: str, new: str
) -> None:
    module = importlib.import_module(package)
    with pytest.warns(DeprecationWarning, match=f"{package}.{old} is deprecated, now called {new}"):
        value = getattr(module, old)
    assert value is getattr(module, new)
    assert old not in module.__all__ and new in module.__all__


def test_the_public_names_follow_one_pattern_per_broker() -> None:
    for broker, prefix in {
        "memory": "Memory",
        "kafka": "Kafka",
        "sqs": "Sqs",
        "pubsub": "PubSub",
        "servicebus": "ServiceBus",
    }.items():
        names = set(importlib.import_module(f"acklane.connectors.{broker}").__all__)
        wanted = {f"{prefix}{kind}" for kind in ("Config", "Connector", "StreamProducer")}
        wanted.add(f"{prefix}Delivery")
        if broker != "memory":  # the memory broker's filters see a plain RawMessage
            wanted |= {f"{prefix}Message", f"{prefix}MessageTrigger"}
        assert wanted <= names, (broker, sorted(wanted - names))


# -- one Action word per broker step ----------------------------------------------------------


def test_each_brokers_advance_step_is_counted_under_its_own_word() -> None:
    steps = {
        "memory": None,  # commits, as Kafka does; counted by the broker's group stats
        "kafka": Action.COMMITTED,
        "sqs": Action.DELETED,
        "pubsub": Action.ACKED,
        "servicebus": Action.COMPLETED,
    }
    own = {Action.COMMITTED, Action.DELETED, Action.ACKED, Action.COMPLETED}
    try:
        for broker, step in steps.items():
            config = {**MINIMAL[broker], "broker": "vocabulary"} if broker == "memory" else None
            producer = connector(broker).create_producer(config or MINIMAL[broker])
            reported = set(producer.counters()) & own
            assert reported == ({step} if step else set()), broker
    finally:
        MemoryBroker.remove("vocabulary")
