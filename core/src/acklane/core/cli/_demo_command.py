"""``acklane demo``: the command line around :mod:`.demo` (which runs the demo itself).

Its ``--broker`` help lists the registered demo brokers, so the command is built when
asked for (:mod:`._commands`), not when the CLI starts. Exit 2 for a broker that is
not known, 1 when the demo failed (one line; the traceback at DEBUG), else the demo's
own code.
"""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from ..observe.logs import LogLevel
from ._exit import FAILED, USAGE, error, fail, stderr
from ._logging import setup_logging
from ._plugins import DEMO_BROKERS_GROUP, demo_broker_names

__all__ = ["demo_app"]

log = logging.getLogger("acklane.core.cli.app")


def demo_app() -> typer.Typer:
    """A Typer holding ``acklane demo``."""
    holder = typer.Typer()

    @holder.command("demo")
    def demo(
        messages: Annotated[int, typer.Option(min=6, max=500, help="How many messages.")] = 24,
        broker: Annotated[
            str,
            typer.Option(
                help="auto: the first registered demo broker that can start (a Kafka emulator "
                "with acklane-integration), else the in-process broker; memory: the in-process "
                f"broker; or a registered one (entry points {DEMO_BROKERS_GROUP}). "
                f"Known: {', '.join(demo_broker_names())}.",
            ),
        ] = "auto",
        log_level: Annotated[
            LogLevel | None,
            typer.Option(
                "--log-level",
                case_sensitive=False,
                help="Default WARNING; DEBUG shows the broker's logs too.",
                show_default=False,
            ),
        ] = None,
    ) -> None:
        """Run a demo pipeline on embedded defaults and show what becomes of each message."""
        _run_demo(messages, broker, log_level)

    return holder


def _run_demo(messages: int, broker: str, log_level: LogLevel | None) -> None:
    setup_logging(log_level, LogLevel.WARNING)
    known = demo_broker_names()
    if broker not in known:
        from .extras import SIBLING_DEMO_BROKERS, missing_demo_broker

        if broker in SIBLING_DEMO_BROKERS:
            fail(f"--broker {broker}: {missing_demo_broker(broker)}", USAGE)
        fail(f"--broker {broker!r}: no such demo broker (known: {', '.join(known)})", USAGE)
    import asyncio

    from rich.console import Console
    from rich.text import Text

    from .demo import UnknownDemoBroker, run_demo

    try:
        code = asyncio.run(run_demo(messages, Console(), broker))
    except UnknownDemoBroker as exc:
        fail(str(exc), USAGE)
    except Exception as exc:
        log.debug("acklane demo --broker %s failed", broker, exc_info=True)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        error(f"acklane demo --broker {broker} failed: {type(exc).__name__}: {first}")
        stderr().print(Text("(--log-level DEBUG shows the traceback)", style="dim"))
        raise typer.Exit(FAILED) from None
    raise typer.Exit(code)
