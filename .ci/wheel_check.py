"""What a user sees after ``pip install`` of the built wheels (run by .ci/wheel-path).

Run with the fresh venv's interpreter, outside the repository, in one of two phases:

* ``without-testing`` (``acklane[kafka]``): the emulator command and the demo's
  emulators are missing, and each says which distribution and extra to install;
* ``kafka-testing`` (``acklane[kafka-testing]``): every acklane distribution came
  from the built wheels, no other broker's SDK was installed, ``acklane demo`` runs
  on the Kafka emulator, and ``examples/kafka.yaml`` runs as its header says.

Only the installed ``acklane`` command and the standard library are used: it runs
as a user would, with nothing of the repository on the path.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, distribution, distributions
from pathlib import Path

BIN = Path(sys.executable).parent
ACKLANE = str(BIN / "acklane")
#: examples/orders.jsonl: big-orders fires on 2 of the 4 orders, the other two on all 4.
EXPECTED_EVENTS = 10
#: What a Kafka user does not get with acklane[kafka-testing].
OTHER_BROKERS = ("azure-servicebus", "google-cloud-pubsub", "grpcio", "moto", "python-qpid-proton")


def fail(message: str) -> None:
    print(f"wheel check FAILED: {message}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def step(message: str) -> None:
    print(f"  {message}", flush=True)


def acklane(
    *args: str, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ACKLANE, *args],
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def expect(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    """``result`` exited ``code`` and printed every needle (stdout or stderr)."""
    text = result.stdout + result.stderr
    if result.returncode != code:
        fail(f"{shlex.join(map(str, result.args))}: exit {result.returncode}, not {code}:\n{text}")
    for needle in needles:
        if needle not in text:
            fail(f"{shlex.join(map(str, result.args))} did not print {needle!r}:\n{text}")


# -- without the testing extra ------------------------------------------------------------


def without_testing() -> None:
    expect(acklane("--version"), 0, "acklane")
    step("acklane --version works")
    missing = "acklane emulator comes with acklane-integration, which is not installed"
    expect(
        acklane("emulator", "start", "kafka"), 2, missing, 'pip install "acklane[kafka-testing]"'
    )
    expect(acklane("emulator", "--help"), 2, missing, 'pip install "acklane[BROKER-testing]"')
    step("acklane emulator says what to install")
    expect(
        acklane("demo", "--broker", "kafka"),
        2,
        "the kafka demo broker comes with acklane-integration, which is not installed",
        'pip install "acklane[kafka-testing]"',
    )
    expect(
        acklane("demo", "--messages", "6"),
        0,
        "the demo's broker emulators come with acklane-integration, which is not installed",
        "using the in-process memory broker instead",
        "acked ✓",
    )
    step("acklane demo falls back to the in-process broker and says why")


# -- with acklane[kafka-testing] ----------------------------------------------------------


def _record_hash(path: Path) -> str:
    digest = hashlib.sha256(path.read_bytes()).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def from_the_built_wheels(dist_dir: Path) -> None:
    """Every installed acklane distribution is the built wheel's (not another index's)."""
    seen = []
    for dist in distributions():
        name = dist.metadata["Name"]
        if not name.startswith("acklane"):
            continue
        stem = f"{name.replace('-', '_')}-{dist.version}"
        wheel = dist_dir / f"{stem}-py3-none-any.whl"
        if not wheel.is_file():
            fail(f"{name} {dist.version} is installed, but not built: no {wheel.name}")
        with zipfile.ZipFile(wheel) as zf:
            record = zf.read(f"{stem}.dist-info/RECORD").decode()
        for path, hashed, _size in csv.reader(record.splitlines()):
            if not path.endswith(".py") or not hashed:
                continue
            installed = Path(str(dist.locate_file(path)))
            if not installed.is_file() or _record_hash(installed) != hashed:
                fail(f"{name}: {path} is not the one of {wheel.name}")
        seen.append(name)
    if not {"acklane", "acklane-core", "acklane-kafka", "acklane-integration"} <= set(seen):
        fail(f"acklane[kafka-testing] installed only {sorted(seen)}")
    step(f"installed from the built wheels: {', '.join(sorted(seen))}")


def no_other_brokers() -> None:
    present = []
    for name in OTHER_BROKERS:
        try:
            distribution(name)
        except PackageNotFoundError:
            continue
        present.append(name)
    if present:
        fail(f"acklane[kafka-testing] installed other brokers' packages: {present}")
    step(f"none of {', '.join(OTHER_BROKERS)} installed")


def emulators_listed() -> None:
    listed = acklane("emulator", "list")
    expect(listed, 0, "kafka\tlocal\tready", 'pip install "acklane-integration[sqs]"')
    expect(
        acklane("emulator", "start", "sqs"),
        1,
        "the sqs emulator needs",
        "moto[server]",
        '"acklane[sqs-testing]"',
    )
    step("acklane emulator list: kafka ready, the others say what to install")


def demo_on_kafka() -> None:
    expect(
        acklane("demo", "--messages", "12", env={"ACKLANE_EMULATOR_BACKEND": "local"}, timeout=300),
        0,
        "acklane demo on a Kafka emulator (local,",
        "acked ✓",
        "rejected → DLQ",
    )
    step("acklane demo ran on the Kafka emulator")


class _Lines:
    """A process's stream, read by a thread so that waits can time out."""

    def __init__(self, stream: object) -> None:
        self.text = ""
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.text += line


@contextmanager
def background(
    *args: str, env: dict[str, str], cwd: Path
) -> Iterator[tuple[subprocess.Popen[str], _Lines, _Lines]]:
    """``acklane ARGS`` running until the block ends, then SIGTERMed (exit 0 expected)."""
    proc = subprocess.Popen(
        [ACKLANE, *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = _Lines(proc.stdout), _Lines(proc.stderr)
    try:
        yield proc, out, err
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=45)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
    if proc.returncode != 0:
        fail(f"acklane {' '.join(args)} exited {proc.returncode}:\n{err.text}")


def _until(
    check: object, what: str, proc: subprocess.Popen[str], err: _Lines, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if proc.poll() is not None:
            fail(f"{what}: the process exited {proc.returncode}:\n{err.text}")
        if time.monotonic() > deadline:
            fail(f"{what}: not within {timeout}s:\n{err.text}")
        time.sleep(0.2)


def header_commands(example: Path) -> list[list[str]]:
    """The ``uv run acklane ...`` commands of the example's comment header."""
    text = "\n".join(
        line.removeprefix("#").strip()
        for line in example.read_text().splitlines()
        if line.startswith("#")
    ).replace("\\\n", " ")
    return [shlex.split(m.group(1)) for m in re.finditer(r"uv run acklane (.+)", text)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kafka_example(examples: Path) -> None:
    """examples/kafka.yaml as its header says, from a copy outside the repository."""
    with tempfile.TemporaryDirectory(prefix="acklane-example-") as tmp:
        cwd = Path(tmp)
        (cwd / "examples").mkdir()
        for name in ("kafka.yaml", "orders.jsonl"):
            (cwd / "examples" / name).write_bytes((examples / name).read_bytes())
        start, publish, run, listing = header_commands(cwd / "examples" / "kafka.yaml")
        env = {
            **os.environ,
            "COLUMNS": "200",
            "ACKLANE_EMULATOR_BACKEND": "local",
            "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
            "ACKLANE_STORE_URL": f"sqlite:///{cwd / 'events.db'}",
        }
        with background(*start, env=env, cwd=cwd) as (emulator, _out, err):
            _until(lambda: "Ctrl-C to stop" in err.text, "the emulator", emulator, err, 120)
            step("acklane emulator start kafka --config examples/kafka.yaml: ready")
            sent = subprocess.run(
                [ACKLANE, *publish], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
            )
            expect(sent, 0, "published 4 message(s)")

            def stored() -> int:
                got = subprocess.run(
                    [ACKLANE, *listing, "--json"], cwd=cwd, env=env, capture_output=True, text=True
                )
                return len(got.stdout.splitlines()) if got.returncode == 0 else 0

            with background(*run, env=env, cwd=cwd) as (runner, _, run_err):
                _until(lambda: stored() >= EXPECTED_EVENTS, "the events", runner, run_err, 120)
            events = [
                json.loads(line)
                for line in subprocess.run(
                    [ACKLANE, *listing, "--json"], cwd=cwd, env=env, capture_output=True, text=True
                ).stdout.splitlines()
            ]
            if len(events) != EXPECTED_EVENTS:
                fail(f"{len(events)} events stored, not {EXPECTED_EVENTS}")
        step(f"examples/kafka.yaml: published, run, {EXPECTED_EVENTS} events listed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=["without-testing", "kafka-testing"])
    parser.add_argument("--dist", type=Path, required=True, help="the built wheels")
    parser.add_argument("--examples", type=Path, required=True, help="the repository's examples")
    args = parser.parse_args()
    if args.phase == "without-testing":
        without_testing()
        return
    from_the_built_wheels(args.dist)
    no_other_brokers()
    emulators_listed()
    demo_on_kafka()
    kafka_example(args.examples)


if __name__ == "__main__":
    main()
