"""The command line: --version, completion, validate --format json, config show, and the
commands that only read the store section of a configuration."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

# command_of: which command the signals are taken over for, before typer parses
from acklane.core.cli.app import app, command_of
from acklane.core.events import EventStore

runner = CliRunner()

SQS_PIPELINE = """\
store: {{url: "sqlite:///{db}"}}
streams:
  q:
    connector: sqs
    queue_name: orders
    region: eu-west-1
    aws_access_key_id: ${{AWS_KEY_ID}}
    aws_secret_access_key: ${{AWS_SECRET}}
watchers:
  - {{name: w, stream: q}}
"""


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.startswith("acklane ") and "acklane-core " in result.stdout


def test_shell_completion_is_offered() -> None:
    result = runner.invoke(app, ["--help"])
    assert "--install-completion" in result.stdout and "--show-completion" in result.stdout
    # typer's own switch: take the shell named, not the one it finds among the parent
    # processes (there may be none: a test run started by a service, not a shell)
    script = subprocess.run(
        [sys.executable, "-m", "acklane.core.cli", "--show-completion", "bash"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"},
    )
    assert script.returncode == 0 and "complete" in script.stdout


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["run", "p.yaml"], "run"),
        (["--log-level", "DEBUG", "run", "p.yaml"], "run"),
        (["--log-format=json", "--log-third-party", "INFO", "run", "p.yaml"], "run"),
        (["--log-level", "run"], None),  # "run" is the option's value
        (["validate", "run.yaml"], "validate"),
    ],
)
def test_the_command_is_found_behind_global_options(argv: list[str], command: str | None) -> None:
    # `acklane --log-level DEBUG run` takes the signals over from the first line too
    assert command_of(argv) == command


def test_events_and_store_read_only_the_store_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reviewer's case: ``AWS_SECRET is not set`` for ``events list sqs.yaml``."""
    monkeypatch.delenv("AWS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET", raising=False)
    db = tmp_path / "e.db"
    cfg = tmp_path / "sqs.yaml"
    cfg.write_text(SQS_PIPELINE.format(db=db))
    created = runner.invoke(app, ["store", "set", str(cfg), "k", "1", "-a", "x", "--create"])
    assert created.exit_code == 0, created.output
    listed = runner.invoke(app, ["store", "list", str(cfg), "--asset", "x"])
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout) == ["k"]
    events = runner.invoke(app, ["events", "list", str(cfg)])
    assert "AWS_SECRET" not in events.output
    assert "holds no event store" in events.output  # it got as far as the database


def test_a_problem_in_the_store_section_is_still_reported(tmp_path: Path) -> None:
    cfg = tmp_path / "p.yaml"
    cfg.write_text('store: {url: "sqlite:///${NO_SUCH_DB_VARIABLE}"}\nstreams: 5\n')
    result = runner.invoke(app, ["events", "list", "--config", str(cfg)])
    assert result.exit_code == 1
    assert f"{cfg}:1: store.url: environment variable NO_SUCH_DB_VARIABLE" in result.output
    assert "streams" not in result.output


@pytest.mark.parametrize("command", [["events", "list"], ["store", "list", "--asset", "a"]])
def test_a_missing_sqlite_file_is_refused_and_not_created(
    tmp_path: Path, command: list[str]
) -> None:
    typo = tmp_path / "typo.db"
    result = runner.invoke(app, [*command, "--url", f"sqlite:///{typo}"])
    assert result.exit_code != 0
    assert f"no SQLite database at {typo}" in result.output
    assert not typo.exists()


def test_store_set_creates_the_database_when_asked(tmp_path: Path) -> None:
    new = tmp_path / "new.db"
    refused = runner.invoke(app, ["store", "set", "k", "1", "-a", "a", "--url", f"sqlite:///{new}"])
    assert refused.exit_code == 2 and "--create" in refused.stderr and not new.exists()
    made = runner.invoke(
        app, ["store", "set", "k", "1", "-a", "a", "--url", f"sqlite:///{new}", "--create"]
    )
    assert made.exit_code == 0, made.output
    assert new.exists()


async def _open_and_close(store: EventStore) -> None:
    async with store:
        pass


def _store_pipeline(tmp_path: Path) -> Path:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f'store: {{url: "sqlite:///{tmp_path / "e.db"}"}}\n')
    made = runner.invoke(app, ["store", "set", str(cfg), "k", "7", "-a", "a", "--create"])
    assert made.exit_code == 0, made.output
    asyncio.run(_open_and_close(EventStore(f"sqlite:///{tmp_path / 'e.db'}")))  # its table
    return cfg


@pytest.mark.parametrize(
    "command",
    [
        ["events", "list", "{cfg}"],
        ["store", "list", "{cfg}", "-a", "a"],
        ["store", "get", "{cfg}", "k", "-a", "a"],
    ],
)
def test_the_configuration_is_the_first_argument_of_every_command(
    tmp_path: Path, command: list[str]
) -> None:
    cfg = _store_pipeline(tmp_path)
    result = runner.invoke(app, [word.format(cfg=cfg) for word in command])
    assert result.exit_code == 0, result.output
    assert "deprecated" not in result.stderr


@pytest.mark.parametrize(
    "command",
    [["events", "list"], ["store", "list", "-a", "a"], ["store", "get", "k", "-a", "a"]],
)
def test_the_old_config_option_still_works_with_a_one_line_note(
    tmp_path: Path, command: list[str]
) -> None:
    cfg = _store_pipeline(tmp_path)
    result = runner.invoke(app, [*command, "--config", str(cfg)])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if "deprecated" in line]
    assert len(notes) == 1 and f"{cfg}" in notes[0], result.stderr
    both = runner.invoke(app, [*command[:2], str(cfg), *command[2:], "--config", str(cfg)])
    assert both.exit_code == 2 and "give CONFIG once" in both.stderr


def test_store_get_names_what_it_expected_for_a_wrong_count(tmp_path: Path) -> None:
    result = runner.invoke(app, ["store", "get", "a", "b", "c", "--url", "sqlite://"])
    assert result.exit_code == 2 and "expected [CONFIG] KEY" in result.stderr


BAD = """\
engine:
  ack_timout: 5
streams:
  orders: {connector: memory, topics: [orders]}
watchers:
  - {name: w, stream: ordrs}
"""


def test_validate_json_lists_every_problem_with_file_line_field_and_message(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(BAD)
    result = runner.invoke(app, ["validate", "--format", "json", str(cfg)])
    assert result.exit_code == 2
    document = json.loads(result.stdout)
    assert document["valid"] is False
    assert document["problems"] == [
        {
            "file": str(cfg),
            "line": 2,
            "field": "engine.ack_timout",
            "message": "unknown field; did you mean 'ack_timeout'? (expected one of: "
            "ack_timeout, subscriber_queue_size, cohort_grace_period, overflow, "
            "restart_backoff_initial, restart_backoff_max, max_restarts, shutdown_timeout, "
            "progress_interval, lag_interval, inline_filters)",
        },
        {
            "file": str(cfg),
            "line": 6,
            "field": "watchers[0].stream",
            "message": "unknown stream 'ordrs'; did you mean 'orders'? known streams: orders",
        },
    ]


def test_validate_json_of_a_valid_file(tmp_path: Path) -> None:
    cfg = tmp_path / "ok.yaml"
    cfg.write_text(BAD.replace("ack_timout", "ack_timeout").replace("ordrs", "orders"))
    result = runner.invoke(app, ["validate", "--format", "json", str(cfg)])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["valid"] is True and document["problems"] == []
    assert [w["name"] for w in document["watchers"]] == ["w"]


def test_validate_json_of_an_unreadable_file(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", "--format", "json", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    [problem] = json.loads(result.stdout)["problems"]
    assert problem["line"] is None and "cannot read" in problem["message"]


def test_config_show_prints_the_resolved_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DB_PASSWORD", "s3cr3t-for-show")
    monkeypatch.setenv("ACK", "42")
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        textwrap.dedent(
            """\
            engine: {ack_timeout: "${ACK}"}
            store: {url: "postgresql://acklane:${DB_PASSWORD}@db:5432/acklane"}
            streams:
              orders: {connector: memory, topics: [orders]}
            watchers:
              - {name: w, stream: orders, filter: {match: {body.amount: {gt: 1}}}}
            """
        )
    )
    result = runner.invoke(app, ["config", "show", "--format", "json", str(cfg)])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["engine"]["ack_timeout"] == 42  # substituted and converted
    assert document["engine"]["shutdown_timeout"] == 30  # a default, filled in
    assert document["store"]["url"] == "postgresql://acklane:***@db:5432/acklane"
    assert document["streams"]["orders"] == {
        "connector": "memory",
        "broker": "default",
        "topics": ["orders"],
        "group_id": "acklane",
        "partitions": 3,
        "dead_letter": None,
        "batch_size": 256,
        "poll_interval": 1.0,
        "max_attempts": 5,
    }
    assert document["watchers"][0]["filter"]["match"] == {"body.amount": {"gt": 1}}
    yaml_text = runner.invoke(app, ["config", "show", str(cfg)]).stdout
    assert "url: postgresql://acklane:***@db:5432/acklane" in yaml_text
    assert "s3cr3t" not in yaml_text + result.stdout


OLD_NAMES_PIPELINE = """\
store: {{url: "sqlite:///{db}"}}
streams:
  orders:
    connector: memory
    topics: [orders]
    dlq_topic: orders.dlq
watchers:
  - {{name: all, stream: orders}}
"""


def test_validate_lists_old_setting_names_at_their_line_with_the_new_ones(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "pipeline.yaml"
    cfg.write_text(OLD_NAMES_PIPELINE.format(db=tmp_path / "e.db"))
    text = runner.invoke(app, ["validate", str(cfg)])
    assert text.exit_code == 0, text.output  # they still work
    assert (
        f"old name {cfg}:6: streams.orders.dlq_topic: deprecated, now called dead_letter"
        in " ".join(text.output.split())
    )
    document = json.loads(runner.invoke(app, ["validate", "--format", "json", str(cfg)]).stdout)
    assert document["valid"] is True
    assert document["deprecations"] == [
        {
            "file": str(cfg),
            "line": 6,
            "field": "streams.orders.dlq_topic",
            "message": "deprecated, now called dead_letter; the old name still works for now",
        }
    ]


def test_a_command_that_loads_the_pipeline_logs_its_old_setting_names(tmp_path: Path) -> None:
    cfg = tmp_path / "pipeline.yaml"
    cfg.write_text(OLD_NAMES_PIPELINE.format(db=tmp_path / "e.db"))
    shown = subprocess.run(
        [sys.executable, "-m", "acklane.core.cli", "config", "show", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "ACKLANE_LOG_FORMAT": "text", "COLUMNS": "200"},
    )
    assert shown.returncode == 0, shown.stderr
    [line] = [line for line in shown.stderr.splitlines() if "dlq_topic" in line]
    assert " WARNING " in line and f"{cfg}:6: streams.orders.dlq_topic" in line
    assert "FutureWarning" not in shown.stderr  # a log line, not Python's warning
    assert "dead_letter: orders.dlq" in shown.stdout  # shown under its new name
