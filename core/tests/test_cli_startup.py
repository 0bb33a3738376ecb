"""`acklane` starts at once: each command imports only what it needs.

Each case runs the command line in a new interpreter and looks at what it imported
(``sys.modules`` once the command returned): timing it here would only measure the
machine's load (bench/README.md has the figures, with and without bytecode).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kafka.yaml"

RUN = """
import json, sys
sys.argv = ["acklane", *{args!r}]
from acklane.core.cli.app import app
try:
    app(standalone_mode=False)
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""

#: Modules no command's start-up needs: the command groups' own modules, the engine,
#: the configuration and the libraries behind them.
COMMAND_MODULES = (
    "acklane.core.cli.events",
    "acklane.core.cli.sinks",
    "acklane.core.cli.store",
    "acklane.core.cli.publish",
    "acklane.core.cli.demo",
    "acklane.core.cli.checks",
    "acklane.integration",
)
HEAVY = (
    *COMMAND_MODULES,
    "acklane.core.config",
    "acklane.core.manager",
    "acklane.core.pipeline",
    "acklane.core.events",
    "acklane.connectors.kafka",
    "asyncio",
    "confluent_kafka",
    "pydantic",
    "rich",
    "sqlalchemy",
    "yaml",
)


def _imported(*args: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", RUN.format(args=list(args))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def test_version_imports_nothing_heavy() -> None:
    modules = _imported("--version")
    assert "typer" in modules  # it ran
    assert _loaded(modules, HEAVY) == []


def test_validate_imports_no_other_command() -> None:
    modules = _imported("validate", str(EXAMPLE))
    assert "acklane.core.config" in modules  # it ran
    assert _loaded(modules, COMMAND_MODULES) == []
    # a store URL is checked without opening it: SQLAlchemy (the event store, the
    # state stores, the sink dispatcher) is not loaded at all
    assert _loaded(modules, ("sqlalchemy", "acklane.core.events", "aiosqlite")) == []


@pytest.mark.parametrize(
    ("command", "needs"),
    [
        # `events replay` is defined with the sinks commands
        ("events", ("acklane.core.cli.events", "acklane.core.cli.sinks")),
        ("emulator", ("acklane.integration",)),
    ],
)
def test_a_command_group_loads_when_it_runs(command: str, needs: tuple[str, ...]) -> None:
    modules = _imported(command, "--help")
    assert all(_loaded(modules, (n,)) for n in needs)
    others = tuple(m for m in COMMAND_MODULES if m not in needs)
    assert _loaded(modules, others) == []
