"""Apache Airflow 3.x's API server for tests, started as Airflow starts it.

``airflow db migrate`` on a SQLite metadata database in a temporary AIRFLOW_HOME,
``airflow dags reserialize`` to store the DAGs of a folder (and so the assets they
schedule on), then ``airflow api-server`` on a free port; more components
(``scheduler`` for DAG runs, ``dag-processor``) on demand. Each is a subprocess in
its own session, stopped by pid. The simple auth manager has two users with
generated passwords: :data:`ADMIN` and :data:`VIEWER` (who may read but not post
asset events).

:class:`AirflowRest` reads what Airflow shows through the REST API: assets, asset
events, DAG runs; it can also revoke a token (``/api/v2/auth/logout``).

The metadata database is SQLite, which takes one write at a time: concurrent
``POST /api/v2/assets/events`` get ``500 Database error`` or hang until their
timeout, and may leave a scheduler started then unable to start. Post one at a time
(an ``ordered`` sink). DAGs are unpaused at creation, so that a scheduler started
with :meth:`AirflowServer.start_component` runs them at once.

Needs Airflow in the environment (``uv sync --group airflow``); nothing here imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

import aiohttp

from acklane.core.errors import AcklaneError

from .emulator import free_port

__all__ = [
    "ADMIN",
    "VIEWER",
    "AirflowNotInstalled",
    "AirflowRest",
    "AirflowServer",
    "AirflowServerError",
    "AirflowUser",
    "airflow_executable",
]

#: The simple auth manager's users: an admin (who posts asset events) and a viewer.
ADMIN: Final = "acklane"
VIEWER: Final = "viewer"
#: Seconds :meth:`AirflowRest.get` asks again after a ``500`` before raising it.
SERVER_ERROR_PATIENCE: Final = 60.0


class AirflowServerError(AcklaneError):
    """An Airflow command or component failed; the message holds its log's tail."""


class AirflowNotInstalled(AirflowServerError):
    """No ``airflow`` executable beside this Python (``uv sync --group airflow``)."""


def airflow_executable() -> Path:
    """The ``airflow`` command of this environment; :class:`AirflowNotInstalled` if none."""
    path = Path(sys.executable).with_name("airflow")
    if not path.exists():
        raise AirflowNotInstalled(
            f"no airflow command at {path}: install the airflow group (uv sync --group airflow)"
        )
    return path


@dataclass(frozen=True, slots=True)
class AirflowUser:
    """A user of the simple auth manager."""

    username: str
    password: str
    role: str

    def __repr__(self) -> str:
        return f"AirflowUser({self.username!r}, role={self.role!r})"


class AirflowServer:
    """An Airflow API server (and, on demand, more components) over one AIRFLOW_HOME."""

    def __init__(
        self,
        home: Path,
        dags_folder: Path,
        *,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 120.0,
    ) -> None:
        self.home = home
        self.dags_folder = dags_folder
        self.startup_timeout = startup_timeout
        self.airflow = airflow_executable()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.users = {
            ADMIN: AirflowUser(ADMIN, secrets.token_urlsafe(12), "admin"),
            VIEWER: AirflowUser(VIEWER, secrets.token_urlsafe(12), "viewer"),
        }
        self.db = home / "airflow.db"
        passwords = home / "simple_auth_manager_passwords.json"
        passwords.write_text(json.dumps({u.username: u.password for u in self.users.values()}))
        base = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "AIRFLOW__"))}
        self.env: dict[str, str] = {
            **base,
            "AIRFLOW_HOME": str(home),
            "PYTHONDONTWRITEBYTECODE": "1",  # no __pycache__ in the DAGs folder
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.db}",
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            # a scheduler started later runs the DAGs at once (unpaused)
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(
                f"{u.username}:{u.role}" for u in self.users.values()
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            # one secret for every component, so that a token outlives a restart
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__WORKERS": "1",
            # for a scheduler started later: its executor's tasks, through this server
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__CORE__PARALLELISM": "2",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "600",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            **(env or {}),
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def admin(self) -> AirflowUser:
        return self.users[ADMIN]

    @property
    def viewer(self) -> AirflowUser:
        return self.users[VIEWER]

    def __repr__(self) -> str:
        return f"<AirflowServer {self.url} home={self.home}>"

    # -- life -------------------------------------------------------------------------------

    def start(self) -> None:
        """Migrate the database, store the DAGs, start the API server and wait for it."""
        try:
            self.run("db", "migrate")
            self.reserialize()
            self.start_component("api-server")
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def run(self, *args: str, timeout: float = 120.0) -> str:
        """``airflow <args>`` to its end; its stdout. :class:`AirflowServerError` if it fails."""
        result = subprocess.run(
            [str(self.airflow), *args],
            env=self.env,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise AirflowServerError(
                f"airflow {' '.join(args)} exited {result.returncode}:\n"
                + result.stderr.decode(errors="replace")[-4000:]
            )
        return result.stdout.decode(errors="replace")

    def reserialize(self) -> None:
        """Parse the DAGs folder and store its DAGs and their assets (again)."""
        self.run("dags", "reserialize")

    def start_component(self, component: str) -> None:
        """``airflow <component>`` in the background (once), logging to home/<component>.log."""
        if component in self.procs and self.procs[component].poll() is None:
            return
        with open(self.home / f"{component}.log", "ab") as log:
            self.procs[component] = subprocess.Popen(
                [str(self.airflow), component],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self) -> None:
        """Until ``GET /api/v2/version`` answers 200 (the API server exiting fails it)."""
        deadline = time.monotonic() + self.startup_timeout
        while True:
            self.check_alive()
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/version", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise AirflowServerError(
                    f"the API server did not answer within {self.startup_timeout:g} s:\n"
                    + self.log_tail("api-server")
                )
            time.sleep(0.5)

    def check_alive(self) -> None:
        for component, proc in self.procs.items():
            if proc.poll() is not None:
                raise AirflowServerError(
                    f"airflow {component} exited {proc.returncode}:\n{self.log_tail(component)}"
                )

    def log_tail(self, component: str, chars: int = 6000) -> str:
        path = self.home / f"{component}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def stop(self) -> None:
        """SIGTERM each component, then SIGKILL what is left of its session."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        for proc in self.procs.values():
            # the component's own children (uvicorn's worker, the executor's) share its session
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def rest(self, user: str = ADMIN) -> AirflowRest:
        """A REST client logged in as ``user`` (an async context manager)."""
        return AirflowRest(self.url, self.users[user])


class AirflowRest:
    """What Airflow's REST API shows: assets, asset events, DAG runs."""

    def __init__(self, url: str, user: AirflowUser) -> None:
        self.url = url.rstrip("/")
        self.user = user
        self.token = ""
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        try:
            self.token = await self.login()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise AirflowServerError("AirflowRest is used outside its async with block")
        return self._session

    async def login(self) -> str:
        """A fresh token for the user (``POST /auth/token``)."""
        body = {"username": self.user.username, "password": self.user.password}
        async with self._open().post(f"{self.url}/auth/token", json=body) as resp:
            if resp.status not in (200, 201):
                raise AirflowServerError(f"POST /auth/token: {resp.status} {await resp.text()}")
            token: str = (await resp.json())["access_token"]
            return token

    async def revoke(self, token: str) -> None:
        """Invalidate ``token`` (``GET /api/v2/auth/logout`` revokes the bearer token)."""
        async with self._open().get(
            f"{self.url}/api/v2/auth/logout",
            headers={"Authorization": f"Bearer {token}"},
            allow_redirects=False,
        ) as resp:
            if resp.status >= 400:
                raise AirflowServerError(f"GET /api/v2/auth/logout: {resp.status}")

    async def get(self, path: str, **params: str | int) -> Any:
        """``GET /api/v2/<path>`` as the user; the JSON answer.

        A ``500`` is asked again for up to :data:`SERVER_ERROR_PATIENCE` seconds before
        it is raised: Airflow 3.3 answers ``GET /assets/events`` with ``500`` while any
        listed event has created a DAG run that has not started yet (its ``start_date``
        is null, which the response model refuses; apache/airflow#71360), and a
        scheduler starts such a run within moments. SQLite's one-writer-at-a-time
        metadata database gives brief 500s of its own.
        """
        deadline = time.monotonic() + SERVER_ERROR_PATIENCE
        while True:
            async with self._open().get(
                f"{self.url}/api/v2/{path.lstrip('/')}",
                params=params,
                headers={"Authorization": f"Bearer {self.token}"},
            ) as resp:
                if resp.status == 200:
                    return await resp.json()
                failure = f"GET /api/v2/{path}: {resp.status} {await resp.text()}"
                if resp.status != 500 or time.monotonic() >= deadline:
                    raise AirflowServerError(failure)
            await asyncio.sleep(0.25)

    async def _pages(self, path: str, key: str, **params: str | int) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        while True:
            page = await self.get(path, **params, limit=100, offset=len(rows))
            rows.extend(page[key])
            if not page[key] or len(rows) >= page["total_entries"]:
                return rows

    async def asset(self, *, name: str | None = None, uri: str | None = None) -> dict[str, Any]:
        """The active asset of that exact name or URI."""
        field, value = ("name", name) if name is not None else ("uri", uri)
        assets = await self._pages("assets", "assets", **{f"{field}_pattern": str(value)})
        for asset in assets:
            if asset[field] == value:
                return asset
        raise AirflowServerError(f"Airflow has no asset with {field} {value!r}")

    async def asset_events(
        self, *, name: str | None = None, uri: str | None = None
    ) -> list[dict[str, Any]]:
        """Every event of the asset, oldest first (each with its ``extra``)."""
        asset = await self.asset(name=name, uri=uri)
        return await self._pages(
            "assets/events", "asset_events", asset_id=asset["id"], order_by="timestamp"
        )

    async def events_with_id(
        self, event_id: str, *, name: str | None = None, uri: str | None = None
    ) -> list[dict[str, Any]]:
        """The asset's events whose ``extra.acklane.event_id`` is ``event_id``."""
        return [
            e
            for e in await self.asset_events(name=name, uri=uri)
            if ((e.get("extra") or {}).get("acklane") or {}).get("event_id") == event_id
        ]

    async def dag_runs(self, dag_id: str) -> list[dict[str, Any]]:
        """The DAG's runs (a scheduler makes them: ``start_component("scheduler")``)."""
        return await self._pages(f"dags/{dag_id}/dagRuns", "dag_runs")
