"""The ``acklane`` command line: run, validate, demo, events, store, emulator."""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

if TYPE_CHECKING:
    from .runner import Runner

log = logging.getLogger("acklane.core.cli")


class _StartupSignals:
    """SIGINT/SIGTERM while ``acklane run`` starts, before the runner's own handlers.

    Importing the CLI's dependencies, loading the configuration (which imports the
    connectors and the filter modules) and building the runner take seconds, in which
    the default dispositions would kill the process (exit 143) or raise
    KeyboardInterrupt. A signal there is remembered and handed to the runner, which
    then stops before it starts anything (exit 0); a second one exits at once, with
    128 + the signal's number (nothing is in flight yet: nothing is lost).
    """

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self.runner: Runner | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def install(self) -> None:
        if self._previous:
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        """Put back the handlers that were there before :meth:`install`."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        runner = self.runner
        if runner is not None and not runner.stopping:
            # the runner exists, but its event loop has not taken the signals over yet
            self.received = signal.Signals(signum)
            runner.request_stop()
            return
        if self.received is not None:
            # a second signal during start-up: leave now (nothing is in flight yet)
            log.warning("Second signal during start-up: exiting now")
            raise SystemExit(128 + signum)
        self.received = signal.Signals(signum)

    def hand_over(self, runner: Runner) -> None:
        """From now on a signal stops ``runner``; one received already stops it now."""
        self.runner = runner
        if self.received is not None:
            log.info("%s during start-up: stopping before the pipeline starts", self.received.name)
            runner.request_stop()


def _running_the_pipeline() -> bool:
    """True in the process of an ``acklane run`` command line (not when imported by others)."""
    main = __name__ == "__main__" or Path(sys.argv[0]).stem == "acklane"
    return main and sys.argv[1:2] == ["run"]


# Before anything slow is imported: `acklane run` takes the signals over from here on.
_startup: _StartupSignals | None = None
if _running_the_pipeline():
    _startup = _StartupSignals()
    _startup.install()

import asyncio  # noqa: E402 - after the signal handlers, on purpose

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.logging import RichHandler  # noqa: E402
from rich.table import Table  # noqa: E402

# The configuration (and what it imports: pydantic, SQLAlchemy, connectors) is imported
# when a command needs it, not with this module.

app = typer.Typer(
    name="acklane",
    help="Consume message queues for event-driven pipelines without losing a message.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)

ConfigArg = Annotated[Path, typer.Argument(help="The pipeline's YAML configuration.")]
LogLevel = Annotated[str, typer.Option("--log-level", help="DEBUG, INFO, WARNING or ERROR.")]


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(message)s",
        datefmt="[%X]",
        handlers=[RichHandler(console=err_console, rich_tracebacks=False, show_path=False)],
    )


def _load(path: Path):  # type: ignore[no-untyped-def]
    from .config import ConfigError, load_config

    try:
        return load_config(path)
    except ConfigError as exc:
        err_console.print(f"[red]invalid configuration[/]\n{exc}")
        raise typer.Exit(2) from None
    except OSError as exc:
        err_console.print(f"[red]cannot read {path}[/]: {exc.strerror or exc}")
        raise typer.Exit(2) from None


@app.command()
def validate(config: ConfigArg) -> None:
    """Check a configuration: every problem names the file, the line and the field."""
    cfg = _load(config)
    table = Table(title=f"{config}: valid")
    table.add_column("watcher")
    table.add_column("stream")
    table.add_column("shared poll (connector and key)")
    table.add_column("asset")
    for w in cfg.watchers:
        stream = cfg.streams[w.stream]
        table.add_row(w.name, w.stream, stream.describe(), w.asset or "-")
    console.print(table)
    keys = {cfg.streams[w.stream].key for w in cfg.watchers}
    console.print(
        f"{len(cfg.watchers)} watchers share {len(keys)} upstream poll(s); "
        f"events stored in {cfg.store.url}"
    )


@app.command()
def run(config: ConfigArg, log_level: LogLevel = "INFO") -> None:
    """Run the pipeline until SIGINT/SIGTERM, then shut down gracefully."""
    global _startup
    startup, _startup = _startup or _StartupSignals(), None
    startup.install()  # first (a no-op when the module did it as it was imported)
    try:
        _setup_logging(log_level)
        log.info("Starting the pipeline of %s", config)
        cfg = _load(config)
        from .metrics import start_metrics_server
        from .runner import Runner

        runner = Runner(cfg)
        startup.hand_over(runner)
        if cfg.metrics.port is not None and not runner.stopping:
            start_metrics_server(cfg.metrics.port, runner)
        asyncio.run(runner.run())
    finally:
        startup.restore()


@app.command()
def demo(
    messages: Annotated[int, typer.Option(min=6, max=500, help="How many messages.")] = 24,
    broker: Annotated[
        str,
        typer.Option(
            help="auto: a Kafka emulator it starts itself, else the in-process broker; "
            "kafka; or memory."
        ),
    ] = "auto",
) -> None:
    """Run a demo pipeline on embedded defaults and show what becomes of each message."""
    from .demo import run_demo

    if broker not in ("auto", "kafka", "memory"):
        err_console.print(f"[red]--broker {broker!r}: expected auto, kafka or memory[/]")
        raise typer.Exit(2)
    raise typer.Exit(asyncio.run(run_demo(messages, console, broker)))


def _add_subcommands() -> None:
    from .cli_events import app as events_app
    from .cli_store import app as store_app

    app.add_typer(events_app, name="events", help="See the trigger events that fired.")
    app.add_typer(store_app, name="store", help="Read and write the task and asset stores.")
    try:
        from acklane.integration.cli import app as emulator_app
    except ImportError:  # acklane-integration is not installed
        return
    app.add_typer(emulator_app, name="emulator", help="Start a broker emulator for development.")


_add_subcommands()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
