"""Logging for the ``acklane`` command line: levels, formats, and secrets kept out.

Three formats, all on stderr, every record through :func:`acklane.core.observe.redact.redact`:

- ``text``: one line per record, ``2025-11-30T14:18:44.123Z INFO acklane.core.pipeline.runner:
  message``; line breaks inside a record (a traceback, a multi-line message) are
  written as ``\\n``, so files, journald and Kubernetes see one record per line.
- ``json``: one JSON object per line: ``time``, ``level``, ``logger``, ``message``,
  and ``exception`` / ``stack`` when the record has them, plus any ``extra=`` fields.
- ``rich``: Rich's columns, wrapped to the terminal, for a person at a terminal.

The default is ``rich`` when stderr is a terminal, ``text`` otherwise.

acklane's own loggers (``acklane.*``, including the Kafka connector's
``acklane.connectors.kafka.librdkafka``) log at the chosen level; every other logger
(aiosqlite, botocore, urllib3, asyncio, sqlalchemy, ...) at ``third_party``,
WARNING unless asked.
"""

from __future__ import annotations

import enum
import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any, Final, TextIO

from .redact import redact

__all__ = [
    "THIRD_PARTY_LOGGERS",
    "JsonFormatter",
    "LogFormat",
    "LogLevel",
    "TextFormatter",
    "configure_logging",
    "default_format",
    "restore_logging",
]


class LogLevel(enum.StrEnum):
    """The levels ``--log-level`` accepts (any case)."""

    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    CRITICAL = "CRITICAL"


class LogFormat(enum.StrEnum):
    """The formats ``--log-format`` accepts."""

    RICH = "rich"
    TEXT = "text"
    JSON = "json"


#: Loggers set to the third-party level by name as well as through the root logger, in
#: case a library gave its logger a level of its own (the libraries of acklane-core; a
#: broker SDK's loggers, botocore's or the Kafka client's, inherit the root's level).
THIRD_PARTY_LOGGERS: Final = ("aiosqlite", "asyncio", "sqlalchemy", "psycopg", "urllib3")

# LogRecord attributes that are not ``extra=`` fields.
_STANDARD_ATTRIBUTES: Final = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__
) | {"message", "asctime", "taskName"}


def _utc_time(record: logging.LogRecord) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


def _one_line(text: str) -> str:
    return text.replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\n")


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER: message``, one line per record, secrets masked."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        extra = [self.formatException(record.exc_info)] if record.exc_info else []
        if not record.exc_info and record.exc_text:
            extra.append(record.exc_text)
        if record.stack_info:
            extra.append(self.formatStack(record.stack_info))
        text = "\n".join([message, *extra])
        line = f"{_utc_time(record)} {record.levelname} {record.name}: {text}"
        return _one_line(redact(line))


class JsonFormatter(logging.Formatter):
    """One JSON object per record and line, secrets masked."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": _utc_time(record),
            "level": record.levelname,
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        if record.exc_info:
            document["exception"] = redact(self.formatException(record.exc_info))
        elif record.exc_text:
            document["exception"] = redact(record.exc_text)
        if record.stack_info:
            document["stack"] = redact(self.formatStack(record.stack_info))
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRIBUTES and not key.startswith("_"):
                document.setdefault(key, _json_able(value))
        return json.dumps(document, ensure_ascii=False, default=str)


def _json_able(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return redact(repr(value))
    return json.loads(redact(json.dumps(value)))


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time of the record."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass  # always the current sys.stderr


def _rich_handler() -> logging.Handler:
    from rich.console import Console
    from rich.logging import RichHandler

    class _RedactingRichHandler(RichHandler):
        def format(self, record: logging.LogRecord) -> str:
            return redact(super().format(record))

    handler = _RedactingRichHandler(
        console=Console(stderr=True),
        rich_tracebacks=False,
        show_path=False,
        markup=False,
    )
    handler.setFormatter(logging.Formatter("%(message)s", datefmt="[%X]"))
    return handler


def default_format(stream: TextIO | None = None) -> LogFormat:
    """``rich`` when ``stream`` (stderr) is a terminal, else ``text``."""
    stream = stream if stream is not None else sys.stderr
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return LogFormat.RICH if tty else LogFormat.TEXT


_HANDLER_MARK: Final = "_acklane_cli_handler"
_saved: list[Callable[[], None]] = []


def _level_number(level: str | int) -> int:
    if isinstance(level, int):
        return level
    number = logging.getLevelName(str(level).upper())
    if not isinstance(number, int):
        choices = ", ".join(m.value for m in LogLevel)
        raise ValueError(f"unknown log level {level!r} (expected one of: {choices})")
    return number


def configure_logging(
    level: str | int = LogLevel.INFO,
    log_format: str | None = None,
    *,
    third_party: str | int = LogLevel.WARNING,
) -> logging.Handler:
    """Send every record to stderr in ``log_format``; acklane's at ``level``, others at
    ``third_party``. Replaces the handler of an earlier call; :func:`restore_logging`
    undoes every call."""
    ours = _level_number(level)
    theirs = _level_number(third_party)
    chosen = LogFormat(log_format) if log_format is not None else default_format()
    handler: logging.Handler
    if chosen is LogFormat.RICH:
        handler = _rich_handler()
    else:
        handler = _StderrHandler()
        handler.setFormatter(JsonFormatter() if chosen is LogFormat.JSON else TextFormatter())
    setattr(handler, _HANDLER_MARK, True)

    root = logging.getLogger()
    acklane = logging.getLogger("acklane")
    named = [logging.getLogger(name) for name in THIRD_PARTY_LOGGERS]
    if not _saved:
        levels = [(logger, logger.level) for logger in (root, acklane, *named)]
        handlers = list(root.handlers)

        def undo() -> None:
            for h in list(root.handlers):
                if getattr(h, _HANDLER_MARK, False):
                    root.removeHandler(h)
            for h in handlers:
                if h not in root.handlers:
                    root.addHandler(h)
            for logger, saved_level in levels:
                logger.setLevel(saved_level)

        _saved.append(undo)
    for old in list(root.handlers):
        if getattr(old, _HANDLER_MARK, False):
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(theirs)
    for logger in named:
        logger.setLevel(theirs)
    acklane.setLevel(ours)
    return handler


def restore_logging() -> None:
    """Put the logging configuration back as it was before :func:`configure_logging`."""
    while _saved:
        _saved.pop()()
