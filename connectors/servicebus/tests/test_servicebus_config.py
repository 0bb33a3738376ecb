"""The Service Bus YAML block: validation, the stream key, no secret printed."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from acklane.connectors.servicebus import ServiceBusConfig, ServiceBusConnector

CS = (
    "Endpoint=sb://myns.servicebus.windows.net/;SharedAccessKeyName=Root;"
    "SharedAccessKey=TOPSECRETKEY="
)


def test_key_and_description_never_hold_the_secret() -> None:
    config = ServiceBusConfig(connection_string=CS, topic="t", subscription="s")
    assert ServiceBusConnector.stream_key(config) == (
        "servicebus",
        "myns.servicebus.windows.net",
        "t/subscriptions/s",
    )
    assert "TOPSECRET" not in ServiceBusConnector.describe(config)
    assert "TOPSECRET" not in repr(config)


@pytest.mark.parametrize(
    "fields",
    [
        {"queue": "q"},  # no namespace
        {"connection_string": CS},  # no entity
        {"connection_string": CS, "queue": "q", "topic": "t", "subscription": "s"},
        {"connection_string": CS, "topic": "t"},
        {"connection_string": CS, "queue": "q", "typo": 1},
        {"connection_string": CS, "queue": "q", "client_options": {"receive_mode": 1}},
        {"connection_string": "no endpoint", "queue": "q"},
        {"connection_string": CS, "queue": "q", "receivers": 0},
    ],
)
def test_bad_blocks_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError) as info:
        ServiceBusConfig.model_validate(fields)
    assert "TOPSECRET" not in str(info.value)


def test_two_receivers_by_default_on_an_entity_without_sessions() -> None:
    assert ServiceBusConfig(connection_string=CS, queue="q").receivers == 2
    assert ServiceBusConfig(connection_string=CS, queue="q", receivers=8).receivers == 8
