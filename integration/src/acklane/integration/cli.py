"""``acklane emulator``: run a broker emulator for local development.

``start BROKER`` starts one (a local process, or a container when Docker
answers), creates the entities asked for (``--topic`` on Kafka, Pub/Sub and
Service Bus; ``--subscription`` on Pub/Sub and Service Bus; ``--queue`` on SQS
and Service Bus), or every entity the streams of ``--config`` read (on the port
they reach), prints the connector fields that reach it (YAML or JSON, on stdout,
ready to paste into a stream block; for Kafka with the client settings that make
the emulator fast) and the variables the examples read, and runs until Ctrl-C
or SIGTERM.
"""

from __future__ import annotations

import json
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Annotated, Any, NoReturn
from urllib.parse import urlsplit

import typer
import yaml
from rich.console import Console
from rich.text import Text

from .emulator import (
    BACKEND_ENV,
    EmulatorError,
    brokers,
    choose_backend,
    emulator_for,
    install_hint,
    missing_requirements,
    require_installed,
)

__all__ = ["FAST_KAFKA_CLIENT", "app", "example_environment", "main"]

app = typer.Typer(
    name="emulator",
    help="Run broker emulators (Kafka, SQS, ...) for local development and tests.",
    no_args_is_help=True,
    add_completion=False,
)

_err = Console(stderr=True, highlight=False, soft_wrap=True)

#: librdkafka consumer settings that make the Kafka emulators quick to start
#: consuming. A group join on tansu takes about half of ``session.timeout.ms``:
#: with librdkafka's default (45000) the first record comes after ~23 s, with these
#: after ~3 s. 6000 is also the smallest session timeout a default Kafka broker
#: accepts (``group.min.session.timeout.ms``), so the block works on a real one too.
FAST_KAFKA_CLIENT: dict[str, int] = {
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 1500,
    "fetch.wait.max.ms": 100,
}

#: SQS: receives after which the emulator's own redrive moves a message to the
#: ``--queue NAME:DLQ`` dead-letter queue (acklane dead-letters rejected ones itself).
SQS_MAX_RECEIVE_COUNT = 10

#: The Schema Registry emulator: not a broker, the ``schema_registry:`` block of Kafka streams.
REGISTRY = "schema-registry"
REGISTRY_BLOCK = "schema_registry"

#: Hosts that mean "this machine" in a configuration's endpoint.
_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]", "0.0.0.0")


class Backend(StrEnum):
    local = "local"
    docker = "docker"


class Format(StrEnum):
    yaml = "yaml"
    json = "json"


def _fail(message: str, code: int = 1) -> NoReturn:
    _err.print(Text(f"error: {message}", style="red"))
    raise typer.Exit(code)


#: What ``--topic``, ``--subscription`` and ``--queue`` are for.
_TOPICS = ("kafka", "pubsub", "servicebus")
_SUBSCRIPTIONS = ("pubsub", "servicebus")
_QUEUES = ("sqs", "servicebus")


def example_environment(broker: str, settings: dict[str, Any]) -> dict[str, str]:
    """The variables ``examples/<broker>.yaml`` reads, set to reach this emulator."""
    if broker == "kafka":
        return {"KAFKA_BOOTSTRAP_SERVERS": str(settings["bootstrap_servers"])}
    if broker == "sqs":
        return {"SQS_ENDPOINT_URL": str(settings["endpoint_url"]), "AWS_REGION": settings["region"]}
    if broker == "pubsub":
        return {
            "PUBSUB_EMULATOR_HOST": str(settings["emulator_host"]),
            "PUBSUB_PROJECT": str(settings["project"]),
        }
    if broker == "servicebus":
        return {"SERVICEBUS_CONNECTION_STRING": str(settings["connection_string"])}
    if broker == REGISTRY:
        return {"SCHEMA_REGISTRY_URL": str(settings[REGISTRY_BLOCK]["url"])}
    return {}


@dataclass
class _Plan:
    """The entities to create, and where the emulator should listen."""

    topics: list[str] = field(default_factory=list)
    #: ``(subscription, topic)``.
    subscriptions: list[tuple[str, str]] = field(default_factory=list)
    #: Service Bus queues.
    queues: list[str] = field(default_factory=list)
    #: SQS ``(queue, dead-letter queue or None)``.
    sqs_queues: list[tuple[str, str | None]] = field(default_factory=list)
    port: int | None = None
    #: Pub/Sub: the project the configuration names.
    project: str | None = None

    def add_topic(self, name: str) -> None:
        if name not in self.topics:
            self.topics.append(name)

    def add_subscription(self, name: str, topic: str) -> None:
        if all(s != name for s, _ in self.subscriptions):
            self.subscriptions.append((name, topic))
        self.add_topic(topic)

    def add_queue(self, name: str) -> None:
        if name not in self.queues:
            self.queues.append(name)

    def add_sqs_queue(self, name: str, dlq: str | None) -> None:
        if dlq is not None and all(q != dlq for q, _ in self.sqs_queues):
            self.sqs_queues.append((dlq, None))
        for i, (queue, known) in enumerate(self.sqs_queues):
            if queue == name:
                self.sqs_queues[i] = (queue, dlq or known)
                return
        self.sqs_queues.append((name, dlq))

    def listen_on(self, port: int, source: str) -> None:
        if self.port is not None and self.port != port:
            _fail(f"{source} reaches port {port}, another stream port {self.port}", 2)
        self.port = port


def _subscription_spec(spec: str, topics: list[str]) -> tuple[str, str]:
    """``(subscription, topic)`` of ``NAME[:TOPIC]`` (TOPIC: the only ``--topic``)."""
    name, sep, topic = spec.partition(":")
    if not sep:
        if len(topics) != 1:
            _fail(f"--subscription {spec}: name its topic (NAME:TOPIC), or give one --topic", 2)
        topic = topics[0]
    if not name or not topic:
        _fail(f"--subscription {spec!r}: expected NAME or NAME:TOPIC", 2)
    return name, topic


def _local_port(host_port: str, source: str) -> int | None:
    """The port of ``host:port`` when the host is this machine (else a warning, None)."""
    host, sep, port = host_port.strip().rpartition(":")
    if not sep or not port.isdigit():
        return None
    if host.lower() not in _LOCAL_HOSTS:
        _err.print(f"warning: {source} reaches {host_port}, not this machine", style="yellow")
        return None
    return int(port)


def _plan_from_config(broker: str, path: Path, cli_topics: list[str], plan: _Plan) -> None:
    """Add what the streams of ``path`` on ``broker`` read (and dead-letter to)."""
    from acklane.core.config import ConfigError, load_config

    try:
        cfg = load_config(path)
    except ConfigError as exc:
        _fail(f"--config: invalid configuration\n{exc}", 2)
    if broker == REGISTRY:
        _plan_registry(cfg, path, plan)
        return
    streams = [s for s in cfg.streams.values() if s.connector_name == broker]
    if not streams:
        known = ", ".join(sorted({s.connector_name for s in cfg.streams.values()})) or "none"
        _fail(f"{path} has no {broker} stream (its streams' connectors: {known})", 2)
    for stream in streams:
        c: Any = stream.config
        where = f"{path}: stream {stream.name}"
        if broker == "kafka":
            for topic in c.topics:
                if topic.startswith("^"):
                    _err.print(f"{where}: {topic} is a pattern; create its topics with --topic")
                else:
                    plan.add_topic(topic)
            if c.dead_letter:
                plan.add_topic(c.dead_letter)
            port = _local_port(c.bootstrap_servers.split(",")[0], where)
        elif broker == "sqs":
            name = c.queue_name or c.queue_url.rsplit("/", 1)[-1]
            dlq = c.dead_letter.rsplit("/", 1)[-1] if c.dead_letter else None
            plan.add_sqs_queue(name, dlq)
            port = urlsplit(c.endpoint_url).port if c.endpoint_url else None
            if c.endpoint_url and (urlsplit(c.endpoint_url).hostname or "") not in _LOCAL_HOSTS:
                port = None
        elif broker == "pubsub":
            plan.project = plan.project or c.project_id
            subscription = c.subscription_path.rsplit("/", 1)[-1]
            if all(s != subscription for s, _ in plan.subscriptions):
                if len(cli_topics) != 1:
                    _fail(
                        f"{where} reads the subscription {subscription}, and a configuration "
                        "does not say its topic: add --topic TOPIC (or --subscription "
                        f"{subscription}:TOPIC)",
                        2,
                    )
                plan.add_subscription(subscription, cli_topics[0])
            if c.dead_letter_topic_path:
                plan.add_topic(c.dead_letter_topic_path.rsplit("/", 1)[-1])
            port = _local_port(c.emulator_host, where) if c.emulator_host else None
        else:  # servicebus
            if c.queue is not None:
                plan.add_queue(c.queue)
            else:
                plan.add_subscription(c.subscription, c.topic)
            port = _local_port(c.namespace, where)
        if port is not None:
            plan.listen_on(port, where)


def _plan_registry(cfg: Any, path: Path, plan: _Plan) -> None:
    """Listen where the ``schema_registry`` blocks of ``cfg``'s streams reach."""
    registries = [
        (name, s.config.schema_registry)
        for name, s in cfg.streams.items()
        if getattr(s.config, REGISTRY_BLOCK, None) is not None
    ]
    if not registries:
        _fail(f"{path} has no stream with a {REGISTRY_BLOCK} block", 2)
    for name, registry in registries:
        where = f"{path}: stream {name}"
        parts = urlsplit(registry.url.split(",")[0])
        if parts.port is None:
            continue
        if (parts.hostname or "") not in _LOCAL_HOSTS:
            _err.print(f"warning: {where} reaches {parts.netloc}, not this machine", style="yellow")
            continue
        plan.listen_on(parts.port, where)


@contextmanager
def _servicebus_config(plan: _Plan) -> Iterator[Path | None]:
    """A ``Config.json`` declaring the entities (both backends read one), or None."""
    if not (plan.queues or plan.topics or plan.subscriptions):
        yield None
        return
    namespace = {
        "Name": "sbemulatorns",
        "Queues": [{"Name": q, "Properties": {}} for q in plan.queues],
        "Topics": [
            {
                "Name": t,
                "Properties": {},
                "Subscriptions": [
                    {"Name": s, "Properties": {}} for s, topic in plan.subscriptions if topic == t
                ],
            }
            for t in plan.topics
        ],
    }
    with tempfile.TemporaryDirectory(prefix="acklane-sb-config-") as tmp:
        path = Path(tmp) / "Config.json"
        path.write_text(json.dumps({"UserConfig": {"Namespaces": [namespace]}}))
        yield path


def _create_pubsub(settings: dict[str, Any], plan: _Plan) -> None:
    """Create Pub/Sub topics, then subscriptions."""
    import grpc
    from google.pubsub_v1 import PublisherClient, SubscriberClient
    from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
    from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

    project = settings["project"]
    with grpc.insecure_channel(settings["emulator_host"]) as channel:
        publisher = PublisherClient(transport=PublisherGrpcTransport(channel=channel))
        subscriber = SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))
        for topic in plan.topics:
            publisher.create_topic(name=f"projects/{project}/topics/{topic}", timeout=10)
            _err.print(f"created topic {topic}")
        for name, topic in plan.subscriptions:
            subscriber.create_subscription(
                request={
                    "name": f"projects/{project}/subscriptions/{name}",
                    "topic": f"projects/{project}/topics/{topic}",
                },
                timeout=10,
            )
            _err.print(f"created subscription {name} on {topic}")


def _create_kafka(settings: dict[str, Any], plan: _Plan, partitions: int) -> None:
    from .kafka import KafkaKit

    kit = KafkaKit(settings["bootstrap_servers"])
    try:
        for topic in plan.topics:
            kit.create_topic(topic, partitions)
            _err.print(f"created topic {topic} ({partitions} partition(s))")
    finally:
        kit.close()


def _create_sqs(settings: dict[str, Any], plan: _Plan) -> None:
    """Create SQS queues, each dead-letter queue before the queue whose redrive names it."""
    from .sqs import sqs_client

    client = sqs_client(settings)
    try:
        arns: dict[str, str] = {}
        ordered = sorted(plan.sqs_queues, key=lambda q: q[1] is not None)
        for name, dlq in ordered:
            attributes: dict[str, str] = {}
            if name.endswith(".fifo"):
                attributes["FifoQueue"] = "true"
            if dlq is not None:
                attributes["RedrivePolicy"] = json.dumps(
                    {"deadLetterTargetArn": arns[dlq], "maxReceiveCount": SQS_MAX_RECEIVE_COUNT}
                )
            url = client.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
            arns[name] = client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
                "Attributes"
            ]["QueueArn"]
            redrive = f", dead-letter queue {dlq}" if dlq else ""
            _err.print(f"created queue {name}{redrive}")
    finally:
        client.close()


def _settings_text(broker: str, backend: str, endpoint: str, settings: dict[str, Any]) -> str:
    """The YAML to paste into a stream block, with comments on what is what."""
    if broker == REGISTRY:
        lines = [
            f"# the {broker} emulator ({backend}) at {endpoint}: the block of a Kafka stream",
            "# with value_format avro, protobuf or json_schema (docs/schema-registry.md)",
            yaml.safe_dump(settings, sort_keys=False).rstrip(),
        ]
        env = example_environment(broker, settings)
        lines += [f"#   export {name}='{value}'" for name, value in env.items()]
        return "\n".join(lines)
    lines = [f"# the {broker} emulator ({backend}) at {endpoint}: the fields of a stream block"]
    # Values as JSON strings (YAML's double-quoted scalars): a value that the output's
    # redaction masks (a configuration's ${AWS_SECRET_ACCESS_KEY:-testing}) stays YAML.
    lines += [f"{k}: {json.dumps(v)}" for k, v in settings.items() if k != "client"]
    if "client" in settings:
        lines += [
            "# A group join on the emulator takes about half of session.timeout.ms: with",
            "# librdkafka's default (45000) the first record comes after ~23 s; with these,",
            "# after ~3 s:",
            yaml.safe_dump({"client": settings["client"]}, sort_keys=False).rstrip(),
        ]
    env = example_environment(broker, settings)
    if env:
        lines.append(f"# examples/{broker}.yaml reads:")
        lines += [f"#   export {name}='{value}'" for name, value in env.items()]
    return "\n".join(lines)


@app.callback()
def _group() -> None:
    """Run broker emulators (Kafka, SQS, ...) for local development and tests."""


@app.command("list")
def list_brokers() -> None:
    """The brokers that have an emulator, the backend that would run them, and whether
    what each needs is installed (else what to install)."""
    try:
        backend = choose_backend()
    except EmulatorError as exc:
        _fail(str(exc))
    for broker in brokers():
        missing = missing_requirements(broker)
        state = "ready" if not missing else f"needs {', '.join(missing)}: {install_hint(broker)}"
        typer.echo(f"{broker}\t{backend}\t{state}")


@app.command()
def start(
    broker: Annotated[str, typer.Argument(help=f"One of: {', '.join(brokers())}.")],
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
        int | None,
        typer.Option(
            "--port",
            help="Listen on this port (local backend only; default: the port the --config "
            "streams reach, else a free one).",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        Format, typer.Option("--format", help="How to print the connection settings.")
    ] = Format.yaml,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="A pipeline's YAML: create every topic, queue and subscription its streams "
            "on BROKER read or dead-letter to, and listen on the port they reach.",
            show_default=False,
        ),
    ] = None,
    topic: Annotated[
        list[str] | None,
        typer.Option("--topic", help="Create this topic (kafka, pubsub, servicebus); repeatable."),
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
        typer.Option(
            "--queue",
            metavar="NAME[:DLQ]",
            help="Create this queue (sqs, servicebus); on SQS, NAME:DLQ also creates DLQ and "
            f"makes it NAME's redrive target ({SQS_MAX_RECEIVE_COUNT} receives); repeatable.",
        ),
    ] = None,
    partitions: Annotated[
        int, typer.Option("--partitions", min=1, help="Partitions of each Kafka topic created.")
    ] = 1,
    user: Annotated[
        str | None,
        typer.Option(
            "--user",
            metavar="NAME:PASSWORD",
            help="schema-registry (local backend): ask for HTTP basic authentication.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Start BROKER's emulator, create what is asked, print its settings, run until Ctrl-C."""
    if broker not in brokers():
        _fail(f"no emulator for broker {broker!r} (known: {', '.join(brokers())})", 2)
    try:
        require_installed(broker)
    except EmulatorError as exc:
        _fail(str(exc))
    topics, queues = list(topic or ()), list(queue or ())
    if topics and broker not in _TOPICS:
        _fail(f"--topic is for {', '.join(_TOPICS)}, not {broker}", 2)
    if subscription and broker not in _SUBSCRIPTIONS:
        _fail(f"--subscription is for {' and '.join(_SUBSCRIPTIONS)}, not {broker}", 2)
    if queues and broker not in _QUEUES:
        _fail(f"--queue is for {' and '.join(_QUEUES)}, not {broker}", 2)
    credentials: tuple[str, str] | None = None
    if user is not None:
        name, sep, password = user.partition(":")
        if broker != REGISTRY or not sep or not name:
            _fail(f"--user NAME:PASSWORD is for {REGISTRY}", 2)
        credentials = (name, password)
    plan = _Plan()
    for spec in subscription or ():
        plan.add_subscription(*_subscription_spec(spec, topics))
    for name in topics:
        plan.add_topic(name)
    for spec in queues:
        name, sep, dlq = spec.partition(":")
        if not name or (sep and (not dlq or broker != "sqs")):
            _fail(f"--queue {spec!r}: expected NAME (or NAME:DLQ on sqs)", 2)
        if broker == "sqs":
            plan.add_sqs_queue(name, dlq or None)
        else:
            plan.add_queue(name)
    if config is not None:
        _plan_from_config(broker, config, topics, plan)
    if port is None:
        port = plan.port
    declared: AbstractContextManager[Path | None] = (
        _servicebus_config(plan) if broker == "servicebus" else nullcontext()
    )
    with declared as entities:
        _start(broker, backend, port, output, entities, plan, partitions, credentials)


def _start(
    broker: str,
    backend: Backend | None,
    port: int | None,
    output: Format,
    config: Path | None,
    plan: _Plan,
    partitions: int,
    credentials: tuple[str, str] | None = None,
) -> None:
    options: dict[str, Any] = {} if port is None else {"port": port}
    if credentials is not None:
        options["user"] = credentials
    if config is not None:
        options["config"] = config
    if broker == "pubsub" and plan.project is not None:
        options["project"] = plan.project
    try:
        emulator = emulator_for(broker, backend.value if backend else None, **options)
    except TypeError:
        _fail(f"the {broker} emulator on this backend does not take --port or --user", 2)
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
            settings: dict[str, Any] = (
                {REGISTRY_BLOCK: emulator.client_settings()}
                if broker == REGISTRY
                else {"connector": broker, **emulator.client_settings()}
            )
            if plan.project is not None:
                settings["project"] = plan.project
            try:
                if broker == "pubsub" and (plan.topics or plan.subscriptions):
                    _create_pubsub(settings, plan)
                elif broker == "kafka" and plan.topics:
                    _create_kafka(settings, plan, partitions)
                elif broker == "sqs" and plan.sqs_queues:
                    _create_sqs(settings, plan)
            except Exception as exc:
                _fail(f"creating the topics, queues and subscriptions failed: {exc}")
            if broker == "kafka":
                settings["client"] = dict(FAST_KAFKA_CLIENT)
            if output is Format.json:
                typer.echo(json.dumps(settings))
            else:
                text = _settings_text(broker, emulator.backend, emulator.endpoint, settings)
                typer.echo(text)
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
