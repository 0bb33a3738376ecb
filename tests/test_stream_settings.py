"""Triggers that share a stream key must agree on the stream's other settings.

A group's producer is built from its first subscriber's kwargs: a trigger joining
with another dead-letter topic, other credentials or other poll tuning would run
silently with the first one's. A trigger class that implements
``shared_stream_settings()`` has such a trigger refused by ``subscribe``, naming the
triggers and the differing fields, never their values.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import pytest
from engine_harness import AckTrigger, Upstream, Watcher, settle
from pydantic import BaseModel, ConfigDict, SecretStr

from acklane.core import SharedStreamManager
from acklane.core.testing import eventually


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True)

    dead_letter: str | None = None
    poll_timeout: float = 0.1
    password: SecretStr | None = None


class Configured(AckTrigger):
    """A trigger whose stream settings are a pydantic model, like Kafka's and SQS's."""

    def __init__(self, upstream: str, **settings: Any) -> None:
        super().__init__(upstream)
        self.settings = settings

    def shared_stream_settings(self) -> Settings:
        return Settings(**self.settings)


#: ``up``, ``manager`` and ``stop_watchers``: engine_harness's, through the conftest.
pytestmark = pytest.mark.usefixtures("stop_watchers")


async def _join(manager: SharedStreamManager, trigger_id: str, trigger: AckTrigger) -> None:
    """Subscribe and pull once: what ``subscribe`` refuses, it refuses there."""
    it = manager.subscribe(trigger_id=trigger_id, trigger=trigger, key=trigger.shared_stream_key())
    try:
        async with asyncio.timeout(0.2):
            await anext(it)
    except TimeoutError:
        pass  # joined; no event to pull
    finally:
        await it.aclose()


async def test_a_trigger_with_other_settings_is_refused_naming_the_triggers_and_fields(
    manager: SharedStreamManager, up: Upstream
) -> None:
    first = Watcher(manager, "orders-audit", Configured(up.name, dead_letter="orders.dlq")).start()
    await settle()
    joiner = Configured(up.name, dead_letter="orders.dead", poll_timeout=0.5)
    with pytest.raises(ValueError) as caught:
        await _join(manager, "orders-billing", joiner)
    text = str(caught.value)
    assert "trigger orders-billing reads the same upstream as trigger orders-audit" in text
    assert "different settings (dead_letter, poll_timeout)" in text
    assert "orders.dead" not in text and "0.5" not in text  # names, never values
    # the refused trigger never joined: the first one runs on
    assert [tid for (_, tid) in manager.queue_depths()] == ["orders-audit"]
    up.push(1)
    await eventually(lambda: first.events == [1] and len(up.items) == 1)
    assert up.factory_calls == 1


async def test_a_differing_secret_is_named_and_its_values_never_printed(
    manager: SharedStreamManager, up: Upstream
) -> None:
    Watcher(manager, "a", Configured(up.name, password="hunter2")).start()
    await settle()
    with pytest.raises(ValueError, match=r"different settings \(password\)") as caught:
        await _join(manager, "b", Configured(up.name, password="swordfish"))
    assert "hunter2" not in str(caught.value) and "swordfish" not in str(caught.value)


async def test_equal_settings_share_one_poll(manager: SharedStreamManager, up: Upstream) -> None:
    a = Watcher(manager, "a", Configured(up.name, dead_letter="d", password="p")).start()
    b = Watcher(manager, "b", Configured(up.name, dead_letter="d", password="p")).start()
    await settle()
    up.push(1)
    await eventually(lambda: a.events == [1] and b.events == [1] and len(up.items) == 1)
    assert a.error is None and b.error is None
    assert up.factory_calls == 1


async def test_triggers_without_settings_are_not_checked(
    manager: SharedStreamManager, up: Upstream
) -> None:
    # Airflow's triggers have no shared_stream_settings: unchanged, the first one's
    # kwargs build the producer.
    class Other(AckTrigger):
        def __init__(self, upstream: str, tuning: int) -> None:
            super().__init__(upstream)
            self.tuning = tuning

    a = Watcher(manager, "a", Other(up.name, 1)).start()
    b = Watcher(manager, "b", Other(up.name, 2)).start()
    c = Watcher(manager, "c", Configured(up.name, dead_letter="x")).start()  # first has none
    await settle()
    up.push(1)
    await eventually(lambda: len(up.items) == 1)
    assert a.events == b.events == c.events == [1]
    assert up.factory_kwargs == [{"upstream": up.name, "tuning": 1}]


async def test_the_founders_settings_hold_after_it_left(
    manager: SharedStreamManager, up: Upstream
) -> None:
    # The producer was built from the founder's kwargs: they stay the group's settings.
    founder = Watcher(manager, "founder", Configured(up.name, dead_letter="one")).start()
    Watcher(manager, "stays", Configured(up.name, dead_letter="one")).start()
    await settle()
    await founder.stop()
    with pytest.raises(ValueError, match="as trigger founder"):
        await _join(manager, "late", Configured(up.name, dead_letter="two"))


@dataclass(frozen=True)
class Tuning:
    batch: int
    wait: float


async def test_dataclass_and_mapping_settings_name_their_fields(
    manager: SharedStreamManager, up: Upstream
) -> None:
    class WithDataclass(AckTrigger):
        def __init__(self, upstream: str, tuning: Tuning) -> None:
            super().__init__(upstream)
            self._tuning = tuning

        def shared_stream_settings(self) -> Hashable:
            return self._tuning

    Watcher(manager, "a", WithDataclass(up.name, Tuning(10, 1.0))).start()
    await settle()
    with pytest.raises(ValueError, match=r"different settings \(wait\)"):
        await _join(manager, "b", WithDataclass(up.name, Tuning(10, 2.0)))

    up2 = Upstream(f"up-{uuid.uuid4().hex[:8]}")

    class WithMapping(AckTrigger):
        def __init__(self, upstream: str, settings: dict[str, Any]) -> None:
            super().__init__(upstream)
            self._settings = settings

        def shared_stream_settings(self) -> object:
            return self._settings

    Watcher(manager, "c", WithMapping(up2.name, {"dlq": "x", "batch": 1})).start()
    await settle()
    with pytest.raises(ValueError, match=r"different settings \(dlq, region\)"):
        await _join(manager, "d", WithMapping(up2.name, {"dlq": "y", "batch": 1, "region": "r"}))


# -- the connectors' trigger classes (constructed only: no broker is reached) ----------


async def test_kafka_triggers_with_other_dead_letter_topics_are_refused_before_anything_connects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # _producer and _dlq: where the Kafka client classes are looked up (the consumer's,
    # the dead-letter producer's), patched so none is created
    from acklane.connectors.kafka import KafkaMessageTrigger, _dlq, _producer

    made: list[str] = []

    def refuse(kind: str) -> Any:
        def make(*args: Any, **kwargs: Any) -> Any:
            made.append(kind)
            raise AssertionError(f"a Kafka {kind} was created")

        return make

    monkeypatch.setattr(_producer, "Consumer", refuse("consumer"))
    monkeypatch.setattr(_dlq, "Producer", refuse("producer"))
    common: dict[str, Any] = {
        "bootstrap_servers": "127.0.0.1:9",
        "topics": ["orders"],
        "group_id": "g",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN",
        "sasl_username": "u",
    }
    audit = KafkaMessageTrigger(**common, dead_letter="orders.dlq", sasl_password="s3cret-one")
    billing = KafkaMessageTrigger(**common, dead_letter="orders.dead", sasl_password="s3cret-two")
    assert audit.shared_stream_key() == billing.shared_stream_key()
    # a long grace period: the first group's poll (the consumer) never starts in this test
    manager = SharedStreamManager(ack_timeout=30.0, cohort_grace_period=60.0)
    try:
        Watcher(manager, "audit", audit).start()
        await settle()
        with pytest.raises(ValueError) as caught:
            await _join(manager, "billing", billing)
    finally:
        await manager.stop_all()
        await Watcher.stop_everyone()
    text = str(caught.value)
    assert "trigger billing reads the same upstream as trigger audit" in text
    assert "(dead_letter, sasl_password)" in text
    assert "s3cret" not in text and "orders.dead" not in text
    assert made == []


async def test_sqs_triggers_with_other_credentials_are_refused_without_printing_them() -> None:
    from acklane.connectors.sqs import SqsMessageTrigger

    queue = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"
    key_id = "AKIAEXAMPLE"
    first = SqsMessageTrigger(
        queue_url=queue, aws_access_key_id=key_id, aws_secret_access_key="secret-one"
    )
    other = SqsMessageTrigger(
        queue_url=queue,
        aws_access_key_id=key_id,
        aws_secret_access_key="secret-two",
        wait_time_seconds=5,
    )
    same = SqsMessageTrigger(
        queue_url=queue, aws_access_key_id=key_id, aws_secret_access_key="secret-one"
    )
    assert first.shared_stream_key() == other.shared_stream_key()
    assert first.shared_stream_settings() == same.shared_stream_settings()
    manager = SharedStreamManager(ack_timeout=30.0, cohort_grace_period=60.0)
    try:
        Watcher(manager, "first", first).start()
        Watcher(manager, "same", same).start()
        await settle()
        with pytest.raises(ValueError) as caught:
            await _join(manager, "other", other)
    finally:
        await manager.stop_all()
        await Watcher.stop_everyone()
    text = str(caught.value)
    assert "trigger other reads the same upstream as trigger first" in text
    assert "(aws_secret_access_key, wait_time_seconds)" in text
    assert "secret-" not in text


async def test_configured_watchers_built_in_python_are_checked_too(
    manager: SharedStreamManager,
) -> None:
    # The YAML loader refuses two stream blocks of one upstream with different settings;
    # WatcherTrigger implements the hook, so one built by hand is refused as well.
    from acklane.connectors.memory import MemoryBroker
    from acklane.core.pipeline.watcher import WatcherTrigger

    broker = f"b-{uuid.uuid4().hex[:8]}"
    try:

        def watcher(name: str, dlq: str) -> WatcherTrigger:
            config = {"broker": broker, "topics": ["t"], "group_id": "g", "dead_letter": dlq}
            return WatcherTrigger(
                name=name, stream="s", connector="memory", connector_config=config
            )

        Watcher(manager, "a", watcher("a", "t.dlq")).start()
        await settle()
        with pytest.raises(ValueError, match=r"trigger b .* \(dead_letter\)"):
            await _join(manager, "b", watcher("b", "t.dead"))
    finally:
        MemoryBroker.remove(broker)
