"""No secret of a configuration reaches any output of any command, at any log level.

Secrets are planted through ``${VAR}`` in every field that can hold one (the store
URL's password, every SecretStr field of the connectors, Kafka ``client:`` and
``dead_letter_client:`` properties, a Kafka stream's ``schema_registry:`` password and
the password of its URL, a value from a variable with a secret-like name), and
the stdout and stderr of every command are scanned for them: ``validate`` (text and
JSON), ``config show`` (YAML and JSON), ``events list``/``tail``, ``store
list``/``get``, ``dlq list``/``redrive``/``purge``, and ``run`` (a real process with
the memory, Kafka and SQS connectors), in every log format and at every level, on
their error paths too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from acklane.core.cli.app import app
from acklane.core.connectors import available_connectors, load_connector
from acklane.core.observe import redact

#: Variable -> planted secret. The names are neutral where another rule must catch the
#: value (a SecretStr field, a secret-like key); PGPASS and BROKER_SECRET are caught by
#: their names (and the URL rule).
SECRETS = {
    "PGPASS": "PLANTED01-PgSecret99",
    "BROKER_SECRET": "PLANTED02-memory-broker",
    "K1": "PLANTED03-kafka-sasl",
    "K2": "PLANTED04-kafka-ssl-key-password",
    "K3": "PLANTED05-kafka-keystore-password",
    "K4": "PLANTED06-----BEGIN PRIVATE KEY-----",
    "K5": "PLANTED07-kafka-client-sasl",
    "K6": "PLANTED08-kafka-oauth-client-secret",
    "K7": "PLANTED09-kafka-dlq-ssl-key-password",
    "K8": "PLANTED14-schema-registry-password",
    "K9": "PLANTED15-schema-registry-ssl-key-password",
    "K10": "PLANTED16-schema-registry-url-password",
    "A1": "PLANTED10AWSKEYID",
    "A2": "PLANTED11-aws-secret-access-key",
    "A3": "PLANTED12-aws-session-token",
    "SB1": "Endpoint=sb://acklane-test.servicebus.windows.net/;"
    "SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=PLANTED13sbkey=",
}
#: Every planted value holds this word: output holding it has (part of) a secret.
MARKER = "PLANTED"

#: The SecretStr fields planted below, per connector.
PLANTED_FIELDS = {
    ("kafka", "sasl_password"),
    ("kafka", "ssl_key_password"),
    ("kafka", "ssl_keystore_password"),
    ("kafka", "ssl_key_pem"),
    ("kafka", "schema_registry.password"),
    ("kafka", "schema_registry.ssl_key_password"),
    ("sqs", "aws_access_key_id"),
    ("sqs", "aws_secret_access_key"),
    ("sqs", "aws_session_token"),
    ("servicebus", "connection_string"),
}

STREAMS = """\
streams:
  m: {connector: memory, broker: "${BROKER_SECRET}", topics: [t], dead_letter: d}
  typed:
    connector: kafka
    bootstrap_servers: 127.0.0.1:1
    topics: [t]
    group_id: g1
    security_protocol: SASL_SSL
    sasl_mechanism: PLAIN
    sasl_username: u
    sasl_password: ${K1}
    ssl_key_password: ${K2}
    ssl_keystore_password: ${K3}
    ssl_key_pem: ${K4}
    value_format: avro
    schema_registry:
      url: http://127.0.0.1:1
      username: registry-user
      password: ${K8}
      ssl_key_password: ${K9}
  free:
    connector: kafka
    bootstrap_servers: 127.0.0.1:1
    topics: [t2]
    group_id: g2
    client:
      security.protocol: SASL_PLAINTEXT
      sasl.mechanism: PLAIN
      sasl.username: u
      sasl.password: ${K5}
      sasl.oauthbearer.client.secret: ${K6}
    dead_letter_client:
      ssl.key.password: ${K7}
    key_format: json_schema
    schema_registry: {url: "http://registry-user:${K10}@127.0.0.1:1"}
  q:
    connector: sqs
    queue_name: q
    region: us-east-1
    endpoint_url: http://127.0.0.1:1
    aws_access_key_id: ${A1}
    aws_secret_access_key: ${A2}
    aws_session_token: ${A3}
watchers:
  - {name: wm, stream: m}
  - {name: wt, stream: typed}
  - {name: wf, stream: free}
  - {name: wq, stream: q}
"""

#: The store's password comes from ${PGPASS}; port 1 refuses connections (error paths).
UNREACHABLE_STORE = 'store: {url: "postgresql://postgres:${PGPASS}@127.0.0.1:1/acklane"}\n'
ENGINE = "engine: {shutdown_timeout: 3, restart_backoff_initial: 0.2, restart_backoff_max: 1}\n"


@pytest.fixture(autouse=True)
def _planted(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("COLUMNS", "80")


@pytest.fixture
def _no_retry_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore's retries of the refused SQS endpoint without their pauses: every
    attempt the client's retry settings ask for is still made and logged (in the
    standard and the legacy retry modes alike), but the random exponential backoff
    between them (up to 1 + 2 + 4 + 8 + 16 s a call) is not waited for. For the
    commands run in this process; what they print is the same."""
    try:
        from botocore import retryhandler
        from botocore.retries.standard import ExponentialBackoff
    except ImportError:  # pragma: no cover - the SQS connector is not installed
        return
    monkeypatch.setattr(ExponentialBackoff, "delay_amount", lambda self, context: 0.0)
    monkeypatch.setattr(retryhandler, "delay_exponential", lambda *args, **kwargs: 0.0)


def _leaks(text: str) -> list[str]:
    return [line for line in text.splitlines() if MARKER in line]


def _servicebus() -> str:
    """A Service Bus stream, when that connector is installed (not in ``run``: it would
    look for Azure)."""
    try:
        load_connector("servicebus")
    except Exception:
        return ""
    return "  sb:\n    connector: servicebus\n    connection_string: ${SB1}\n    queue: q\n"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _configs(tmp_path: Path) -> dict[str, Path]:
    streams = STREAMS.replace("watchers:\n", _servicebus() + "watchers:\n")
    valid = _write(tmp_path, "valid.yaml", ENGINE + UNREACHABLE_STORE + streams)
    # the same secrets, in a file with problems: a secret in a number field, a bad
    # client key holding a secret, a missing variable
    broken = (ENGINE + UNREACHABLE_STORE + streams).replace(
        "shutdown_timeout: 3", "shutdown_timeout: ${PGPASS}"
    )
    broken = broken.replace("      sasl.mechanism: PLAIN\n", "      Bad.Key: ${K5}\n")
    broken = broken.replace("group_id: g2", "group_id: ${UNSET_VARIABLE_FOR_THE_TEST}")
    return {"valid": valid, "broken": _write(tmp_path, "broken.yaml", broken)}


URL_WITH_PASSWORD = "postgresql://postgres:PgSecret99-store@127.0.0.1:1/acklane"

COMMANDS = [
    ["validate", "{cfg}"],
    ["validate", "--format", "json", "{cfg}"],
    ["config", "show", "{cfg}"],
    ["config", "show", "--format", "json", "{cfg}"],
    ["events", "list", "{cfg}"],
    ["events", "tail", "{cfg}"],
    ["store", "list", "{cfg}", "--asset", "a"],
    ["store", "get", "{cfg}", "k", "--task", "d/r/t"],
    ["store", "set", "{cfg}", "k", "1", "--task", "d/r/t", "--create"],
    ["run", "{cfg}"],  # with the broken file only: refused before anything starts
]


LEVELS_AND_FORMATS = [
    ("DEBUG", "text"),
    ("DEBUG", "json"),
    ("DEBUG", "rich"),
    ("INFO", "text"),
    ("WARNING", "json"),
    ("ERROR", "text"),
]


@pytest.mark.parametrize(("level", "log_format"), LEVELS_AND_FORMATS)
def test_no_command_prints_a_secret(tmp_path: Path, level: str, log_format: str) -> None:
    configs = _configs(tmp_path)
    runs: list[tuple[list[str], Any]] = []
    for which, cfg in configs.items():
        for command in COMMANDS:
            if command[0] == "run" and which == "valid":
                continue  # run for real: test_run_prints_no_secret
            args = [a.replace("{cfg}", str(cfg)) for a in command]
            result = CliRunner().invoke(
                app, ["--log-level", level, "--log-format", log_format, *args]
            )
            runs.append((args, result))
    for args in (
        ["events", "list", "--url", URL_WITH_PASSWORD],
        ["store", "list", "--asset", "a", "--url", URL_WITH_PASSWORD],
    ):
        # a password typed on the command line is masked too (the URL rule)
        runs.append((args, CliRunner().invoke(app, ["--log-level", level, *args])))
    for args, result in runs:
        output = result.stdout + result.stderr
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            args,
            output,
        )
        assert not _leaks(output), (args, _leaks(output), output)
    # and the commands did say something: the secrets were masked, not the messages
    texts = {" ".join(args[:3]): r.stdout + r.stderr for args, r in runs}
    assert any("***" in t for t in texts.values())
    shown = "\n".join(r.stdout for args, r in runs if args[:2] == ["config", "show"])
    assert "sasl.password: '***'" in shown and "aws_secret_access_key: '***'" in shown


def test_every_secret_field_of_the_installed_connectors_is_planted() -> None:
    """A connector that gains a SecretStr field must have it planted above."""

    def secret_fields(model: type[BaseModel], prefix: str = "") -> set[str]:
        found = set()
        for name, field in model.model_fields.items():
            annotation = repr(field.annotation)
            if "SecretStr" in annotation or "SecretBytes" in annotation:
                found.add(prefix + name)
            # a nested block, optional or not (``schema_registry: ... | None``)
            for sub in (field.annotation, *getattr(field.annotation, "__args__", ())):
                if isinstance(sub, type) and issubclass(sub, BaseModel):
                    found |= secret_fields(sub, f"{prefix}{name}.")
        return found

    seen = set()
    for name in available_connectors():
        try:
            connector = load_connector(name)
        except Exception:  # a connector that cannot load cannot be configured either
            continue
        seen |= {(name, field) for field in secret_fields(connector.config_model)}
    assert seen <= PLANTED_FIELDS, f"plant these in STREAMS too: {sorted(seen - PLANTED_FIELDS)}"
    assert {("kafka", "sasl_password"), ("sqs", "aws_secret_access_key")} <= seen


def _store_url(tmp_path: Path) -> str:
    """The test PostgreSQL (a schema of this test's) with ${PGPASS} as its password,
    else an unreachable server (the run then fails: an error path to scan as well)."""
    base = os.environ.get("ACKLANE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
    try:
        import psycopg

        with psycopg.connect(base, connect_timeout=3, autocommit=True) as conn:
            schema = f"secrets_{tmp_path.name[-12:].replace('-', '_')}_{os.getpid()}"
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    except Exception:
        return UNREACHABLE_STORE
    url = make_url(base).set(password="PGPASS_PLACEHOLDER")
    url = url.update_query_dict({"options": f"-csearch_path={schema}"})
    text = url.render_as_string(hide_password=False).replace("PGPASS_PLACEHOLDER", "${PGPASS}")
    return f"store: {{url: {json.dumps(text)}}}\n"


def _drop_schema(store_line: str) -> None:
    if "search_path" not in store_line:
        return
    import psycopg

    schema = store_line.split("search_path%3D")[-1].split('"')[0].split("&")[0]
    base = os.environ.get("ACKLANE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.mark.timeout(240)
def test_run_prints_no_secret(tmp_path: Path) -> None:
    """``acklane run`` for a few seconds with the memory, Kafka and SQS connectors (the
    brokers unreachable: their errors are logged), in every format and at every level,
    third-party logs included at DEBUG; then SIGTERM."""
    store = _store_url(tmp_path)
    cfg = _write(tmp_path, "run.yaml", ENGINE + store + STREAMS)
    variants = [
        ("DEBUG", "text", "DEBUG"),
        ("DEBUG", "json", "DEBUG"),
        ("INFO", "rich", "WARNING"),
        ("WARNING", "text", "WARNING"),
        ("ERROR", "json", "WARNING"),
    ]
    env = {**os.environ, **SECRETS, "COLUMNS": "120"}
    procs = []
    try:
        for level, log_format, third in variants:
            args = ["--log-level", level, "--log-format", log_format, "--log-third-party", third]
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "acklane.core.cli", *args, "run", str(cfg)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env=env,
                )
            )
        lines: list[list[str]] = [[] for _ in procs]
        readers = [
            threading.Thread(target=lambda p=p, out=out: out.extend(p.stdout), daemon=True)
            for p, out in zip(procs, lines, strict=True)
        ]
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + 90
        talkative = [i for i, v in enumerate(variants) if v[0] in ("DEBUG", "INFO")]
        while time.monotonic() < deadline and not all(
            procs[i].poll() is not None or "Watching" in "".join(lines[i]) for i in talkative
        ):
            time.sleep(0.1)
        time.sleep(3)  # the connectors try their brokers, fail, and say so
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            # an unreachable Kafka cluster holds the exit ~20 s past shutdown_timeout
            proc.wait(timeout=120)
        for reader in readers:
            reader.join(timeout=10)
        outputs = ["".join(out) for out in lines]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        _drop_schema(store)
    for (level, log_format, _), output in zip(variants, outputs, strict=True):
        assert not _leaks(output), (level, log_format, _leaks(output), output)
    assert "Starting the pipeline" in outputs[0]
    if "search_path" in store:  # the store was reachable: the pipeline ran
        assert "Watching" in outputs[0], outputs[0]
        assert "Kafka" in outputs[0] or "kafka" in outputs[0], outputs[0]


# -- the redaction rule itself ----------------------------------------------------------


def test_the_rule_masks_url_passwords_and_secret_named_pairs() -> None:
    text = (
        "postgresql://u:pw0rd@h/db?password=qs-secret&sslmode=require "
        "Endpoint=sb://x/;SharedAccessKeyName=root;SharedAccessKey=azkey123= "
        "{'sasl.password': 'kafka-pw', 'group.id': 'g'} token=abc123"
    )
    masked = redact.redact(text)
    for secret in ("pw0rd", "qs-secret", "azkey123", "kafka-pw", "abc123"):
        assert secret not in masked
    assert "SharedAccessKeyName=root" in masked and "'group.id': 'g'" in masked
    assert "sslmode=require" in masked


def test_registered_secrets_are_masked_in_every_escaped_form() -> None:
    secret = 'quote"and\\slash'
    redact.remember([secret])
    assert secret not in redact.redact_known(f"x {secret} y")
    assert json.dumps(secret)[1:-1] not in redact.redact_known(json.dumps({"v": secret}))
    assert repr(secret)[1:-1] not in redact.redact_known(repr({"v": secret}))


def test_short_values_are_not_searched_for_in_free_text() -> None:
    redact.remember(["abc"])
    assert redact.redact_known("abc 1234") == "abc 1234"


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("PGPASS", True),
        ("AWS_SECRET", True),
        ("sasl.password", True),
        ("ssl_key_pem", True),
        ("sasl.oauthbearer.client.secret", True),
        ("connection_string", True),
        ("api_key", True),
        ("ssl_key_location", False),
        ("sasl.oauthbearer.token.endpoint.url", False),
        ("group_id", False),
        ("ACKLANE_STORE_URL", False),
    ],
)
def test_secret_like_names(name: str, secret: bool) -> None:
    assert redact.is_secret_name(name) is secret


def test_a_stream_wrapped_by_the_guard_masks_known_secrets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    redact.remember(["guarded-secret-value"])
    with redact.guard_std_streams():
        print("value: guarded-secret-value")
        sys.stderr.write("err guarded-secret-value\n")
    out, err = capsys.readouterr()
    assert "guarded-secret-value" not in out + err
    assert "value: ***" in out


def test_the_validate_summary_of_the_reviewers_report(tmp_path: Path) -> None:
    """The reviewer's case: ``events stored in postgresql://postgres:PgSecret99@...``."""
    cfg = _write(
        tmp_path,
        "p.yaml",
        textwrap.dedent(
            """\
            store: {url: "postgresql://postgres:${PGPASS}@db.example:5432/acklane"}
            streams: {s: {connector: memory, topics: [t]}}
            watchers: [{name: w, stream: s}]
            """
        ),
    )
    result = CliRunner().invoke(app, ["validate", str(cfg)])
    assert result.exit_code == 0, result.output
    assert "events stored in postgresql://postgres:***@db.example:5432/acklane" in result.stdout
    assert MARKER not in result.stdout


#: The commands added with the production round, on the error paths the planted file
#: reaches (every broker and the store refuse connections): validate --connect, events
#: prune, publish through each broker's stream.
NEWER_COMMANDS = [
    ["validate", "--connect", "--timeout", "2", "{cfg}"],
    ["validate", "--connect", "--timeout", "2", "--format", "json", "{cfg}"],
    ["events", "prune", "--config", "{cfg}", "--dry-run"],
    ["publish", "{cfg}", "m", "hello"],
    ["publish", "{cfg}", "q", "hello"],
]


@pytest.mark.usefixtures("_no_retry_pauses")
@pytest.mark.parametrize(("level", "log_format"), [("DEBUG", "text"), ("DEBUG", "json")])
def test_the_newer_commands_print_no_secret(tmp_path: Path, level: str, log_format: str) -> None:
    configs = _configs(tmp_path)
    said: list[str] = []
    for cfg in configs.values():
        for command in NEWER_COMMANDS:
            args = [a.replace("{cfg}", str(cfg)) for a in command]
            result = CliRunner().invoke(
                app, ["--log-level", level, "--log-format", log_format, *args]
            )
            output = result.stdout + result.stderr
            assert result.exception is None or isinstance(result.exception, SystemExit), (
                args,
                output,
            )
            assert not _leaks(output), (args, _leaks(output), output)
            said.append(output)
    # they did report the failures (with the secrets masked), not nothing
    assert any("***" in text for text in said)


CASES = """\
stream: m
cases:
  - name: a payload holding secrets, in a failing case's diff
    message:
      body: {password: "${PGPASS}", token: "${BROKER_SECRET}"}
      attributes: {auth: "${A2}"}
    expect:
      wm: {fire: [{password: "not it"}]}
"""


@pytest.mark.parametrize("output", ["text", "junit"])
def test_acklane_test_prints_no_secret(tmp_path: Path, output: str) -> None:
    cfg = _configs(tmp_path)["valid"]
    cases = _write(tmp_path, "valid.tests.yaml", CASES)
    result = CliRunner().invoke(
        app, ["--log-level", "DEBUG", "test", str(cfg), str(cases), "--format", output]
    )
    text = result.stdout + result.stderr
    assert result.exit_code == 1, text  # the case failed, and its diff was printed
    assert "password" in text and "***" in text, text
    assert not _leaks(text), (_leaks(text), text)


#: ``acklane dlq`` on the error paths of the planted file: a connector without a reader,
#: an SQS endpoint that refuses connections (botocore tries five times: one command), a
#: Kafka stream without a dead-letter topic.
DLQ_COMMANDS = [
    ["dlq", "list", "{cfg}", "m"],
    ["dlq", "redrive", "{cfg}", "q", "--dry-run", "--format", "json"],
    ["dlq", "purge", "{cfg}", "free", "--yes"],
]


@pytest.mark.usefixtures("_no_retry_pauses")
def test_the_dlq_commands_print_no_secret(tmp_path: Path) -> None:
    configs = _configs(tmp_path)
    said: list[str] = []
    for cfg in configs.values():
        for command in DLQ_COMMANDS:
            args = [a.replace("{cfg}", str(cfg)) for a in command]
            result = CliRunner().invoke(app, ["--log-level", "DEBUG", *args])
            output = result.stdout + result.stderr
            assert result.exit_code in (1, 2), (args, output)
            assert not _leaks(output), (args, _leaks(output), output)
            said.append(output)
    # they did report the failures, not nothing
    assert any("Could not connect to the endpoint" in text for text in said)
    assert any("invalid configuration" in text for text in said)


SINKS_CONFIG = """\
store: {url: "sqlite:///{db}"}
streams:
  m: {connector: memory, broker: sinks-secrets, topics: [t]}
sinks:
  - name: hook
    kind: webhook
    url: "http://127.0.0.1:1/hook?token=${HOOKTOKEN}"
    secret: "${HOOKKEY}"
    headers: {Authorization: "Bearer ${HOOKBEARER}", X-Api-Key: "${HOOKAPIKEY}"}
  - name: airflow
    kind: airflow
    url: http://127.0.0.1:1
    username: admin
    password: "${AIRFLOWPASS}"
  - name: basic
    kind: webhook
    url: "http://user:${HOOKPASS}@127.0.0.1:1/hook"
watchers:
  - {name: w, stream: m, asset: orders, sinks: [hook, airflow, basic]}
"""
SINK_SECRETS = {
    "HOOKPASS": "PLANTED20-url-password",
    "HOOKTOKEN": "PLANTED21-url-token",
    "HOOKKEY": "PLANTED22-hmac-signing-key",
    "HOOKBEARER": "PLANTED23-bearer-token",
    "HOOKAPIKEY": "PLANTED24-api-key",
    "AIRFLOWPASS": "PLANTED25-airflow-password",
}


def test_the_sinks_commands_print_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SINK_SECRETS.items():
        monkeypatch.setenv(name, value)
    cfg = _write(tmp_path, "sinks.yaml", SINKS_CONFIG.replace("{db}", str(tmp_path / "e.db")))
    runs = []
    for command in (
        ["validate", str(cfg)],
        ["validate", "--connect", "--timeout", "2", str(cfg)],
        ["config", "show", str(cfg)],
        ["sinks", "status", str(cfg)],
        ["sinks", "status", str(cfg), "--format", "json"],
        ["sinks", "parked", str(cfg), "hook"],
        ["sinks", "retry", str(cfg), "hook", "--all"],
        ["events", "replay", str(cfg), "--watcher", "w", "--sink", "airflow"],
    ):
        for level in ("DEBUG", "INFO"):
            result = CliRunner().invoke(app, ["--log-level", level, *command])
            runs.append((command, result.stdout + result.stderr))
    for command, output in runs:
        assert not _leaks(output), (command, _leaks(output), output)
    connect = next(o for c, o in runs if "--connect" in c)
    assert "sink hook" in connect and "sink airflow" in connect


def test_a_redacting_stream_whose_target_was_closed_is_collected_without_an_error() -> None:
    # Python 3.13 reports what a stream's finalizer raises (its close flushes): a
    # wrapper of a stream closed first (a test runner's capture) must not raise there.
    import gc
    import io

    target = io.TextIOWrapper(io.BytesIO())  # (flushing a closed StringIO does not raise)
    stream = redact.RedactingStream(target)
    stream.write("x")
    target.close()
    raised: list[Any] = []
    previous = sys.unraisablehook
    sys.unraisablehook = raised.append
    try:
        del stream
        gc.collect()
    finally:
        sys.unraisablehook = previous
    assert raised == []


def test_top_prints_no_secret(tmp_path: Path) -> None:
    """``acklane top``: a password in ``--url`` is masked in every frame it prints, and
    a configuration's secrets stay out of its error paths (no metrics port; broken)."""
    url = f"http://watch:{SECRETS['PGPASS']}@127.0.0.1:1"
    said = []
    for args in (
        ["top", "--once", "--url", url],
        *(["top", "--once", str(cfg)] for cfg in _configs(tmp_path).values()),
    ):
        result = CliRunner().invoke(app, ["--log-level", "DEBUG", *args], env={"COLUMNS": "200"})
        output = result.stdout + result.stderr
        assert isinstance(result.exception, SystemExit), (args, output)
        assert not _leaks(output), (args, _leaks(output), output)
        said.append(output)
    assert "no answer from http://watch:***@127.0.0.1:1" in said[0]
    assert "metrics.port is not set" in said[1]


TRACING_CONFIG = """\
store: {url: "sqlite:///{db}"}
engine: {shutdown_timeout: 3}
tracing:
  enabled: true
  endpoint: "http://otel:${OTLPPASS}@127.0.0.1:1"
  headers: {authorization: "Bearer ${OTLPBEARER}", x-team-key: "${OTLPTEAM}"}
streams:
  m: {connector: memory, broker: tracing-secrets, topics: [t], group_id: g, poll_interval: 0.02}
watchers:
  - {name: w, stream: m}
"""
TRACING_SECRETS = {
    "OTLPPASS": "PLANTED30-otlp-url-password",
    "OTLPBEARER": "PLANTED31-otlp-bearer",
    "OTLPTEAM": "PLANTED32-otlp-team-key",
}
#: ``acklane run`` in a process whose memory broker holds messages (published before the
#: CLI starts, in the same process): spans are made, and their export fails.
TRACED_RUN = """\
import os, signal, sys, threading, time
from acklane.connectors.memory import MemoryBroker
config, traceparent, linger = sys.argv[1], sys.argv[2], float(sys.argv[3])
broker = MemoryBroker.get("tracing-secrets")
broker.create_topic("t", 1)
for i in range(5):
    broker.publish("t", b'{"id": %d}' % i, "k", {"traceparent": traceparent})
def stop():  # once every message is committed (its span ended), and a bit more
    while broker.committed("g", "t", 0) < 5:
        time.sleep(0.05)
    time.sleep(linger)
    os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=stop, daemon=True).start()
sys.argv = ["acklane", "--log-level", "DEBUG", "--log-third-party", "DEBUG", "run", config]
from acklane.core.cli.app import main
main()
"""


def test_tracing_prints_no_secret(tmp_path: Path) -> None:
    """The start-up line, the export to a collector that refuses connections (its
    retries and errors, urllib3's DEBUG lines), ``config show``: no credential of the
    endpoint URL, the headers or ``OTEL_EXPORTER_OTLP_HEADERS`` appears."""
    cfg = _write(tmp_path, "traced.yaml", TRACING_CONFIG.replace("{db}", str(tmp_path / "e.db")))
    env = {
        **os.environ,
        **TRACING_SECRETS,
        "OTEL_EXPORTER_OTLP_HEADERS": "x-env-key=PLANTED33-otlp-env-header",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    done = subprocess.run(
        [sys.executable, "-c", TRACED_RUN, str(cfg), traceparent, "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Tracing on: spans go to http://otel:***@127.0.0.1:1/v1/traces" in output, output
    assert "opentelemetry" in output  # the exporter did try, and said it failed
    assert not _leaks(output), (_leaks(output), output)
    for name, value in TRACING_SECRETS.items():
        os.environ.setdefault(name, value)
    try:
        result = CliRunner().invoke(app, ["config", "show", str(cfg)])
    finally:
        for name in TRACING_SECRETS:
            os.environ.pop(name, None)
    assert "tracing:" in result.stdout and "127.0.0.1:1" in result.stdout
    assert not _leaks(result.stdout + result.stderr), result.stdout
