"""A job id that survives a worker crash: submit once, reattach on retry.

    uv run python examples/state_store_job_id.py [--url postgresql://...]

The task submits a long job to an external service. It stores the job's id in
its task store *before* it starts polling, so that when the worker dies
mid-job, the retry (same task instance, new process) finds the id and
reattaches to the running job instead of submitting a second one.

The demo runs attempt 1 in a worker process, SIGKILLs it while it polls (no
``finally`` or ``except`` runs), lets the external job finish on its own, runs
attempt 2 in a fresh process, and prints how many jobs the service received.
Exit status 0 means exactly one submission.

The external service is faked with a small SQLite table, so the demo needs
nothing but Python; the task store uses ``--url`` (default: an SQLite file in
a temporary directory).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from acklane.core.stores import MetastoreBackend, TaskScope, TaskStore

SCOPE = TaskScope(dag_id="nightly_export", run_id="2026-11-29", task_id="export_orders")


class FakeJobService:
    """An external batch service: submit() starts a job, status() polls it."""

    def __init__(self, path: Path) -> None:
        self._path = path
        with self._connect() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS jobs ("
                " id INTEGER PRIMARY KEY, state TEXT NOT NULL, polls INTEGER NOT NULL DEFAULT 0)"
            )

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self._path, timeout=30, isolation_level=None)

    def submit(self) -> str:
        with self._connect() as db:
            cursor = db.execute("INSERT INTO jobs (state) VALUES ('running')")
            return f"job-{cursor.lastrowid}"

    def status(self, job_id: str) -> str:
        number = int(job_id.removeprefix("job-"))
        with self._connect() as db:
            db.execute("UPDATE jobs SET polls = polls + 1 WHERE id = ?", (number,))
            (state,) = db.execute("SELECT state FROM jobs WHERE id = ?", (number,)).fetchone()
            return str(state)

    # What the outside world sees, for the demo's narration.
    def submissions(self) -> int:
        with self._connect() as db:
            return int(db.execute("SELECT count(*) FROM jobs").fetchone()[0])

    def polls(self) -> int:
        with self._connect() as db:
            return int(db.execute("SELECT coalesce(sum(polls), 0) FROM jobs").fetchone()[0])

    def finish_all(self) -> None:
        with self._connect() as db:
            db.execute("UPDATE jobs SET state = 'done'")


def run_task(url: str, service: FakeJobService, attempt: int) -> str:
    """The task's body, as every attempt runs it."""
    with MetastoreBackend(url) as backend:
        store = TaskStore(SCOPE, backend=backend)
        job_id = store.get("job_id")
        if job_id is None:
            job_id = service.submit()
            store.set("job_id", job_id)  # before polling: a crash from here on is survivable
            print(f"attempt {attempt}: submitted {job_id}", flush=True)
        else:
            print(f"attempt {attempt}: reattached to {job_id}", flush=True)
        assert isinstance(job_id, str)
        while service.status(job_id) != "done":
            time.sleep(0.02)
        store.set("result", {"job_id": job_id, "attempt": attempt})
        print(f"attempt {attempt}: {job_id} is done", flush=True)
        return job_id


def _attempt(url: str, workdir: Path, attempt: int) -> None:
    run_task(url, FakeJobService(workdir / "jobs.db"), attempt)


def _worker(url: str, workdir: Path, attempt: int) -> multiprocessing.Process:
    """Start one attempt of the task in a worker process of its own."""
    process = multiprocessing.Process(target=_attempt, args=(url, workdir, attempt))
    process.start()
    return process


def _wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.01)


def demo(url: str | None, workdir: Path) -> int:
    """Run the crash-and-retry story; return the number of submissions the service saw."""
    url = url or f"sqlite:///{workdir / 'acklane.db'}"
    service = FakeJobService(workdir / "jobs.db")

    first = _worker(url, workdir, attempt=1)
    try:
        # The job is polled only after its id is stored, so one poll means "stored".
        _wait_until(lambda: service.polls() > 0 or not first.is_alive(), "attempt 1 to poll")
        if not first.is_alive():
            raise RuntimeError(f"attempt 1 ended early with status {first.exitcode}")
        assert first.pid is not None
        os.kill(first.pid, signal.SIGKILL)
    finally:
        first.join()
    print(f"worker of attempt 1 killed (status {first.exitcode})", flush=True)

    service.finish_all()  # the external job completes while nobody watches it

    second = _worker(url, workdir, attempt=2)
    second.join(timeout=60)
    if second.exitcode != 0:
        raise RuntimeError(f"attempt 2 failed with status {second.exitcode}")

    with MetastoreBackend(url) as backend:
        result = TaskStore(SCOPE, backend=backend).get("result")
    submissions = service.submissions()
    print(f"result: {result}", flush=True)
    print(f"submissions seen by the service: {submissions}", flush=True)
    return submissions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="task store database URL")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="acklane-job-id-") as tmp:
        return 0 if demo(args.url, Path(tmp)) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
