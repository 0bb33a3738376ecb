"""Chaos: ``acklane run`` SIGKILLed at random moments loses no trigger event, stores none twice.

The code is ``bench/chaos.py`` (also a command: ``uv run python bench/chaos.py``),
loaded here from its path: ``bench/`` is a folder of scripts, not a package, and
the chaos run is a benchmark-style driver (emulator, subprocesses, kills), not
a library the connectors should ship. One copy of it serves both.

Marked ``chaos``: not part of the default ``uv run pytest`` (see ``addopts`` in
pyproject.toml); ``.ci/run`` runs them in their own step, ``uv run pytest -m chaos``.
The seed is random unless ``ACKLANE_CHAOS_SEED`` is set; a failure prints it,
with the timeline of kills and the runner's log, and
``uv run python bench/chaos.py --brokers BROKER --seed SEED --messages 80 --kills 5``
runs the same plan again (the kill moments are timing-dependent, so a plan
reproduces a failure often, not always).
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest

CHAOS_FILE = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"


def load_chaos() -> ModuleType:
    name = "acklane_bench_chaos"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, CHAOS_FILE)
    assert spec is not None and spec.loader is not None, CHAOS_FILE
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


chaos = load_chaos()

MESSAGES = 80
KILLS = 5
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
