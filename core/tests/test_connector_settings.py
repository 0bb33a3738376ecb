"""The settings every stream block shares (acklane.core.connectors.StreamSettings): one
name for one idea, old names still read with a warning that names the new one, and
the limits of each broker applied to the shared fields.

Pure logic: toy configurations, no broker. The real connectors' old names are loaded
from YAML in ``tests/test_vocabulary.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import pytest
from pydantic import Field, ValidationError

from acklane.core.connectors import (
    Connector,
    LeaseStreamSettings,
    RedeliveryBackoff,
    StreamSettings,
    deprecated_names,
    rename_fields,
)
from acklane.core.producer import SharedStreamProducer


class Toy(StreamSettings):
    renamed: ClassVar[Mapping[str, str]] = {
        "dlq": "dead_letter",
        "size": "batch_size",
        "beat": "heartbeat.interval",
    }
    broker_defaults: ClassVar[Mapping[str, Any]] = {"max_attempts": 3}

    batch_size: int = Field(default=10, ge=1)
    heartbeat: dict[str, float] = Field(default_factory=dict)


class ToyLease(LeaseStreamSettings):
    longest_lease: ClassVar[float] = 600
    broker_name: ClassVar[str] = "Toy"


def test_an_old_name_is_read_as_the_new_one_with_a_warning_naming_both() -> None:
    with pytest.warns(FutureWarning, match="dlq is deprecated, now called dead_letter"):
        config = Toy(dlq="orders.dlq")  # type: ignore[call-arg]
    assert config.dead_letter == "orders.dlq"


def test_the_warning_points_at_the_callers_line() -> None:
    with pytest.warns(FutureWarning) as caught:
        Toy.model_validate({"size": 5})
    assert caught[0].filename == __file__


def test_an_old_name_may_move_into_a_block_of_the_new_name() -> None:
    with pytest.warns(FutureWarning, match="now called heartbeat.interval"):
        config = Toy.model_validate({"beat": 2.5, "heartbeat": {"other": 1.0}})
    assert config.heartbeat == {"other": 1.0, "interval": 2.5}


@pytest.mark.parametrize(
    "data", [{"dlq": "a", "dead_letter": "b"}, {"beat": 1, "heartbeat": {"interval": 2}}]
)
def test_an_old_name_given_with_its_new_one_is_refused(data: dict[str, Any]) -> None:
    with pytest.warns(FutureWarning), pytest.raises(ValidationError, match="give only"):
        Toy.model_validate(data)


def test_rename_fields_reports_each_old_name_it_replaced() -> None:
    seen: list[tuple[str, str]] = []
    out = rename_fields(Toy, {"dlq": "d", "size": 2, "other": 1}, lambda o, n: seen.append((o, n)))
    assert out == {"dead_letter": "d", "batch_size": 2, "other": 1}
    assert seen == [("dlq", "dead_letter"), ("size", "batch_size")]
    assert deprecated_names(Toy) == Toy.renamed
    assert deprecated_names(RedeliveryBackoff) == {}  # not a stream block


def test_a_broker_default_applies_only_when_the_field_is_not_given() -> None:
    assert Toy().max_attempts == 3
    assert Toy(max_attempts=7).max_attempts == 7
    assert StreamSettings().max_attempts == 5


def test_an_empty_dead_letter_reads_as_none() -> None:
    assert StreamSettings(dead_letter="").dead_letter is None


def test_a_connector_reads_old_names_in_a_mapping_of_its_fields() -> None:
    class ToyConnector(Connector[Toy]):
        name = "toy"
        config_model = Toy

        @classmethod
        def key(cls, config: Toy) -> tuple[str, ...]:
            return ("toy",)

        @classmethod
        def producer(cls, config: Toy) -> SharedStreamProducer:
            raise NotImplementedError

    with pytest.warns(FutureWarning):
        config = ToyConnector.config({"dlq": "d", "unrelated": 1})
    assert config.dead_letter == "d"


# -- the lease brokers' settings -------------------------------------------------------------


def test_the_backoff_grows_with_the_attempt_up_to_its_cap() -> None:
    backoff = RedeliveryBackoff(base=2, multiplier=3, max=30)
    assert [backoff.delay(n) for n in (None, 1, 2, 3, 4, 100)] == [2, 2, 6, 18, 30, 30]
    assert RedeliveryBackoff().delay(7) == 0
    assert RedeliveryBackoff(base=1).delay(10_000) == 900  # no overflow: the default cap


def test_a_number_is_read_as_the_backoff_base() -> None:
    assert ToyLease.model_validate({"redelivery_backoff": 5}).redelivery_backoff.base == 5


def test_the_backoff_cap_defaults_to_900_s_or_the_brokers_limit_when_shorter() -> None:
    assert ToyLease().redelivery_backoff.max == 600
    assert LeaseStreamSettings().redelivery_backoff.max == 900
    assert ToyLease(redelivery_backoff=RedeliveryBackoff(max=60)).redelivery_backoff.max == 60


@pytest.mark.parametrize("field", ["base", "max"])
def test_a_backoff_longer_than_the_broker_can_delay_is_refused_naming_it(field: str) -> None:
    with pytest.raises(ValidationError, match=rf"redelivery_backoff\.{field} \(601\) is longer"):
        ToyLease.model_validate({"redelivery_backoff": {field: 601}})


def test_a_lease_hold_longer_than_the_broker_keeps_a_lease_is_refused() -> None:
    with pytest.raises(ValidationError, match="at most 600 seconds: Toy keeps a lease"):
        ToyLease(restart_lease_hold=601)
    assert ToyLease(restart_lease_hold=0).restart_lease_hold == 0


def test_the_advance_linger_is_five_seconds_at_most() -> None:
    with pytest.raises(ValidationError, match="advance_linger"):
        ToyLease(advance_linger=6)
