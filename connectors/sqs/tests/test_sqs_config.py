"""The ``connector: sqs`` YAML block: validation, the shared stream key, the plugin entry."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from acklane.connectors.sqs import (
    RedeliveryBackoff,
    SqsConfig,
    SqsConnector,
    SqsMessageTrigger,
    SqsStreamProducer,
)
from acklane.core.connectors import load_connector

URL = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"


def invalid(**fields: Any) -> str:
    with pytest.raises(ValidationError) as info:
        SqsConfig.model_validate(fields)
    return str(info.value)


def test_the_sqs_entry_point_names_the_connector() -> None:
    assert load_connector("sqs") is SqsConnector
    assert SqsConnector.config_model is SqsConfig


def test_key_is_queue_region_and_endpoint() -> None:
    config = SqsConfig(queue_url=URL, endpoint_url="http://localhost:4566")
    assert SqsConnector.stream_key(config) == ("sqs", URL, "eu-west-1", "http://localhost:4566")


def test_tuning_fields_are_not_part_of_the_key() -> None:
    plain = SqsConfig(queue_url=URL)
    tuned = SqsConfig.model_validate(
        {
            "queue_url": URL,
            "wait_time_seconds": 5,
            "batch_size": 3,
            "visibility_timeout": 60,
            "redelivery_backoff": {"base": 5},
            "heartbeat": {"interval": 2},
            "dead_letter": "https://sqs.eu-west-1.amazonaws.com/123456789012/dlq",
            "profile": "ops",
        }
    )
    assert plain.stream_key() == tuned.stream_key()


def test_queue_name_with_account_is_a_key_of_its_own() -> None:
    config = SqsConfig(queue_name="orders", account_id="123456789012", region="eu-west-1")
    assert config.stream_key() == ("sqs", "123456789012/orders", "eu-west-1", "")


def test_empty_optional_fields_read_as_unset() -> None:
    config = SqsConfig.model_validate(
        {"queue_url": URL, "aws_access_key_id": "", "aws_secret_access_key": "", "profile": ""}
    )
    assert config.aws_access_key_id is None
    assert config.profile is None


def test_region_is_read_from_an_aws_queue_url() -> None:
    assert SqsConfig(queue_url=URL).region == "eu-west-1"


def test_explicit_region_wins_over_the_url() -> None:
    assert SqsConfig(queue_url=URL, region="us-east-2").region == "us-east-2"


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"queue_url": URL, "wait_time_seconds": 21}, "wait_time_seconds"),
        ({"queue_url": URL, "batch_size": 11}, "batch_size"),
        ({"queue_url": URL, "batch_size": 0}, "batch_size"),
        ({"queue_url": URL, "visibility_timeout": 43_201}, "visibility_timeout"),
        ({"queue_url": "sqs://nope"}, "queue_url"),
        ({"queue_name": "no spaces allowed"}, "queue_name"),
        ({"queue_name": "x" * 81}, "queue_name"),
        ({"queue_name": "orders", "account_id": "12"}, "account_id"),
        ({}, "queue_url / queue_name"),
        ({"queue_url": URL, "queue_name": "orders"}, "queue_url / queue_name"),
        ({"queue_url": URL, "account_id": "123456789012"}, "account_id"),
        ({"queue_url": URL, "aws_access_key_id": "AKIA"}, "aws_secret_access_key"),
        (
            {
                "queue_url": URL,
                "profile": "p",
                "aws_access_key_id": "a",
                "aws_secret_access_key": "s",
            },
            "profile",
        ),
        ({"queue_url": URL, "heartbeat": {"interval": 5, "extension": 10}}, "heartbeat.extension"),
        ({"queue_url": URL, "redelivery_backoff": {"max": 50_000}}, "redelivery_backoff"),
        ({"queue_url": URL, "poll_timeout": 3}, "poll_timeout"),
        ({"queue_url": URL, "restart_lease_hold": -1}, "restart_lease_hold"),
        ({"queue_url": URL, "restart_lease_hold": 43_201}, "restart_lease_hold"),
    ],
)
def test_validation_errors_name_the_field(fields: dict[str, Any], named: str) -> None:
    assert named in invalid(**fields)


def test_secrets_stay_out_of_repr_and_description() -> None:
    config = SqsConfig.model_validate(
        {
            "queue_url": URL,
            "aws_access_key_id": "AKIAEXAMPLE",
            "aws_secret_access_key": "very-secret",
        }
    )
    assert "very-secret" not in repr(config)
    assert "very-secret" not in SqsConnector.describe(config)
    assert "AKIAEXAMPLE" not in SqsConnector.describe(config)


def test_redelivery_backoff_grows_with_the_receive_count_up_to_its_cap() -> None:
    backoff = RedeliveryBackoff(base=2, multiplier=3, max=30)
    assert [backoff.delay(n) for n in (1, 2, 3, 4, 100)] == [2, 6, 18, 30, 30]


def test_zero_backoff_redelivers_at_once() -> None:
    assert RedeliveryBackoff().delay(7) == 0


def test_a_number_is_read_as_the_backoff_base() -> None:
    config = SqsConfig.model_validate({"queue_url": URL, "redelivery_backoff": 5})
    assert config.redelivery_backoff.base == 5


def test_restart_lease_hold_defaults_to_a_minute_and_zero_turns_it_off() -> None:
    assert SqsConfig(queue_url=URL).restart_lease_hold == 60
    off = SqsConfig(queue_url=URL, restart_lease_hold=0)
    assert off.restart_lease_hold == 0
    assert off.stream_key() == SqsConfig(queue_url=URL).stream_key()  # tuning, not the key


def test_heartbeat_defaults_follow_the_visibility_timeout() -> None:
    assert SqsConfig(queue_url=URL).heartbeat.timing(40) == (10.0, 40)


def test_trigger_shares_its_key_with_the_connector_and_ignores_its_own_fields() -> None:
    trigger = SqsMessageTrigger(queue_url=URL, wait_time_seconds=1, label="mine")
    assert trigger.shared_stream_key() == SqsConnector.stream_key(SqsConfig(queue_url=URL))
    assert SqsMessageTrigger.uses_ack_channel()
    _, kwargs = trigger.serialize()
    producer = SqsMessageTrigger.create_shared_stream_producer(kwargs)
    assert isinstance(producer, SqsStreamProducer)
    assert producer.config.wait_time_seconds == 1


def test_creating_a_producer_connects_to_nothing() -> None:
    producer = SqsConnector.create_producer({"queue_url": URL})
    assert producer.total_api_calls == 0
    assert producer.queue_url is None


def test_botocore_models_are_preloaded_off_the_event_loop(caplog: pytest.LogCaptureFixture) -> None:
    # The producer reads them on a thread before creating its client; this fails if a
    # botocore upgrade moves them, so that the event loop would block on them again.
    import aioboto3

    from acklane.connectors.sqs._queue import _load_models

    session = aioboto3.Session(region_name="eu-west-1")
    with caplog.at_level("DEBUG", logger="acklane.connectors.sqs"):
        _load_models(session)
    assert not [r for r in caplog.records if "not preloaded" in r.getMessage()]
    loader = session._session.get_component("data_loader")
    assert loader.load_service_model("sqs", "service-2")["metadata"]["serviceId"] == "SQS"
