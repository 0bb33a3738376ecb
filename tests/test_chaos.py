"""Chaos: ``acklane run`` SIGKILLed at random moments loses no trigger event, stores none twice.

The code is ``acklane.integration.chaos`` (also a command: ``uv run python bench/chaos.py``),
imported here: the integration package ships it beside the emulators it drives, so a
user's own CI can run it too, and ``bench/chaos.py`` is only its command-line entry.

Marked ``chaos``: not part of the default ``uv run pytest`` (see ``addopts`` in
pyproject.toml); ``.ci/run`` runs them in their own step, ``uv run pytest -m chaos``.
The seed is random unless ``ACKLANE_CHAOS_SEED`` is set; a failure prints it,
with the timeline of kills and the runner's log, and
``uv run python bench/chaos.py --brokers BROKER --seed SEED --messages 80 --kills 5``
runs the same plan again (the kill moments are timing-dependent, so a plan
reproduces a failure often, not always).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from acklane.integration import chaos

MESSAGES = 80
KILLS = 5
#: the webhook-sink runs (smaller: each broker runs both)
SINK_MESSAGES = 40
SINK_KILLS = 3
#: the run's own bound on every wait (the test's timeout is above it)
RUN_TIMEOUT = 150.0

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]


def chaos_seed() -> int:
    value = os.environ.get("ACKLANE_CHAOS_SEED")
    return int(value) if value else random.randrange(2**31)


@pytest.mark.parametrize("broker", sorted(chaos.ADAPTERS))
def test_sigkilled_runner_loses_no_event_and_stores_none_twice(
    broker: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    emulator = request.getfixturevalue(f"{broker}_emulator")
    seed = chaos_seed()
    result = chaos.run_broker(
        broker,
        emulator,
        messages=MESSAGES,
        kills=KILLS,
        seed=seed,
        timeout=RUN_TIMEOUT,
        workdir=tmp_path,
    )
    print(result.line())
    print(result.explain(log=False))
    assert result.kills == KILLS
    assert (result.lost, result.dup, result.dlq_missing) == (0, 0, 0), result.explain()
    assert not result.problems, result.explain()


def test_sigkilled_runner_on_the_generator_path_loses_no_event(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The same chaos with ``engine.inline_filters: false`` (each declarative watcher a
    generator in its own task), on Kafka: both filter paths survive the kills."""
    emulator = request.getfixturevalue("kafka_emulator")
    seed = chaos_seed()
    result = chaos.run_broker(
        "kafka",
        emulator,
        messages=MESSAGES,
        kills=KILLS,
        seed=seed,
        timeout=RUN_TIMEOUT,
        workdir=tmp_path,
        inline_filters=False,
    )
    print(result.line())
    print(result.explain(log=False))
    assert result.kills == KILLS
    assert (result.lost, result.dup, result.dlq_missing) == (0, 0, 0), result.explain()
    assert not result.problems, result.explain()


@pytest.mark.parametrize("broker", sorted(chaos.ADAPTERS))
def test_sigkilled_runner_delivers_every_event_to_a_webhook_sink(
    broker: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The same chaos with a webhook sink on every watcher: the kills fall during
    deliveries too, and the receiver still gets every stored event (repeats allowed:
    at least once, with the same idempotency key)."""
    emulator = request.getfixturevalue(f"{broker}_emulator")
    seed = chaos_seed()
    result = chaos.run_broker(
        broker,
        emulator,
        messages=SINK_MESSAGES,
        kills=SINK_KILLS,
        seed=seed,
        timeout=RUN_TIMEOUT,
        workdir=tmp_path,
        sink="webhook",
    )
    print(result.line())
    print(result.explain(log=False))
    assert result.kills == SINK_KILLS
    assert (result.lost, result.dup, result.dlq_missing) == (0, 0, 0), result.explain()
    assert result.sink_lost == 0, result.explain()
    assert not result.problems, result.explain()
