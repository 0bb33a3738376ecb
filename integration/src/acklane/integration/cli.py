"""``acklane emulator``: run a broker emulator for local development.

``start BROKER`` starts one (a local process, or a container when Docker
answers), prints the connector fields that reach it (YAML or JSON, on stdout,
ready to paste into a stream block), and runs until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import json
import signal
import threading
from enum import StrEnum
from types import FrameType
from typing import Annotated, Any, NoReturn

import typer
import yaml
from rich.console import Console
from rich.text import Text

from .emulator import BACKEND_ENV, BROKERS, EmulatorError, choose_backend, emulator_for

__all__ = ["app", "main"]

app = typer.Typer(
    name="emulator",
    help="Run broker emulators (Kafka, SQS, ...) for local development and tests.",
    no_args_is_help=True,
    add_completion=False,
)

_err = Console(stderr=True, highlight=False)


class Backend(StrEnum):
    local = "local"
    docker = "docker"


class Format(StrEnum):
    yaml = "yaml"
    json = "json"


def _fail(message: str) -> NoReturn:
    _err.print(Text(f"error: {message}", style="red"))
    raise typer.Exit(1)


@app.callback()
def _group() -> None:
    """Run broker emulators (Kafka, SQS, ...) for local development and tests."""


@app.command("list")
def list_brokers() -> None:
    """The brokers that have an emulator, and the backend that would run them."""
    try:
        backend = choose_backend()
    except EmulatorError as exc:
        _fail(str(exc))
    for broker in sorted(BROKERS):
        typer.echo(f"{broker}\t{backend}")


@app.command()
def start(
    broker: Annotated[str, typer.Argument(help=f"One of: {', '.join(sorted(BROKERS))}.")],
    backend: Annotated[
        Backend | None,
        typer.Option(
            "--backend",
            help=f"local process or docker container (default: ${BACKEND_ENV}, else docker "
            "when an engine answers, else local).",
            show_default=False,
        ),
    ] = None,
    port: Annotated[
        int | None, typer.Option("--port", help="Listen on this port (local backend only).")
    ] = None,
    output: Annotated[
        Format, typer.Option("--format", help="How to print the connection settings.")
    ] = Format.yaml,
) -> None:
    """Start BROKER's emulator, print its connection settings, run until Ctrl-C."""
    if broker not in BROKERS:
        _fail(f"no emulator for broker {broker!r} (known: {', '.join(sorted(BROKERS))})")
    options: dict[str, Any] = {} if port is None else {"port": port}
    try:
        emulator = emulator_for(broker, backend.value if backend else None, **options)
    except TypeError:
        _fail(f"the {broker} emulator on this backend does not take --port")
    except (EmulatorError, ImportError) as exc:
        _fail(str(exc))

    stop = threading.Event()

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        _err.print(f"starting the {broker} emulator ({emulator.backend})...")
        try:
            emulator.start()
        except EmulatorError as exc:
            _fail(str(exc))
        try:
            settings = {"connector": broker, **emulator.client_settings()}
            if output is Format.json:
                typer.echo(json.dumps(settings))
            else:
                typer.echo(yaml.safe_dump(settings, sort_keys=False).rstrip())
            _err.print(
                f"{broker} emulator ({emulator.backend}) ready at {emulator.endpoint}; "
                "Ctrl-C to stop"
            )
            while not stop.wait(0.5):
                if not getattr(emulator, "running", True):
                    _fail(f"the {broker} emulator stopped on its own")
        finally:
            emulator.stop()
            _err.print(f"{broker} emulator stopped")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def main() -> None:
    """Run the emulator command line on its own (``python -m acklane.integration.cli``)."""
    app()


if __name__ == "__main__":
    main()
