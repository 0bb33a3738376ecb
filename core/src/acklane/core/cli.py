"""The ``acklane`` command line: run, validate, demo, events, store, emulator."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

from .config import ConfigError, load_config

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
    _setup_logging(log_level)
    cfg = _load(config)
    from .metrics import start_metrics_server
    from .runner import Runner

    runner = Runner(cfg)
    if cfg.metrics.port is not None:
        start_metrics_server(cfg.metrics.port, runner)
    asyncio.run(runner.run())


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
