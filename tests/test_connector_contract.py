"""The connector contract in core: one verdict, one dead-letter vocabulary, one set of
action names, one config coercion and one trigger class for every connector."""

from __future__ import annotations

import importlib.util
from collections.abc import Hashable
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from acklane.connectors.kafka import KafkaConfig, KafkaConnector, KafkaMessageTrigger
from acklane.connectors.kafka import KafkaStreamProducer as KafkaProducer
from acklane.connectors.memory import (
    MemoryBroker,
    MemoryConfig,
    MemoryConnector,
    MemoryStreamProducer,
)
from acklane.connectors.sqs import (
    DEAD_LETTER_ATTRIBUTES,
    SqsConfig,
    SqsConnector,
    SqsMessageTrigger,
    SqsStreamProducer,
)
from acklane.core.connectors import (
    Action,
    Connector,
    ConnectorTrigger,
    Verdict,
    deadletter,
    load_connector,
    verdict,
)
from acklane.core.pipeline.watcher import WatcherTrigger
from acklane.core.producer import AdvanceOutcome, SharedStreamProducer

KAFKA = {"bootstrap_servers": "127.0.0.1:9092", "topics": ["orders"], "group_id": "g"}
SQS = {"queue_url": "http://127.0.0.1:4566/000000000000/orders", "region": "us-east-1"}


# -- the verdict -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("acked", "failed", "rejected", "expected"),
    [
        (1, 0, 0, Verdict.COMMIT),
        (3, 0, 0, Verdict.COMMIT),
        (0, 0, 1, Verdict.DEAD_LETTER),
        (2, 0, 1, Verdict.DEAD_LETTER),
        (1, 1, 0, Verdict.REDELIVER),
        (0, 1, 1, Verdict.REDELIVER),  # a failure outweighs a rejection
        (0, 0, 0, Verdict.REDELIVER),  # nobody received it
    ],
)
def test_the_verdict_of_an_outcome(
    acked: int, failed: int, rejected: int, expected: Verdict
) -> None:
    outcome = AdvanceOutcome(acked, failed, rejected)
    assert verdict(outcome) is expected
    assert (verdict(outcome) is Verdict.COMMIT) == outcome.is_clean


# -- the dead-letter vocabulary ------------------------------------------------------------


def test_dead_letter_names_are_defined_once_under_acklane_origin_and_reject() -> None:
    origins = [
        deadletter.ORIGIN_TOPIC,
        deadletter.ORIGIN_PARTITION,
        deadletter.ORIGIN_OFFSET,
        deadletter.ORIGIN_GROUP,
        deadletter.ORIGIN_QUEUE,
        deadletter.ORIGIN_MESSAGE_ID,
    ]
    assert all(name.startswith(deadletter.ORIGIN_PREFIX) for name in origins)
    assert deadletter.ORIGIN_PREFIX == "acklane.origin."
    assert deadletter.REJECT_REASON == "acklane.reject.reason"
    assert DEAD_LETTER_ATTRIBUTES == (
        deadletter.ORIGIN_QUEUE,
        deadletter.ORIGIN_MESSAGE_ID,
        deadletter.REJECT_REASON,
    )


def test_the_reason_of_an_outcome_is_bounded_and_has_a_default() -> None:
    assert deadletter.outcome_reason(AdvanceOutcome(0, 0, 2)) == "rejected by 2 watchers"
    long = AdvanceOutcome(0, 0, 1, reject_reasons=("x" * 5000,))
    text = deadletter.outcome_reason(long)
    assert len(text.encode()) <= deadletter.REASON_MAX_BYTES
    assert text.endswith(deadletter.TRUNCATED_MARK)


def test_log_origin_names_topic_partition_and_offset() -> None:
    assert dict(deadletter.log_origin("t", 2, 7)) == {
        "acklane.origin.topic": "t",
        "acklane.origin.partition": "2",
        "acklane.origin.offset": "7",
    }


# -- the action vocabulary -----------------------------------------------------------------


def _producers() -> list[SharedStreamProducer]:
    name = "contract-actions"
    MemoryBroker.get(name)
    return [
        MemoryStreamProducer(MemoryConfig(broker=name, topics=["t"])),
        KafkaProducer(KafkaConfig.model_validate(KAFKA)),
        SqsStreamProducer(SqsConfig.model_validate(SQS)),
    ]


def test_every_connector_counts_only_in_the_action_vocabulary() -> None:
    try:
        for producer in _producers():
            counters = producer.counters()
            assert counters, type(producer).__name__
            assert set(counters) <= {a.value for a in Action}, type(producer).__name__
    finally:
        MemoryBroker.remove("contract-actions")


def test_action_names_are_one_word_each() -> None:
    values = [a.value for a in Action]
    assert len(values) == len(set(values))
    assert "redeliveries" not in values and "commits" not in values


# -- the connector -------------------------------------------------------------------------


class ToyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    url: str
    queue: str
    batch_size: int = 10


class ToyProducer(SharedStreamProducer):
    def __init__(self, config: ToyConfig) -> None:
        self.config = config

    async def open_stream(self) -> Any:  # pragma: no cover - never opened here
        raise NotImplementedError
        yield

    async def advance(self, batch: Any) -> None:  # pragma: no cover
        pass


class ToyConnector(Connector[ToyConfig]):
    name = "toy"
    config_model = ToyConfig

    @classmethod
    def key(cls, config: ToyConfig) -> tuple[Hashable, ...]:
        return (config.url, config.queue)

    @classmethod
    def producer(cls, config: ToyConfig) -> ToyProducer:
        return ToyProducer(config)


class ToyTrigger(ConnectorTrigger[ToyConfig]):
    connector_class = ToyConnector


def test_a_connector_coerces_a_model_or_a_mapping_of_its_fields() -> None:
    config = ToyConfig(url="u", queue="q")
    assert ToyConnector.config(config) is config
    assert ToyConnector.config({"url": "u", "queue": "q", "mine": 1}) == config  # others ignored
    with pytest.raises(ValidationError):
        ToyConnector.config({"url": "u"})
    with pytest.raises(TypeError, match="expected a ToyConfig or a mapping"):
        ToyConnector.config(["u", "q"])  # type: ignore[arg-type]


def test_a_connector_derives_key_producer_and_description_from_either_form() -> None:
    fields = {"url": "u", "queue": "q", "batch_size": 5}
    assert ToyConnector.stream_key(fields) == ("u", "q")
    producer = ToyConnector.create_producer(fields)
    assert isinstance(producer, ToyProducer) and producer.config.batch_size == 5
    assert ToyConnector.describe(ToyConfig(url="u", queue="q")) == "toy ('u', 'q')"


@pytest.mark.parametrize(
    ("connector", "fields"),
    [(KafkaConnector, KAFKA), (SqsConnector, SQS), (MemoryConnector, {"topics": ["t"]})],
)
def test_every_connector_keys_and_describes_a_model_and_its_fields_alike(
    connector: type[Connector], fields: dict[str, Any]
) -> None:
    config = connector.config_model.model_validate(fields)
    assert connector.stream_key(config) == connector.stream_key({**fields, "unrelated": 1})
    assert connector.describe(config) == connector.describe(fields)
    assert load_connector(connector.name) is connector


# -- the trigger ---------------------------------------------------------------------------


def test_a_trigger_validates_at_construction_and_keeps_its_own_kwargs() -> None:
    with pytest.raises(ValidationError):
        ToyTrigger(url="u")
    trigger = ToyTrigger(url="u", queue="q", label="mine")
    assert trigger.stream_config() == ToyConfig(url="u", queue="q")
    assert trigger.shared_stream_key() == ("u", "q")
    assert trigger.shared_stream_settings() == trigger.stream_config()
    assert trigger.serialize()[1] == {"url": "u", "queue": "q", "label": "mine"}
    producer = ToyTrigger.create_shared_stream_producer(trigger.serialize()[1])
    assert isinstance(producer, ToyProducer)


@pytest.mark.parametrize(
    ("trigger_class", "fields", "bad"),
    [
        (KafkaMessageTrigger, KAFKA, {**KAFKA, "topics": []}),
        (SqsMessageTrigger, SQS, {"region": "us-east-1"}),
    ],
)
def test_kafka_and_sqs_triggers_validate_at_construction_and_share_helpers(
    trigger_class: type[ConnectorTrigger[Any]], fields: dict[str, Any], bad: dict[str, Any]
) -> None:
    with pytest.raises(ValidationError):
        trigger_class(**bad)
    trigger = trigger_class(**fields, own_field="kept")
    connector = trigger_class.connector_class
    assert trigger.stream_config() == connector.config(fields)
    assert trigger.shared_stream_key() == connector.stream_key(fields)
    assert trigger.shared_stream_settings() == trigger.stream_config()
    producer = trigger_class.create_shared_stream_producer(trigger.serialize()[1])
    assert producer.config == trigger.stream_config()  # type: ignore[attr-defined]


def test_a_yaml_watcher_validates_its_block_at_construction() -> None:
    with pytest.raises(ValidationError):
        WatcherTrigger(name="w", stream="s", connector="memory", connector_config={"topics": []})
    with pytest.raises(ValidationError):  # the block is the whole config: no unknown keys
        WatcherTrigger(
            name="w", stream="s", connector="memory", connector_config={"topics": ["t"], "x": 1}
        )
    watcher = WatcherTrigger(
        name="w", stream="s", connector="memory", connector_config={"topics": ["t"]}
    )
    assert watcher.shared_stream_key() == ("acklane", "memory", "default", ("t",), "acklane")
    assert watcher.stream_config() == MemoryConfig(topics=["t"])
    producer = WatcherTrigger.create_shared_stream_producer(watcher.serialize()[1])
    assert isinstance(producer, MemoryStreamProducer)


def test_the_memory_connector_lives_with_the_others() -> None:
    assert MemoryConnector.__module__.startswith("acklane.connectors.memory")
    assert importlib.util.find_spec("acklane.core.connectors.memory") is None
