"""The dead-letter step's counts and words, and a connector's error map (no broker)."""

from __future__ import annotations

import asyncio

import pytest

from acklane.core.connectors import Action, ErrorMap
from acklane.core.connectors.deadletter import DeadLetterStep
from acklane.core.errors import (
    AdvanceError,
    BrokerAuthError,
    BrokerUnreachable,
    ConnectorError,
    DeadLetterRefused,
    ReceiveError,
)


def step(destination: str | None = "dlq") -> DeadLetterStep:
    return DeadLetterStep("SQS", "queue-a", destination, "dead_letter_queue_url")


def test_a_reject_without_a_destination_is_counted_dropped_naming_the_setting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    steps = step(None)
    steps.drop("m1", "bad order")
    assert steps.counters()[Action.DROPPED] == 1
    assert "DROPPED" in caplog.text and "dead_letter_queue_url" in caplog.text


def test_a_copy_too_large_is_counted_refused_and_the_error_names_what_to_raise() -> None:
    steps = step()
    error = steps.too_large("m1", 300_000, 262_144, raise_=["the MaximumMessageSize of dlq"])
    assert isinstance(error, DeadLetterRefused) and isinstance(error, AdvanceError)
    assert error.settings == ("the MaximumMessageSize of dlq",)
    assert "300000 bytes" in str(error) and "262144" in str(error)
    assert steps.counters()[Action.DEAD_LETTER_REFUSED] == 1


def test_a_copy_that_landed_is_counted_dead_lettered() -> None:
    steps = step()
    steps.copied("m1", "bad")
    assert steps.counters()[Action.DEAD_LETTERED] == 1


def test_a_copy_that_failed_otherwise_is_an_advance_error() -> None:
    assert isinstance(step().failed("m1", "throttled"), AdvanceError)


class SdkDenied(Exception):
    pass


class SdkDown(Exception):
    pass


class Map(ErrorMap):
    broker = "Test"

    def refusal(self, exc: BaseException, where: str) -> BrokerAuthError | None:
        if isinstance(exc, SdkDenied):
            return BrokerAuthError(f"Test {where}: denied", settings=("password",))
        return None

    def unreachable(self, exc: BaseException) -> bool:
        return isinstance(exc, SdkDown)


@pytest.mark.parametrize(
    ("raised", "kind"),
    [
        (SdkDenied(), BrokerAuthError),
        (SdkDown("refused"), BrokerUnreachable),
        (ValueError("odd"), AdvanceError),
    ],
)
def test_an_sdk_error_is_raised_as_its_kind_with_the_sdk_error_as_its_cause(
    raised: Exception, kind: type[ConnectorError]
) -> None:
    with pytest.raises(kind) as info, Map().advancing("deleting"):
        raise raised
    assert info.value.__cause__ is raised


def test_a_receive_maps_other_errors_to_a_receive_error_saying_where() -> None:
    with pytest.raises(ReceiveError, match="Test receiving: odd"), Map().receiving("receiving"):
        raise ValueError("odd")


def test_acklane_errors_and_cancellations_pass_through_unchanged() -> None:
    already = AdvanceError("mapped")
    assert Map().map(already, "x") is already
    cancelled = asyncio.CancelledError()
    assert Map().map(cancelled, "x") is cancelled


def test_unreachable_and_mapped_unreachable_errors_are_transient() -> None:
    assert Map().transient(SdkDown()) and Map().transient(BrokerUnreachable("x"))
    assert not Map().transient(ValueError())
