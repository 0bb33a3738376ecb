"""``acklane emulator``: run a broker emulator for local development.

``start BROKER`` starts one (a local process, or a container when Docker
answers), creates the entities asked for (``--topic``/``--subscription`` on
Pub/Sub and Service Bus, ``--queue`` on Service Bus), prints the connector fields
that reach it (YAML or JSON, on stdout, ready to paste into a stream block), and
runs until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import json
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from enum import StrEnum
from pathlib import Path
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


#: The brokers that take ``--topic``/``--subscription``, and ``--queue``.
_TOPICS = ("pubsub", "servicebus")
_QUEUES = ("servicebus",)


def _subscriptions(specs: list[str], topics: list[str]) -> list[tuple[str, str]]:
    """``(subscription, topic)`` of each ``NAME[:TOPIC]`` (TOPIC: the only ``--topic``)."""
    out = []
    for spec in specs:
        name, sep, topic = spec.partition(":")
        if not sep:
            if len(topics) != 1:
                _fail(f"--subscription {spec}: name its topic (NAME:TOPIC), or give one --topic")
            topic = topics[0]
        if not name or not topic:
            _fail(f"--subscription {spec!r}: expected NAME or NAME:TOPIC")
        out.append((name, topic))
    return out


@contextmanager
def _servicebus_config(
    queues: list[str], topics: list[str], subscriptions: list[tuple[str, str]]
) -> Iterator[Path | None]:
    """A ``Config.json`` declaring the entities (both backends read one), or None."""
    if not (queues or topics or subscriptions):
        yield None
        return
    declared = list(dict.fromkeys([*topics, *(t for _, t in subscriptions)]))
    namespace = {
        "Name": "sbemulatorns",
        "Queues": [{"Name": q, "Properties": {}} for q in queues],
        "Topics": [
            {
                "Name": t,
                "Properties": {},
                "Subscriptions": [
                    {"Name": s, "Properties": {}} for s, topic in subscriptions if topic == t
                ],
            }
            for t in declared
        ],
    }
    with tempfile.TemporaryDirectory(prefix="acklane-sb-config-") as tmp:
        path = Path(tmp) / "Config.json"
        path.write_text(json.dumps({"UserConfig": {"Namespaces": [namespace]}}))
        yield path


def _create_pubsub(
    settings: dict[str, Any], topics: list[str], subscriptions: list[tuple[str, str]]
) -> None:
    """Create Pub/Sub topics, then subscriptions (a topic named only there is created too)."""
    import grpc
    from google.pubsub_v1 import PublisherClient, SubscriberClient
    from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
    from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

    project = settings["project"]
    with grpc.insecure_channel(settings["emulator_host"]) as channel:
        publisher = PublisherClient(transport=PublisherGrpcTransport(channel=channel))
        subscriber = SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))
        for topic in dict.fromkeys([*topics, *(t for _, t in subscriptions)]):
            publisher.create_topic(name=f"projects/{project}/topics/{topic}", timeout=10)
            _err.print(f"created topic {topic}")
        for name, topic in subscriptions:
            subscriber.create_subscription(
                request={
                    "name": f"projects/{project}/subscriptions/{name}",
                    "topic": f"projects/{project}/topics/{topic}",
                },
                timeout=10,
            )
            _err.print(f"created subscription {name} on {topic}")


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
    topic: Annotated[
        list[str] | None,
        typer.Option("--topic", help="Create this topic (pubsub, servicebus); repeatable."),
    ] = None,
    subscription: Annotated[
        list[str] | None,
        typer.Option(
            "--subscription",
            metavar="NAME[:TOPIC]",
            help="Create this subscription on TOPIC (default: the only --topic; pubsub, "
            "servicebus); repeatable.",
        ),
    ] = None,
    queue: Annotated[
        list[str] | None,
        typer.Option("--queue", help="Create this queue (servicebus); repeatable."),
    ] = None,
) -> None:
    """Start BROKER's emulator, create what is asked, print its settings, run until Ctrl-C."""
    if broker not in BROKERS:
        _fail(f"no emulator for broker {broker!r} (known: {', '.join(sorted(BROKERS))})")
    topics, queues = list(topic or ()), list(queue or ())
    if (topics or subscription) and broker not in _TOPICS:
        _fail(f"--topic and --subscription are for {' and '.join(_TOPICS)}, not {broker}")
    if queues and broker not in _QUEUES:
        _fail(f"--queue is for {' and '.join(_QUEUES)}, not {broker}")
    subscriptions = _subscriptions(list(subscription or ()), topics)
    declared: AbstractContextManager[Path | None] = (
        _servicebus_config(queues, topics, subscriptions)
        if broker == "servicebus"
        else nullcontext()
    )
    with declared as config:
        _start(broker, backend, port, output, config, topics, subscriptions)


def _start(
    broker: str,
    backend: Backend | None,
    port: int | None,
    output: Format,
    config: Path | None,
    topics: list[str],
    subscriptions: list[tuple[str, str]],
) -> None:
    options: dict[str, Any] = {} if port is None else {"port": port}
    if config is not None:
        options["config"] = config
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
            if broker == "pubsub" and (topics or subscriptions):
                try:
                    _create_pubsub(emulator.client_settings(), topics, subscriptions)
                except Exception as exc:
                    _fail(f"creating the topics and subscriptions failed: {exc}")
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
