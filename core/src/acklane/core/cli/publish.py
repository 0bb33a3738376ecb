"""``acklane publish CONFIG STREAM``: send test messages through a configured stream's broker.

The messages are the MESSAGE arguments, or the lines of ``--file`` (``-``: stdin;
stdin too when neither is given and it is not a terminal): one message per line,
the line's bytes as the body (a JSON line is sent as written), empty lines
skipped. ``--envelope`` reads each line as ``{"body": ..., "key": ...,
"attributes": {...}}`` instead. They go where the stream reads, with its settings
(servers, credentials, endpoint), through the connector's publisher
(:meth:`acklane.core.connectors.Connector.publisher`); the memory connector has
none (its broker lives in the process that runs the pipeline) and says so.

Exit codes: 0 sent; 1 the broker refused or did not confirm (the count of those
confirmed before is printed); 2 a usage or configuration problem, or a stream
whose connector cannot publish.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from ..observe.redact import redact
from ._exit import FAILED, USAGE, fail
from ._load import load

if TYPE_CHECKING:
    from ..connectors import OutgoingMessage, Publisher

__all__ = ["publish"]

_out = Console(highlight=False, soft_wrap=True)
_err = Console(stderr=True, highlight=False, soft_wrap=True)

#: Files at least this large get a progress bar (on a terminal).
_PROGRESS_BYTES = 256 * 1024


class _UsageError(Exception):
    """A problem of the command line or of the input (exit 2)."""


def _attributes(pairs: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise _UsageError(f"--attribute {pair!r}: expected NAME=VALUE")
        out[name] = value
    return out


def _enveloped(
    line: bytes, number: int, key: str | None, attributes: dict[str, str]
) -> OutgoingMessage:
    from ..connectors import OutgoingMessage

    where = f"line {number}"
    try:
        document = json.loads(line)
    except ValueError as exc:
        raise _UsageError(
            f"{where}: not JSON ({exc}); --envelope reads one object per line"
        ) from None
    if not isinstance(document, dict) or "body" not in document:
        raise _UsageError(f'{where}: expected {{"body": ..., "key": ..., "attributes": {{...}}}}')
    unknown = sorted(set(document) - {"body", "key", "attributes"})
    if unknown:
        raise _UsageError(f"{where}: unknown field(s) {', '.join(unknown)}")
    body = document["body"]
    data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    own_key = document.get("key", key)
    if own_key is not None and not isinstance(own_key, str):
        raise _UsageError(f"{where}: key must be a string")
    own = document.get("attributes") or {}
    if not isinstance(own, dict):
        raise _UsageError(f"{where}: attributes must be an object")
    own_attributes = {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in own.items()}
    merged = {**attributes, **own_attributes}
    return OutgoingMessage(data, own_key, merged)


def _messages(
    lines: Iterable[bytes], *, envelope: bool, key: str | None, attributes: dict[str, str]
) -> Iterator[OutgoingMessage]:
    from ..connectors import OutgoingMessage

    for number, raw in enumerate(lines, 1):
        line = raw.rstrip(b"\r\n")
        if not line.strip():
            continue
        if envelope:
            yield _enveloped(line, number, key, attributes)
        else:
            yield OutgoingMessage(line, key, attributes)


def _schema_text(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text()
    except OSError as exc:
        raise _UsageError(f"--schema {path}: {exc.strerror or exc}") from None


class _Counted:
    """Lines of a binary stream, counting the bytes read (for the progress bar)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.read = 0

    def __iter__(self) -> Iterator[bytes]:
        for line in self.stream:
            self.read += len(line)
            yield line


async def _send_all(
    publisher: Publisher, messages: Iterator[OutgoingMessage], on_sent: Callable[[int], None]
) -> int:
    sent = 0
    async with publisher:
        while True:
            batch = []
            for message in messages:
                batch.append(message)
                if len(batch) >= publisher.max_batch:
                    break
            if not batch:
                return sent
            await publisher.send(batch)
            sent += len(batch)
            on_sent(sent)


class _Sent:
    """How many messages the broker confirmed, kept when a later batch fails."""

    count = 0


def publish(
    config: Annotated[Path, typer.Argument(help="The pipeline's YAML configuration.")],
    stream: Annotated[str, typer.Argument(help="The name of a stream of the configuration.")],
    message: Annotated[
        list[str] | None,
        typer.Argument(
            help="Messages to send (each one body); without them, the lines of --file.",
            show_default=False,
        ),
    ] = None,
    file: Annotated[
        str | None,
        typer.Option(
            "--file",
            "-f",
            help="Send each line of this file (JSON lines or plain lines); '-' reads stdin.",
            show_default=False,
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            "--key",
            help="The key of every message: Kafka record key, SQS FIFO group id, Pub/Sub "
            "ordering key, Service Bus session id.",
            show_default=False,
        ),
    ] = None,
    attribute: Annotated[
        list[str] | None,
        typer.Option(
            "--attribute",
            "-a",
            metavar="NAME=VALUE",
            help="An attribute of every message (Kafka header, SQS message attribute, "
            "Pub/Sub attribute, Service Bus application property); repeatable.",
            show_default=False,
        ),
    ] = None,
    topic: Annotated[
        str | None,
        typer.Option(
            "--topic",
            help="Kafka: the topic, when the stream reads several; Pub/Sub: another topic "
            "than the subscription's.",
            show_default=False,
        ),
    ] = None,
    schema: Annotated[
        Path | None,
        typer.Option(
            "--schema",
            help="Kafka streams with a value_format (avro, json_schema): encode each JSON body "
            "with this schema, registered if new (default: the subject's latest).",
            show_default=False,
        ),
    ] = None,
    key_schema: Annotated[
        Path | None,
        typer.Option(
            "--key-schema",
            help="The same for keys (key_format avro, json_schema).",
            show_default=False,
        ),
    ] = None,
    envelope: Annotated[
        bool,
        typer.Option(
            "--envelope",
            help='Each line is {"body": ..., "key": ..., "attributes": {...}} (a body that '
            "is not a string is sent as JSON).",
        ),
    ] = False,
) -> None:
    """Send messages through STREAM's broker, with the stream's own settings.

    For trying a pipeline: publish to the stream a watcher reads, then `acklane run`.
    Exit 0 when the broker confirmed every message, 1 when it did not, 2 on a
    usage or configuration problem.
    """
    from ..connectors import PublishError, PublishNotSupported

    cfg = load(config)
    if stream not in cfg.streams:
        known = ", ".join(sorted(cfg.streams)) or "none"
        fail(f"{config}: no stream named {stream!r} (streams: {known})", USAGE)
    chosen = cfg.streams[stream]
    if message and file is not None:
        fail("give MESSAGE arguments or --file, not both", USAGE)
    try:
        attributes = _attributes(attribute or ())
        publisher = chosen.connector.create_publisher(chosen.config, destination=topic)
        if schema is not None or key_schema is not None:
            publisher.encode_with(_schema_text(schema), _schema_text(key_schema))
    except _UsageError as exc:
        fail(str(exc), USAGE)
    except PublishNotSupported as exc:
        fail(f"stream {stream!r}: {exc}", USAGE)
    except PublishError as exc:
        fail(f"stream {stream!r}: {exc}", USAGE)

    stream_in: IO[bytes] | None = None
    counted: _Counted | None = None
    total_bytes: int | None = None
    if message:
        lines: Iterable[bytes] = (m.encode() for m in message)
    else:
        if file is None or file == "-":
            if file is None and sys.stdin.isatty():
                fail("give MESSAGE arguments, --file FILE, or pipe the messages in", USAGE)
            if file is None:
                _err.print("reading messages from stdin, one per line", style="dim")
            stream_in = sys.stdin.buffer
        else:
            try:
                stream_in = open(file, "rb")  # noqa: SIM115 - closed below
            except OSError as exc:
                fail(f"--file {file}: {exc.strerror or exc}", USAGE)
            total_bytes = os.fstat(stream_in.fileno()).st_size
        counted = _Counted(stream_in)
        lines = counted
    messages = _messages(lines, envelope=envelope, key=key, attributes=attributes)

    show_bar = total_bytes is not None and total_bytes >= _PROGRESS_BYTES and _err.is_terminal
    sent = _Sent()
    try:
        if show_bar:
            with Progress(
                TextColumn("publishing"),
                BarColumn(),
                TextColumn("{task.fields[sent]} messages"),
                TimeElapsedColumn(),
                console=_err,
                transient=True,
            ) as progress:
                task = progress.add_task("publish", total=total_bytes, sent=0)

                def on_sent(count: int) -> None:
                    sent.count = count
                    done = counted.read if counted is not None else 0
                    progress.update(task, completed=done, sent=count)

                asyncio.run(_send_all(publisher, messages, on_sent))
        else:

            def on_sent(count: int) -> None:
                sent.count = count

            asyncio.run(_send_all(publisher, messages, on_sent))
    except _UsageError as exc:
        fail(f"{file or 'input'}: {exc} ({sent.count} message(s) sent before)", USAGE)
    except PublishError as exc:
        fail(f"stream {stream!r}: {exc} ({sent.count} message(s) confirmed before)", FAILED)
    except Exception as exc:
        fail(
            f"stream {stream!r}: publishing failed: {type(exc).__name__}: {exc} "
            f"({sent.count} message(s) confirmed before)",
            FAILED,
        )
    finally:
        if stream_in is not None and stream_in is not sys.stdin.buffer:
            stream_in.close()
    done = f"published {sent.count} message(s) to {publisher.destination} (stream {stream})"
    _out.print(Text(redact(done)))
