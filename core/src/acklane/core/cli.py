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
from importlib.metadata import entry_points  # noqa: E402

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.logging import RichHandler  # noqa: E402
from rich.table import Table  # noqa: E402
from rich.text import Text  # noqa: E402

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


#: Entry-point groups read here (``acklane.core.demo.ENTRY_POINT_GROUP`` is the first).
DEMO_BROKERS_GROUP = "acklane.demos"  # name -> a DemoBroker subclass, for `acklane demo`
COMMANDS_GROUP = "acklane.commands"  # name -> a typer.Typer, added as `acklane NAME ...`


def _demo_broker_names() -> list[str]:
    """``--broker`` values: auto, memory and the registered demo brokers (not imported)."""
    registered = {ep.name for ep in entry_points(group=DEMO_BROKERS_GROUP)} - {"auto", "memory"}
    return ["auto", "memory", *sorted(registered)]


@app.command()
def demo(
    messages: Annotated[int, typer.Option(min=6, max=500, help="How many messages.")] = 24,
    broker: Annotated[
        str,
        typer.Option(
            help="auto: the first registered demo broker that can start (a Kafka emulator "
            "with acklane-integration), else the in-process broker; memory: the in-process "
            f"broker; or a registered one (entry points {DEMO_BROKERS_GROUP}). "
            f"Known: {', '.join(_demo_broker_names())}.",
        ),
    ] = "auto",
    log_level: Annotated[
        str, typer.Option("--log-level", help="WARNING; DEBUG shows the broker's logs too.")
    ] = "WARNING",
) -> None:
    """Run a demo pipeline on embedded defaults and show what becomes of each message."""
    _setup_logging(log_level)
    known = _demo_broker_names()
    if broker not in known:
        err_console.print(
            Text(f"--broker {broker!r}: no such demo broker (known: {', '.join(known)})"),
            style="red",
        )
        raise typer.Exit(2)
    from .demo import UnknownDemoBroker, run_demo

    try:
        code = asyncio.run(run_demo(messages, console, broker))
    except UnknownDemoBroker as exc:
        err_console.print(Text(str(exc)), style="red")
        raise typer.Exit(2) from None
    except Exception as exc:
        log.debug("acklane demo --broker %s failed", broker, exc_info=True)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        err_console.print(
            Text(f"acklane demo --broker {broker} failed: {type(exc).__name__}: {first}"),
            Text("(--log-level DEBUG shows the traceback)", style="dim"),
            style="red",
        )
        raise typer.Exit(1) from None
    raise typer.Exit(code)


def _add_subcommands() -> None:
    from .cli_events import app as events_app
    from .cli_store import app as store_app

    app.add_typer(events_app, name="events", help="See the trigger events that fired.")
    app.add_typer(store_app, name="store", help="Read and write the task and asset stores.")
    # Other distributions add theirs (acklane-integration: `acklane emulator`).
    for ep in entry_points(group=COMMANDS_GROUP):
        try:
            sub = ep.load()
        except Exception as exc:  # a broken plugin must not break `acklane run`
            log.warning("acklane %s (%s) is unavailable: %s", ep.name, ep.value, exc)
            continue
        if isinstance(sub, typer.Typer):
            app.add_typer(sub, name=ep.name)
        else:
            log.warning("entry point %s of %s is not a typer.Typer", ep.name, COMMANDS_GROUP)


_add_subcommands()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
