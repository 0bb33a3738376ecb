"""The README's promise: ``acklane demo`` runs to completion and shows every outcome.

Core knows only the memory broker; the Kafka, Pub/Sub and Service Bus ones come from
acklane-integration through the ``acklane.demos`` entry points. ``--broker auto`` tries
Kafka only, and falls back to memory only when no emulator can start (simulated by
pointing ``ACKLANE_TANSU_BIN`` at a missing file).
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from acklane.core.cli import app as cli
from acklane.core.cli.demo import (
    ENTRY_POINT_GROUP,
    DemoBroker,
    DemoBrokerUnavailable,
    MemoryDemoBroker,
    UnknownDemoBroker,
    demo_broker_names,
    load_demo_broker,
    run_demo,
)


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=140, force_terminal=False), out


@pytest.fixture
def no_tansu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No Kafka emulator can start: the local backend, and no tansu binary where it looks."""
    missing = tmp_path / "no-such-tansu"
    monkeypatch.setenv("ACKLANE_EMULATOR_BACKEND", "local")
    monkeypatch.setenv("ACKLANE_TANSU_BIN", str(missing))
    return missing


LABELS = {
    "memory": "in-process memory broker",
    "kafka": "Kafka emulator",
    "pubsub": "acklane's Pub/Sub emulator",
    "servicebus": "acklane's Service Bus emulator",
}


@pytest.mark.parametrize("broker", ["memory", "kafka", "pubsub", "servicebus"])
async def test_demo_finishes_and_shows_acked_dead_lettered_and_redelivered(broker: str) -> None:
    console, out = _console()
    assert await run_demo(24, console, broker) == 0
    text = out.getvalue()
    assert "acked ✓" in text
    assert "rejected → DLQ" in text
    assert "failed → redelivered" in text
    assert "2 in the DLQ" in text
    assert "'big-orders': 13, 'every-order': 22, 'audit': 23" in text  # duplicates dropped
    assert LABELS[broker] in text
    if broker in ("pubsub", "servicebus"):  # one queue: each message labelled 0/<publish order>
        assert "DLQ copy of 0/4: " in text
        assert "DLQ copy of 0/8: watcher every-order: reject rule matched" in text
        assert ": p0: 24/24" in text


def test_the_emulator_demo_brokers_are_registered_by_acklane_integration() -> None:
    assert cli.DEMO_BROKERS_GROUP == ENTRY_POINT_GROUP
    names = demo_broker_names()
    assert names[:2] == ["auto", "memory"]
    assert {"kafka", "pubsub", "servicebus"} <= set(names)
    assert load_demo_broker("memory") is MemoryDemoBroker
    for name in ("kafka", "pubsub", "servicebus"):
        cls = load_demo_broker(name)
        assert issubclass(cls, DemoBroker)
        assert cls.__module__.startswith("acklane.integration.")


def test_auto_tries_only_kafka_of_the_emulator_demo_brokers() -> None:
    assert load_demo_broker("kafka").auto_order is not None
    assert load_demo_broker("pubsub").auto_order is None
    assert load_demo_broker("servicebus").auto_order is None


async def test_an_unknown_broker_is_an_error_naming_the_known_ones() -> None:
    console, _ = _console()
    with pytest.raises(UnknownDemoBroker, match=r"'nope'.*known: auto, memory, .*kafka"):
        await run_demo(6, console, "nope")


def test_the_cli_refuses_an_unknown_broker_and_lists_the_known_ones() -> None:
    result = CliRunner().invoke(cli.app, ["demo", "--broker", "nope"])
    assert result.exit_code == 2
    assert "'nope'" in result.output
    assert "known: auto, memory, kafka" in result.output


async def test_auto_falls_back_to_memory_when_no_emulator_can_start(no_tansu: Path) -> None:
    console, out = _console()
    assert await run_demo(6, console, "auto") == 0
    text = out.getvalue()
    assert "cannot start a Kafka emulator (kafka)" in text
    assert str(no_tansu) in text  # why: the emulator's own error
    assert "on the in-process memory broker" in text
    assert "Pub/Sub" not in text and "Service Bus" not in text  # auto tries Kafka only
    assert "acked ✓" in text


async def test_an_explicit_kafka_broker_does_not_fall_back(no_tansu: Path) -> None:
    console, out = _console()
    with pytest.raises(DemoBrokerUnavailable, match="ACKLANE_TANSU_BIN"):
        await run_demo(6, console, "kafka")
    assert "memory broker" not in out.getvalue()


@pytest.fixture
def broken_kafka_demo(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The emulator starts, then the demo's setup fails (not an emulator start error).

    Returns the emulators started, to check they are stopped again.
    """
    from acklane.integration import demo_kafka

    started: list[object] = []
    real_emulator_for = demo_kafka.emulator_for

    def emulator_for(broker: str, backend: str | None = None, **options: object) -> object:
        emulator = real_emulator_for(broker, "local", **options)
        started.append(emulator)
        return emulator

    def new_topic(*args: object, **kwargs: object) -> str:
        raise RuntimeError("topic creation exploded\nsecond line")

    monkeypatch.setattr(demo_kafka, "emulator_for", emulator_for)
    monkeypatch.setattr(demo_kafka.KafkaKit, "new_topic", new_topic)
    return started


async def test_auto_surfaces_any_other_error(broken_kafka_demo: list[object]) -> None:
    console, out = _console()
    with pytest.raises(RuntimeError, match="topic creation exploded"):
        await run_demo(6, console, "auto")
    assert "memory broker" not in out.getvalue()
    assert [getattr(e, "running", None) for e in broken_kafka_demo] == [False]  # stopped


def test_the_cli_reports_another_error_in_one_line(broken_kafka_demo: list[object]) -> None:
    result = CliRunner().invoke(cli.app, ["demo", "--broker", "auto", "--messages", "6"])
    assert result.exit_code == 1
    assert "failed: RuntimeError: topic creation exploded" in result.output
    assert "second line" not in result.output
    assert "Traceback" not in result.output
    assert "memory broker" not in result.output
