"""``acklane validate --connect`` for a Kafka stream, and its offline checks.

The connection check uses one admin client and changes nothing: it describes the
cluster (the brokers answer, the credentials are accepted), then the topics the
stream reads and its ``dead_letter`` topic (they exist, the user may describe them).
Regex subscriptions are not resolved. Joining the consumer group is not tried: that
would rebalance a running pipeline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient

from ._config import KafkaConfig
from ._errors import KafkaReceiveError
from ._health import AUTH_CODES, QuietClientLog, auth_error

__all__ = ["check_connection", "offline_problems"]

_client_log = QuietClientLog(logging.getLogger("acklane.connectors.kafka.librdkafka"))

#: Fields that name a file librdkafka reads.
_FILE_FIELDS = (
    "ssl_ca_location",
    "ssl_certificate_location",
    "ssl_key_location",
    "ssl_keystore_location",
    "ssl_crl_location",
)


def offline_problems(config: KafkaConfig) -> list[tuple[str, str]]:
    """Files named by ``ssl_*_location`` that do not exist or cannot be read."""
    problems = []
    for field in _FILE_FIELDS:
        value = getattr(config, field)
        if value is None or value == "probe":  # librdkafka's "find the system CAs"
            continue
        path = Path(value).expanduser()
        if not path.exists():
            problems.append((field, f"{value}: no such file"))
        elif path.is_file() and not _readable(path):
            problems.append((field, f"{value}: not readable"))
    return problems + _format_problems(config)


def _format_problems(config: KafkaConfig) -> list[tuple[str, str]]:
    """A value/key format whose decoder is not installed, a message class that does not
    import, a registry TLS file that is not there."""
    if not config.decodes():
        return []
    from acklane.core.errors import AcklaneError

    from ._formats import Formats, load_message_class

    problems: list[tuple[str, str]] = []
    for side in ("value", "key"):
        spec = getattr(config, f"{side}_message_class")
        if spec is not None:
            try:
                load_message_class(spec)
            except AcklaneError as exc:
                problems.append((f"{side}_message_class", str(exc)))
    registry = config.schema_registry
    assert registry is not None
    for field in ("ssl_ca_location", "ssl_certificate_location", "ssl_key_location"):
        value = getattr(registry, field)
        if value is not None and not Path(value).expanduser().exists():
            problems.append((f"schema_registry.{field}", f"{value}: no such file"))
    if not problems:
        try:
            Formats(config)  # the deserializers import (their extras are installed)
        except AcklaneError as exc:
            problems.append(
                (f"{'value' if config.value_format != 'json' else 'key'}_format", str(exc))
            )
    return problems


def _readable(path: Path) -> bool:
    try:
        with path.open("rb"):
            return True
    except OSError:
        return False


async def check_connection(config: KafkaConfig, call_timeout: float) -> str:
    """Describe the cluster and the stream's topics; see the module's docstring."""
    return await asyncio.to_thread(_check, config, call_timeout)


def _check(config: KafkaConfig, call_timeout: float) -> str:
    errors: list[KafkaError] = []
    settings = config.admin_settings()
    settings["error_cb"] = errors.append
    settings["logger"] = _client_log
    admin = AdminClient(settings)
    cluster = _wait(
        admin,
        admin.describe_cluster(request_timeout=call_timeout),
        call_timeout,
        errors,
        config.bootstrap_servers,
    )
    found = f"cluster {cluster.cluster_id or '(no id)'}, {len(cluster.nodes)} broker(s)"
    named = [t for t in config.topics if not t.startswith("^")]
    wanted = [(t, "topics") for t in named]
    if config.dead_letter is not None:
        wanted.append((config.dead_letter, "dead_letter"))
    if not wanted:
        return f"{found}; regex subscription not resolved"
    futures = admin.describe_topics(
        TopicCollection([t for t, _ in wanted]), request_timeout=call_timeout
    )
    missing = []
    for topic, field in wanted:
        try:
            _wait(admin, futures[topic], call_timeout, errors, config.bootstrap_servers)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() in AUTH_CODES:
                raise auth_error(error, f"describing topic {topic!r} ({field})") from None
            if isinstance(error, KafkaError) and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                missing.append(f"{topic!r} ({field})")
                continue
            raise KafkaReceiveError(f"describing topic {topic!r} ({field}) failed: {exc}") from None
    if missing:
        raise KafkaReceiveError(
            f"{found}, but no such topic: {', '.join(missing)} (create it, or fix the name)"
        )
    regex = [t for t in config.topics if t.startswith("^")]
    also = f"; regex {', '.join(regex)} not resolved" if regex else ""
    return f"{found}; topics {', '.join(t for t, _ in wanted)} exist{also}"


def _wait(
    admin: Any,
    future: concurrent.futures.Future[Any],
    call_timeout: float,
    errors: list[KafkaError],
    servers: str,
) -> Any:
    """The future's result, serving the client's error callback meanwhile: a refusal
    of the credentials is raised at once, an unreachable cluster named on time-out."""
    deadline = time.monotonic() + call_timeout + 2
    while not future.done() and time.monotonic() < deadline:
        admin.poll(0.1)
        refused = next((e for e in errors if e.code() in AUTH_CODES), None)
        if refused is not None:
            raise auth_error(refused, "connecting")
    try:
        return future.result(timeout=0.5)
    except concurrent.futures.TimeoutError:
        pass
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if not (isinstance(error, KafkaError) and error.code() == KafkaError._TIMED_OUT):
            raise
    refused = next((e for e in errors if e.code() in AUTH_CODES), None)
    if refused is not None:
        raise auth_error(refused, "connecting")
    reasons = [e.str() for e in errors if e.code() != KafkaError._ALL_BROKERS_DOWN]
    why = f": {reasons[-1]}" if reasons else ""
    raise KafkaReceiveError(
        f"no answer from the brokers at {servers} within {call_timeout:g}s (bootstrap_servers){why}"
    )
