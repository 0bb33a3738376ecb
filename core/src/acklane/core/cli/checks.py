"""``acklane validate --connect``: reach the event store and every stream's broker.

Each check is bounded by a call_timeout, changes nothing (no message is received, sent,
settled or committed; no table is created) and ends in one :class:`CheckResult`:
ok, failed (why, naming the setting to look at), or skipped (nothing to reach).
Everything displayed goes through acklane.core.observe.redact.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from ..errors import BrokerAuthError
from ..events import TABLE_NAME, display_url, why_unavailable
from ..observe.redact import redact
from ..sinks import Sink, build_sinks
from ..sql import async_engine, is_sqlite_memory, offline_url_problem

if TYPE_CHECKING:
    from ..config import AcklaneConfig, StreamConfig

__all__ = ["CheckResult", "check_store", "check_stream", "run_checks"]

log = logging.getLogger("acklane.core.cli.checks")

Status = Literal["ok", "failed", "skipped"]


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check: what was reached, through which setting, and how it went."""

    #: ``store`` or ``stream NAME``.
    target: str
    #: The setting to look at: ``store.url``, ``streams.NAME``.
    setting: str
    status: Status
    #: What was found (ok, skipped) or why it failed; secrets masked.
    detail: str

    @property
    def ok(self) -> bool:
        return self.status != "failed"

    def line(self) -> str:
        return f"{self.status:<7} {self.target} ({self.setting}): {self.detail}"

    def document(self) -> dict[str, Any]:
        return asdict(self)


def _exists(database: str) -> bool:
    return Path(database).expanduser().exists()


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


async def check_store(url: str, *, call_timeout: float) -> CheckResult:
    """Open a connection to the event store's database and look at its table.

    SQLite: a file that does not exist yet is not created (``acklane run`` creates
    it); its directory must be writable. An existing file is opened and its table,
    if present, read (``SELECT max(id)``). PostgreSQL: connect, then ask the server
    whether the user may read, write and delete in the table, or create it in the
    current schema when it does not exist yet.
    """
    shown = display_url(url)

    def result(status: Status, detail: str) -> CheckResult:
        return CheckResult("store", "store.url", status, redact(f"{shown}: {detail}"))

    problem = offline_url_problem(url)
    if problem is not None:
        return result("failed", problem)
    u = make_url(url)
    sqlite = u.drivername.partition("+")[0] == "sqlite"
    if sqlite and is_sqlite_memory(u):
        return result("skipped", "an in-memory database lives inside one process")
    if sqlite and u.database and not u.database.startswith("file:") and not _exists(u.database):
        return result(
            "ok", "the file does not exist yet; its directory is writable (run creates it)"
        )
    connect_args: dict[str, Any] = (
        {} if sqlite else {"connect_timeout": max(1, round(call_timeout))}
    )
    engine = async_engine(url, connect_args=connect_args)
    try:
        async with asyncio.timeout(call_timeout), engine.connect() as conn:
            if sqlite:
                detail = await _sqlite_table(conn)
            else:
                detail = await _postgresql_rights(conn)
    except TimeoutError:
        return result("failed", f"no answer within {call_timeout:g}s")
    except _Refused as exc:
        return result("failed", str(exc))
    except (DBAPIError, OSError) as exc:
        log.debug("store check of %s failed", shown, exc_info=True)
        return result("failed", why_unavailable(url, exc))
    finally:
        await engine.dispose()
    return result("ok", detail)


class _Refused(Exception):
    """The database answered, but the user may not do what ``run`` needs."""


async def _sqlite_table(conn: Any) -> str:
    found = await conn.exec_driver_sql(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE_NAME,)
    )
    if found.first() is None:
        return f"SQLite database opened; table {TABLE_NAME} does not exist yet (run creates it)"
    last = (await conn.exec_driver_sql(f"SELECT max(id) FROM {TABLE_NAME}")).scalar()
    return f"SQLite database opened; table {TABLE_NAME} read (last id {last})"


async def _postgresql_rights(conn: Any) -> str:
    version = (await conn.exec_driver_sql("SHOW server_version")).scalar()
    exists = (
        await conn.exec_driver_sql("SELECT to_regclass(%(t)s) IS NOT NULL", {"t": TABLE_NAME})
    ).scalar()
    if exists:
        rights = (
            await conn.exec_driver_sql(
                "SELECT has_table_privilege(%(t)s, 'SELECT'), has_table_privilege(%(t)s, "
                "'INSERT'), has_table_privilege(%(t)s, 'DELETE')",
                {"t": TABLE_NAME},
            )
        ).one()
        missing = [
            n for n, ok in zip(("SELECT", "INSERT", "DELETE"), rights, strict=True) if not ok
        ]
        if missing:
            raise _Refused(
                f"connected (PostgreSQL {version}), but the user lacks {', '.join(missing)} "
                f"on table {TABLE_NAME}"
            )
        return f"PostgreSQL {version}; table {TABLE_NAME} exists, SELECT/INSERT/DELETE granted"
    create = (
        await conn.exec_driver_sql("SELECT has_schema_privilege(current_schema(), 'CREATE')")
    ).scalar()
    if not create:
        raise _Refused(
            f"connected (PostgreSQL {version}), but table {TABLE_NAME} does not exist and "
            "the user may not create tables in the current schema"
        )
    return f"PostgreSQL {version}; table {TABLE_NAME} does not exist yet, the user may create it"


async def check_stream(stream: StreamConfig, *, call_timeout: float) -> CheckResult:
    """The stream's connector reaches its broker (:meth:`Connector.check_connection`)."""
    target, setting = f"stream {stream.name}", f"streams.{stream.name}"

    def result(status: Status, detail: str) -> CheckResult:
        return CheckResult(target, setting, status, redact(detail))

    connector = stream.connector
    # the connector bounds each of its calls; this bounds the whole check (and a
    # thread it waits on is given a little longer to answer first)
    try:
        async with asyncio.timeout(call_timeout * 2 + 5):
            found = await connector.check_connection(stream.config, call_timeout=call_timeout)
    except TimeoutError:
        return result("failed", f"{stream.describe()}: no answer within {call_timeout * 2 + 5:g}s")
    except Exception as exc:
        log.debug("connection check of stream %s failed", stream.name, exc_info=True)
        check = ""
        if isinstance(exc, BrokerAuthError) and exc.settings:
            fields = ", ".join(f"{setting}.{field}" for field in exc.settings)
            check = f" (check {fields})"
        return result("failed", f"{stream.describe()}: {_reason(exc)}{check}")
    if found is None:
        return result("skipped", f"connector {stream.connector_name!r} has no connection check")
    return result("ok", found)


async def check_sink(sink: Sink, *, call_timeout: float) -> CheckResult:
    """The sink reaches its destination (:meth:`Sink.check`), delivering nothing."""
    target, setting = f"sink {sink.name}", f"sinks.{sink.name}"

    def result(status: Status, detail: str) -> CheckResult:
        return CheckResult(target, setting, status, redact(detail))

    try:
        async with asyncio.timeout(call_timeout):
            await sink.open()
            try:
                await sink.check()
            finally:
                await sink.aclose()
    except TimeoutError:
        return result("failed", f"{sink.destination}: no answer within {call_timeout:g}s")
    except Exception as exc:
        log.debug("connection check of sink %s failed", sink.name, exc_info=True)
        return result("failed", f"{sink.destination}: {_reason(exc)}")
    return result("ok", f"{sink.destination} answers")


async def run_checks(config: AcklaneConfig, *, call_timeout: float) -> list[CheckResult]:
    """The store's check, then each stream's (one per upstream: streams that share a
    key are the same upstream), then each sink's, run concurrently; in that order."""
    seen: set[object] = set()
    streams = []
    for stream in config.streams.values():
        if stream.key not in seen:
            seen.add(stream.key)
            streams.append(stream)
    async with asyncio.TaskGroup() as tg:
        store = tg.create_task(check_store(config.store.url, call_timeout=call_timeout))
        checks = [tg.create_task(check_stream(s, call_timeout=call_timeout)) for s in streams]
        sinks = [
            tg.create_task(check_sink(sink, call_timeout=call_timeout))
            for sink, _ in build_sinks(config)
        ]
    return [store.result(), *(c.result() for c in checks), *(s.result() for s in sinks)]
