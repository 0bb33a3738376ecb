"""Every command of the README and of docs/ runs as written.

The commands are the lines of the fenced ``console``, ``sh``, ``bash`` and
``shell`` blocks of README.md and docs/**/*.md: in a block with ``$ `` prompts,
the prompted lines (the others are their output); otherwise every line that is
not empty and not a ``#`` comment. A line ending in ``\\`` continues on the next.
Each runs through ``bash -c`` exactly as written, one working directory per
document (a fresh temporary one holding a copy of ``examples/``; ``$HOME`` is a
temporary one too), in document order, with this environment's ``acklane`` first
on ``PATH`` and ``uv run`` finding this repository without syncing it
(``UV_PROJECT``, ``UV_NO_SYNC``). Each must exit 0, except:

- ``acklane emulator start ...`` keeps running in the background (until the end of
  the document, when SIGTERM must stop it with exit 0), once it printed that it is
  ready; the examples' address variables (``KAFKA_BOOTSTRAP_SERVERS``,
  ``SQS_ENDPOINT_URL``, ``PUBSUB_EMULATOR_HOST``, ``SERVICEBUS_CONNECTION_STRING``,
  ``SCHEMA_REGISTRY_URL``)
  point at free ports, so ``emulator start --config`` and the pipelines meet there;
- ``acklane run ...`` and ``acklane events tail ...`` run for :data:`AFTER_START`
  seconds after the pipeline's streams started polling (:data:`AFTER_START_MEMORY`
  when every stream is the in-process ``memory`` broker, which no other process can
  feed; :data:`QUIET_AFTER_ASSIGNED` seconds without output once a Kafka consumer has
  its partitions, if that comes first; at most :data:`RUN_FOR` seconds in all), then
  get SIGTERM and must exit 0 (a graceful stop).

HTML comments on the lines just above a block (blank lines between allowed) say
more about it:

- ``<!-- not-run: REASON -->``: the block is not run (a reason is required; used
  for the whole test suite, installs and shell-wide changes);
- ``<!-- file: NAME -->``: the block is a file, written as NAME in the working
  directory for the commands after it (``yaml`` blocks of a sample pipeline);
- ``<!-- exit: N -->``: the block's commands exit with N (an error sample).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from acklane.integration.emulator import free_port
from acklane.integration.servicebus import connection_string

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
SHELL_BLOCKS = ("console", "sh", "bash", "shell")
#: Seconds a pipeline (``acklane run``) runs before SIGTERM, at most.
RUN_FOR = 25.0
#: What ``acklane run`` logs once its streams poll, and the seconds it runs on after.
STARTED = "Shared stream group started"
AFTER_START = 8.0
#: The same for a pipeline whose streams are all the in-process ``memory`` broker: no
#: other process can publish to it, so there is nothing to wait for once it polls.
AFTER_START_MEMORY = 1.0
#: What a Kafka stream of ``acklane run`` logs once its consumer has its partitions, and
#: the seconds without a new line after which what was published before is consumed
#: (a few records: they come in the first fetch).
ASSIGNED = "Kafka partitions assigned"
QUIET_AFTER_ASSIGNED = 2.0
#: Seconds any other command may take.
COMMAND_TIMEOUT = 300.0

_FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
_MARKER = re.compile(r"^<!--\s*([\w-]+)\s*:\s*(.*?)\s*-->$")
_ACKLANE = re.compile(
    r"^(?:\w+=\S*\s+)*(?:uv run\s+(?:--\S+\s+)*)?acklane\s+"
    r"(?:--(?:log-level|log-format|log-third-party)\s+\S+\s+|--[\w-]+=\S+\s+)*(\w[\w-]*)(?:\s+(\w[\w-]*))?"
)


@dataclass
class Block:
    document: Path
    line: int
    info: str
    text: str
    markers: dict[str, str] = field(default_factory=dict)

    def commands(self) -> list[str]:
        lines = self.text.splitlines()
        prompted = any(line.startswith("$ ") for line in lines)
        commands: list[str] = []
        continuing = False
        for line in lines:
            if continuing:
                commands[-1] += "\n" + line
            elif prompted:
                if not line.startswith("$ "):
                    continue
                commands.append(line[2:])
            elif line.strip() and not line.lstrip().startswith("#"):
                commands.append(line)
            else:
                continue
            continuing = line.endswith("\\")
        return commands


def blocks(document: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, with the markers just above each."""
    found: list[Block] = []
    lines = document.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        markers: dict[str, str] = {}
        j = i - 1
        while j >= 0 and (not lines[j].strip() or lines[j].strip().startswith("<!--")):
            marker = _MARKER.match(lines[j].strip())
            if marker:
                markers.setdefault(marker.group(1), marker.group(2))
            j -= 1
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence.group(2)):
            end += 1
        text = "\n".join(line.removeprefix(fence.group(1)) for line in lines[i + 1 : end])
        found.append(Block(document, i + 1, fence.group(3), text + "\n", markers))
        i = end + 1
    return found


def _kind(command: str) -> str:
    """``emulator``, ``run`` (until SIGTERM) or ``once``."""
    match = _ACKLANE.match(command.strip())
    if match is None:
        return "once"
    words = (match.group(1), match.group(2))
    if words == ("emulator", "start"):
        return "emulator"
    if words[0] == "run" or words == ("events", "tail"):
        return "run"
    return "once"


def _documents_with_commands() -> list[Path]:
    return [d for d in DOCUMENTS if any(b.info in SHELL_BLOCKS for b in blocks(d))]


@pytest.fixture(scope="module")
def environment() -> Iterator[dict[str, str]]:
    """What every documented command runs with."""
    home = Path(tempfile.mkdtemp(prefix="acklane-docs-home-"))
    uv_cache = os.environ.get("UV_CACHE_DIR") or str(Path.home() / ".cache" / "uv")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(home),
        "UV_CACHE_DIR": uv_cache,
        "UV_PROJECT": str(ROOT),
        "UV_NO_SYNC": "1",
        "COLUMNS": "200",
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
        "SQS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
        "PUBSUB_EMULATOR_HOST": f"127.0.0.1:{free_port()}",
        "SERVICEBUS_CONNECTION_STRING": connection_string("127.0.0.1", free_port()),
        "SCHEMA_REGISTRY_URL": f"http://127.0.0.1:{free_port()}",
    }
    for name in ("ACKLANE_STORE_URL", "PGPASSWORD", "VIRTUAL_ENV"):
        env.pop(name, None)
    yield env
    shutil.rmtree(home, ignore_errors=True)


def test_the_documents_have_commands_and_every_not_run_says_why() -> None:
    readme = [b for b in blocks(ROOT / "README.md") if b.info in SHELL_BLOCKS]
    assert readme, "the README has no command block"
    for document in DOCUMENTS:
        for block in blocks(document):
            if "not-run" in block.markers:
                assert block.markers["not-run"], f"{document.name}:{block.line}: say why"


def test_only_a_pipeline_of_memory_streams_gets_the_short_run() -> None:
    examples = ROOT / "examples"
    assert _memory_only("uv run acklane run examples/pipeline.yaml  # a comment", ROOT)
    assert not _memory_only("uv run acklane run examples/kafka.yaml", ROOT)
    assert not _memory_only("acklane run missing.yaml", examples)
    assert not _memory_only("acklane events tail --config nothing", examples)


class _Reader:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        #: When the last line came (``time.monotonic()``).
        self.last = time.monotonic()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            self.last = time.monotonic()

    def text(self) -> str:
        return "".join(self.lines)


def _start(command: str, cwd: Path, env: dict[str, str]) -> _Reader:
    proc = subprocess.Popen(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # SIGTERM reaches acklane itself, not only bash
    )
    return _Reader(proc)


def _terminate(reader: _Reader, timeout: float = 60) -> int:
    """SIGTERM to the command (bash execs a simple one: acklane, or uv that forwards it).

    Not to its whole process group: ``uv run`` forwards the signal, and a second one
    makes acklane stop at once rather than gracefully.
    """
    proc = reader.proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    return proc.returncode


def _memory_only(command: str, cwd: Path) -> bool:
    """Whether every stream of the pipeline files ``command`` names is a ``memory`` one."""
    files = [cwd / word for word in command.split() if word.endswith((".yaml", ".yml"))]
    connectors: list[object] = []
    for path in files:
        try:
            document = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            return False
        streams = document.get("streams") if isinstance(document, dict) else None
        if not isinstance(streams, dict):
            return False
        connectors += [
            s.get("connector") if isinstance(s, dict) else None for s in streams.values()
        ]
    return bool(connectors) and all(c == "memory" for c in connectors)


def _run_bounded(command: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    after_start = AFTER_START_MEMORY if _memory_only(command, cwd) else AFTER_START
    reader = _start(command, cwd, env)
    deadline = time.monotonic() + RUN_FOR
    while reader.proc.poll() is None and time.monotonic() < deadline:
        text = reader.text()
        if STARTED in text:  # its streams poll: give them a moment to consume
            deadline = min(deadline, time.monotonic() + after_start)
        if ASSIGNED in text:  # it consumes: once it has been quiet, it is done
            deadline = min(deadline, reader.last + QUIET_AFTER_ASSIGNED)
        time.sleep(0.2)
    return _terminate(reader), reader.text()


@pytest.mark.parametrize(
    "document", _documents_with_commands(), ids=lambda d: str(d.relative_to(ROOT))
)
def test_every_command_of_the_document_runs_as_written(
    document: Path, environment: dict[str, str], tmp_path: Path
) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    background: list[tuple[str, _Reader]] = []
    failures: list[str] = []
    try:
        for block in blocks(document):
            if "not-run" in block.markers:
                continue
            if "file" in block.markers:
                (tmp_path / block.markers["file"]).write_text(block.text)
                continue
            if block.info not in SHELL_BLOCKS:
                continue
            expected = int(block.markers.get("exit", "0"))
            for command in block.commands():
                where = f"{document.relative_to(ROOT)}:{block.line}: {command}"
                kind = _kind(command)
                if kind == "emulator":
                    reader = _start(command, tmp_path, environment)
                    deadline = time.monotonic() + 120
                    while "Ctrl-C to stop" not in reader.text():
                        if reader.proc.poll() is not None or time.monotonic() > deadline:
                            failures.append(f"{where}\n  never ready:\n{reader.text()}")
                            break
                        time.sleep(0.1)
                    background.append((where, reader))
                    continue
                if kind == "run":
                    code, output = _run_bounded(command, tmp_path, environment)
                else:
                    try:
                        done = subprocess.run(
                            ["bash", "-c", command],
                            cwd=tmp_path,
                            env=environment,
                            stdin=subprocess.DEVNULL,
                            capture_output=True,
                            text=True,
                            timeout=COMMAND_TIMEOUT,
                        )
                    except subprocess.TimeoutExpired:
                        failures.append(f"{where}\n  still running after {COMMAND_TIMEOUT}s")
                        continue
                    code, output = done.returncode, done.stdout + done.stderr
                if code != expected:
                    tail = "\n".join(output.splitlines()[-15:])
                    failures.append(f"{where}\n  exit {code}, expected {expected}:\n{tail}")
    finally:
        for where, reader in background:
            code = _terminate(reader)
            if code != 0:
                failures.append(f"{where}\n  exit {code} on SIGTERM:\n{reader.text()[-2000:]}")
    assert not failures, "\n\n".join(failures)
