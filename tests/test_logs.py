"""Logs of the command line: one line per record off a terminal, JSON, levels, third parties."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from acklane.core.cli.app import app
from acklane.core.observe.logs import LogFormat, configure_logging, default_format, restore_logging

TEXT_RECORD = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: "
)

NOISY_FILTER = """\
import logging

log = logging.getLogger("acklane.test.noisy")
log.warning("a message\\nover two lines and longer than eighty columns " + "x" * 80)
try:
    raise ValueError("boom")
except ValueError:
    log.exception("an error with its traceback")


def fire(message):
    return {"n": 1}
"""


def _run_piped(tmp_path: Path, *options: str) -> str:
    """``acklane [options] run`` with stderr to a file, until it watches, then SIGTERM."""
    (tmp_path / "noisy_filter.py").write_text(NOISY_FILTER)
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        textwrap.dedent(
            f"""\
            store: {{url: "sqlite:///{tmp_path / "e.db"}"}}
            streams:
              s: {{connector: memory, topics: [t]}}
            watchers:
              - {{name: w, stream: s, filter: {{function: "noisy_filter:fire"}}}}
            """
        )
    )
    log_file = tmp_path / "acklane.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]), "COLUMNS": "80"}
    with log_file.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "acklane.core.cli", *options, "run", str(cfg)],
            stdout=out,
            stderr=out,
            env=env,
        )
        try:
            for _ in range(600):
                if "Shared stream group started" in log_file.read_text():
                    break
                if proc.poll() is not None:
                    break
                import time

                time.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, log_file.read_text()
    return log_file.read_text()


def test_run_piped_to_a_file_writes_one_line_per_record(tmp_path: Path) -> None:
    text = _run_piped(tmp_path)
    lines = text.splitlines()
    assert lines, text
    for line in lines:
        assert TEXT_RECORD.match(line), f"not a record of its own: {line!r}\n{text}"
    assert any("a message\\nover two lines" in line for line in lines)
    traceback = next(line for line in lines if "an error with its traceback" in line)
    assert "Traceback (most recent call last):\\n" in traceback and "ValueError: boom" in traceback
    assert any("Starting the pipeline" in line for line in lines)
    assert any("Stopping" in line for line in lines)


def test_the_json_format_parses_line_by_line(tmp_path: Path) -> None:
    text = _run_piped(tmp_path, "--log-format", "json", "--log-level", "DEBUG")
    records = [json.loads(line) for line in text.splitlines()]
    assert records
    for record in records:
        assert {"time", "level", "logger", "message"} <= set(record)
    error = next(r for r in records if r["message"] == "an error with its traceback")
    assert error["level"] == "ERROR" and "ValueError: boom" in error["exception"]
    assert any(r["logger"] == "acklane.core.pipeline.runner" for r in records)


def test_the_log_format_can_come_from_the_environment(tmp_path: Path) -> None:
    os.environ["ACKLANE_LOG_FORMAT"] = "json"
    try:
        text = _run_piped(tmp_path)
    finally:
        del os.environ["ACKLANE_LOG_FORMAT"]
    assert all(json.loads(line)["message"] is not None for line in text.splitlines())


@pytest.mark.parametrize(
    "args",
    [["--log-level", "verbose", "validate", "x.yaml"], ["run", "x.yaml", "--log-level", "loud"]],
)
def test_an_invalid_level_is_a_clear_error_not_a_traceback(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "Invalid value for '--log-level'" in result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_an_invalid_level_in_the_environment_names_the_variable() -> None:
    result = CliRunner().invoke(app, ["validate", "x.yaml"], env={"ACKLANE_LOG_LEVEL": "loud"})
    assert result.exit_code == 2
    assert "ACKLANE_LOG_LEVEL" in result.output and "'loud'" in result.output


def test_the_global_level_applies_to_every_command(tmp_path: Path) -> None:
    """``--log-level`` goes before any command, including the ones of sub-apps."""
    result = CliRunner().invoke(
        app, ["--log-level", "debug", "events", "list", "--url", f"sqlite:///{tmp_path}/x.db"]
    )
    assert result.exit_code == 1 and "no SQLite database" in result.output


@pytest.fixture
def captured(capsys: pytest.CaptureFixture[str]) -> Iterator[pytest.CaptureFixture[str]]:
    """stderr as the handler sees it (it writes to whatever sys.stderr is)."""
    try:
        yield capsys
    finally:
        restore_logging()


def test_third_party_loggers_stay_at_warning_unless_asked(
    captured: pytest.CaptureFixture[str],
) -> None:
    configure_logging("DEBUG", "text")
    logging.getLogger("botocore.endpoint").debug("third-party debug")
    logging.getLogger("aiosqlite").info("third-party info")
    logging.getLogger("sqlalchemy.engine").warning("third-party warning")
    logging.getLogger("acklane.connectors.kafka.librdkafka").debug("librdkafka is ours")
    text = captured.readouterr().err
    assert "third-party debug" not in text and "third-party info" not in text
    assert "third-party warning" in text and "librdkafka is ours" in text

    configure_logging("DEBUG", "text", third_party="DEBUG")
    logging.getLogger("botocore.endpoint").debug("now shown")
    assert "now shown" in captured.readouterr().err


def test_a_record_is_one_line_and_masks_secrets(captured: pytest.CaptureFixture[str]) -> None:
    configure_logging("INFO", "text")
    logging.getLogger("acklane.test").info(
        "connect to %s\nsecond line", "postgresql://u:hunter2hunter@h/db"
    )
    text = captured.readouterr().err
    assert text.count("\n") == 1 and "hunter2hunter" not in text
    assert "postgresql://u:***@h/db\\nsecond line" in text


def test_restore_puts_back_the_levels_and_handlers() -> None:
    root = logging.getLogger()
    before = (root.level, list(root.handlers), logging.getLogger("acklane").level)
    configure_logging("DEBUG", "json")
    configure_logging("ERROR", "text")
    restore_logging()
    assert (root.level, list(root.handlers), logging.getLogger("acklane").level) == before


def test_rich_is_the_default_on_a_terminal_only() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert default_format(Tty()) is LogFormat.RICH
    assert default_format(io.StringIO()) is LogFormat.TEXT


def test_validate_problems_are_one_line_each_off_a_terminal(tmp_path: Path) -> None:
    cfg = tmp_path / "p.yaml"
    long_name = "a-stream-with-a-name-long-enough-to-pass-eighty-columns-" + "x" * 30
    cfg.write_text(
        f"streams:\n  s: {{connector: memory, topics: [t]}}\nwatchers:\n"
        f"  - {{name: w, stream: {long_name}}}\n"
    )
    result = CliRunner().invoke(app, ["validate", str(cfg)], env={"COLUMNS": "80"})
    assert result.exit_code == 2
    line = next(x for x in result.stderr.splitlines() if "watchers[0].stream" in x)
    assert line.startswith(f"invalid configuration: {cfg}:4: watchers[0].stream: unknown stream")
    assert "known streams: s" in line
