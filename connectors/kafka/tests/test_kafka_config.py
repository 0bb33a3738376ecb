"""The Kafka stream's YAML block: what is refused before anything connects, and the key.

No broker is needed: every configuration here points at a port nothing listens on,
and the errors must come from validation alone.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from acklane.connectors.kafka import KafkaConfig, KafkaConnector, KafkaMessageTrigger
from acklane.core.config import ConfigError, parse_config
from acklane.core.connectors import load_connector

NOWHERE = "127.0.0.1:1"


def config(**fields: Any) -> KafkaConfig:
    return KafkaConfig(
        **{"bootstrap_servers": NOWHERE, "topics": ["orders"], "group_id": "g", **fields}
    )


@pytest.mark.parametrize("value", [True, "true", "1", 1])
def test_client_enable_auto_commit_is_refused_naming_the_field(value: Any) -> None:
    with pytest.raises(ValidationError, match=r"client\.enable\.auto\.commit .* must be false"):
        config(client={"enable.auto.commit": value})


def test_client_enable_auto_offset_store_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match=r"client\.enable\.auto\.offset\.store"):
        config(client={"enable.auto.offset.store": "true"})


def test_a_top_level_auto_commit_field_is_refused_with_the_reason() -> None:
    with pytest.raises(
        ValidationError, match="enable_auto_commit: auto-commit cannot be turned on"
    ):
        config(enable_auto_commit=True)


def test_auto_commit_is_refused_by_the_trigger_class_before_anything_connects() -> None:
    with pytest.raises(ValidationError, match=r"enable\.auto\.commit"):
        KafkaMessageTrigger(
            bootstrap_servers=NOWHERE,
            topics=["orders"],
            group_id="g",
            client={"enable.auto.commit": True},
        )


def test_auto_commit_in_a_yaml_pipeline_names_file_line_and_field() -> None:
    text = """\
streams:
  orders:
    connector: kafka
    bootstrap_servers: 127.0.0.1:1
    topics: [orders]
    group_id: g
    client:
      enable.auto.commit: true
watchers:
  - {name: w, stream: orders}
"""
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="p.yaml")
    assert "p.yaml:" in str(info.value)
    assert "enable.auto.commit" in str(info.value)


def test_consumer_settings_always_turn_auto_commit_and_offset_store_off() -> None:
    settings = config(
        client={"enable.auto.commit": False, "fetch.min.bytes": 10}
    ).consumer_settings()
    assert settings["enable.auto.commit"] is False
    assert settings["enable.auto.offset.store"] is False
    assert settings["fetch.min.bytes"] == 10


def test_the_consumer_backs_off_a_full_fetch_queue_briefly_unless_told_otherwise() -> None:
    assert config().consumer_settings()["fetch.queue.backoff.ms"] == 50
    assert "fetch.queue.backoff.ms" not in config().dlq_settings()  # consumer-only
    tuned = config(client={"fetch.queue.backoff.ms": 200}).consumer_settings()
    assert tuned["fetch.queue.backoff.ms"] == 200


def test_key_is_servers_sorted_topics_and_group_and_tuning_is_not_part_of_it() -> None:
    a = config(bootstrap_servers="b:9092,a:9092", topics=["y", "x"], batch_size=10)
    b = config(bootstrap_servers=["a:9092", "b:9092"], topics=["x", "y"], poll_timeout=2.0)
    assert a.stream_key() == b.stream_key() == ("kafka", "a:9092,b:9092", ("x", "y"), "g")
    assert config(group_id="other").stream_key() != config().stream_key()


def test_the_trigger_key_and_the_connector_key_agree() -> None:
    trigger = KafkaMessageTrigger(bootstrap_servers=NOWHERE, topics=["orders"], group_id="g")
    assert trigger.shared_stream_key() == KafkaConnector.stream_key(config())


def test_the_kafka_connector_is_registered_under_its_name() -> None:
    connector = load_connector("kafka")
    assert connector is KafkaConnector
    assert connector.config_model is KafkaConfig


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"client": {"group.id": "x"}}, "set the group_id field"),
        ({"client": {"bootstrap.servers": "x:1"}}, "set the bootstrap_servers field"),
        ({"dead_letter": "orders"}, "dead_letter 'orders' is one of the consumed topics"),
        ({"topics": []}, "expected at least one topic"),
        ({"topics": ["bad topic"]}, "is not a Kafka topic name"),
        ({"bootstrap_servers": "nohost"}, "'nohost' is not host:port"),
        ({"batch_size": 0}, "batch_size"),
        ({"sasl_username": "u"}, "sasl_password is required"),
        ({"security_protocol": "SSL", "sasl_mechanism": "PLAIN"}, "use SASL_SSL"),
        ({"client": {"security.protocol": "SSL"}, "security_protocol": "SSL"}, "set it in one"),
        ({"sasl_mechansim": "PLAIN"}, "sasl_mechansim"),
    ],
)
def test_invalid_settings_are_refused_naming_the_field(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        config(**fields)


def test_security_fields_pass_through_to_librdkafka_and_stay_out_of_descriptions() -> None:
    c = config(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="svc",
        sasl_password="s3cret",
        ssl_ca_location="/etc/ca.pem",
        client={"sasl.oauthbearer.config": "x=y"},
        dead_letter_client={"linger.ms": 5},
    )
    consumer, dlq = c.consumer_settings(), c.dlq_settings()
    for settings in (consumer, dlq):
        assert settings["security.protocol"] == "SASL_SSL"
        assert settings["sasl.mechanism"] == "SCRAM-SHA-512"
        assert settings["sasl.username"] == "svc"
        assert settings["sasl.password"] == "s3cret"
        assert settings["ssl.ca.location"] == "/etc/ca.pem"
        assert settings["sasl.oauthbearer.config"] == "x=y"
    assert dlq["linger.ms"] == 5 and "linger.ms" not in consumer
    assert "group.id" not in dlq
    assert "s3cret" not in c.describe() and "s3cret" not in repr(c)


@pytest.mark.parametrize(
    ("fields", "at_end"),
    [
        ({}, False),
        ({"auto_offset_reset": "latest"}, True),
        ({"auto_offset_reset": "error"}, False),
        ({"client": {"auto.offset.reset": "largest"}}, True),  # librdkafka's synonyms
        ({"auto_offset_reset": "latest", "client": {"auto.offset.reset": "smallest"}}, False),
    ],
)
def test_where_a_partition_without_a_commit_starts_follows_the_effective_setting(
    fields: dict[str, Any], at_end: bool
) -> None:
    assert config(**fields).starts_at_the_end() is at_end


def test_the_admin_client_gets_servers_security_and_shared_properties_only() -> None:
    c = config(
        security_protocol="SSL",
        client={"session.timeout.ms": 6000, "socket.timeout.ms": 5000},
        dead_letter_client={"linger.ms": 5},
    )
    assert c.admin_settings() == {
        "bootstrap.servers": NOWHERE,
        "security.protocol": "SSL",
        "socket.timeout.ms": 5000,
    }
