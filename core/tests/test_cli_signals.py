"""``acklane run`` and SIGINT/SIGTERM during its start-up, before the runner's handlers.

Start-up is made slow the way a real pipeline's is: the configuration names a filter
module, imported while the configuration loads, that takes its time to import. The
signal is sent while that import runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SLOW_MODULE = """\
import sys
import time

print("slow_filters: importing", file=sys.stderr, flush=True)
time.sleep({seconds})


def fire(message):
    return {{"n": 1}}
"""


def _start(
    tmp_path: Path, seconds: float, *options: str, filter_function: str = "slow_filters:fire"
) -> tuple[subprocess.Popen[str], Path]:
    (tmp_path / "slow_filters.py").write_text(SLOW_MODULE.format(seconds=seconds))
    db = tmp_path / "e.db"
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        textwrap.dedent(
            f"""\
            store: {{url: "sqlite:///{db}"}}
            streams:
              s: {{connector: memory, topics: [t]}}
            watchers:
              - {{name: w, stream: s, filter: {{function: "{filter_function}"}}}}
            """
        )
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]),
        "COLUMNS": "200",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "acklane.core.cli", *options, "run", str(cfg)],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    return proc, db


BUSY_MODULE = """\
import sys
import time

from acklane.connectors.memory import MemoryBroker

MemoryBroker.get().publish("t", b"{}")


def hold(message):
    print("busy_filters: holding", file=sys.stderr, flush=True)
    time.sleep(2)
    return {"n": 1}
"""


def _wait_for(proc: subprocess.Popen[str], text: str) -> str:
    assert proc.stderr is not None
    seen = ""
    for line in proc.stderr:
        seen += line
        if text in line:
            return seen
    raise AssertionError(f"{text!r} never printed:\n{seen}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_start_up_stops_the_pipeline_gracefully(
    tmp_path: Path, sig: signal.Signals
) -> None:
    proc, db = _start(tmp_path, seconds=1.5)
    try:
        before = _wait_for(proc, "slow_filters: importing")  # the configuration is loading
        assert "Starting the pipeline" in before  # the handlers were in place before this
        proc.send_signal(sig)
        out = before + proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "Traceback" not in out
    assert f"{sig.name} during start-up" in out
    assert "Stopped before the pipeline started" in out
    assert "Shared stream group started" not in out  # it stopped before it started
    assert not db.exists()  # nor was the event store opened


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Whether the process has a handler for ``sig`` (Linux: SigCgt in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/PID/status")
def test_sigterm_is_caught_from_the_first_lines_of_the_command_line_module(
    tmp_path: Path,
) -> None:
    # Sent the moment the process catches SIGTERM at all: while it still imports the
    # CLI's own dependencies, long before the runner's event loop takes the signals over.
    proc, db = _start(tmp_path, seconds=1.5)
    try:
        deadline = time.monotonic() + 60
        while not _catches(proc.pid, signal.SIGTERM):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.001)
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "Traceback" not in out
    assert "SIGTERM during start-up" in out
    assert "Stopped before the pipeline started" in out
    assert not db.exists()


def test_a_second_signal_during_start_up_exits_at_once(tmp_path: Path) -> None:
    proc, _ = _start(tmp_path, seconds=30)
    try:
        before = _wait_for(proc, "slow_filters: importing")
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out = before + proc.communicate(timeout=20)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert time.monotonic() - started < 20  # did not wait for the 30 s import
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "Second signal during start-up" in out
    assert "Traceback" not in out


def test_global_options_before_run_keep_the_start_up_handlers(tmp_path: Path) -> None:
    """``acklane --log-format json --log-level INFO run``: still ``run`` from the first line."""
    proc, db = _start(tmp_path, 1.5, "--log-format", "json", "--log-level", "INFO")
    try:
        before = _wait_for(proc, "slow_filters: importing")
        proc.send_signal(signal.SIGTERM)
        out = before + proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    messages = [r["message"] for r in records]
    assert "SIGTERM during start-up: stopping before the pipeline starts" in messages
    assert "Stopped before the pipeline started: nothing to finish" in messages
    assert not db.exists()


def test_a_second_signal_while_stopping_exits_at_once_without_a_traceback(
    tmp_path: Path,
) -> None:
    """Two SIGTERMs in a row (what a process-group kill under `uv run` sends): the second
    cuts the graceful stop short with one line and 128 + the signal's number."""
    # A filter that holds the loop on the one message its module published: both signals
    # arrive while the stop is still in progress (two signals sent back to back could be
    # merged by the kernel into one).
    (tmp_path / "busy_filters.py").write_text(BUSY_MODULE)
    proc, _ = _start(tmp_path, seconds=0, filter_function="busy_filters:hold")
    try:
        _wait_for(proc, "busy_filters: holding")
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, rest
    assert "Traceback" not in rest
    assert "Stopped at once by a second SIGTERM" in rest


def test_importing_the_command_line_installs_no_signal_handler() -> None:
    """Only the entry point takes the signals over: a program that imports the CLI
    (with an argv that reads as `acklane run`) keeps its own dispositions."""
    code = (
        "import signal, sys\n"
        "sys.argv = ['acklane', 'run', 'p.yaml']\n"
        "import acklane.core.cli.app\n"
        "from acklane.core.cli.app import app\n"
        "print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,"
        " signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.split() == ["True", "True"], done.stderr
