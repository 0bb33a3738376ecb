"""The two accessors users hold: a task instance's store and an asset's store."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy.engine import URL

from ..sql import DEFAULT_URL
from ._errors import ValueTooLargeError
from ._scope import (
    NEVER_EXPIRE,
    WRITER_KINDS,
    AssetScope,
    Retention,
    Scope,
    TaskScope,
    WriterKind,
)
from ._values import EncodedValue, JsonInput, JsonValue, encode_value, validate_key
from .backend import Clock, StateBackend, StateEntry, StateWrite
from .metastore import MetastoreBackend
from .offload import FileOffloadBackend
from .settings import StateStoreSettings

__all__ = [
    "AssetStore",
    "TaskStore",
    "default_backend",
    "open_backend",
    "set_default_backend",
]

_DAY = 86400.0


def open_backend(
    url: str | URL = DEFAULT_URL,
    settings: StateStoreSettings | None = None,
    *,
    clock: Clock = time.time,
) -> StateBackend:
    """The backend the settings name: ``state.backend``, else file offload, else metastore."""
    settings = settings if settings is not None else StateStoreSettings()
    if settings.backend is not None:
        module_name, _, attr = settings.backend.partition(":")
        if not module_name or not attr:
            raise ValueError(
                f"state.backend {settings.backend!r}: expected an import path 'module:Class'"
            )
        try:
            from .._imports import import_user_module

            cls = getattr(import_user_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(
                f"state.backend {settings.backend!r} cannot be imported: {exc}"
            ) from exc
        if not (isinstance(cls, type) and issubclass(cls, StateBackend)):
            raise ValueError(f"state.backend {settings.backend!r} is not a StateBackend subclass")
        factory: Callable[..., StateBackend] = cls
        return factory(url=url, settings=settings)
    if settings.offload_dir is not None:
        return FileOffloadBackend(url, settings, clock=clock)
    return MetastoreBackend(url, settings, clock=clock)


_default_lock = threading.Lock()
_default: StateBackend | None = None


def default_backend() -> StateBackend:
    """The process-wide backend used by accessors built without ``backend=``.

    Unless :func:`set_default_backend` named another, it is the metastore backend
    on :data:`acklane.core.sql.DEFAULT_URL` (an SQLite file in the working directory).
    """
    global _default
    with _default_lock:
        if _default is None:
            _default = MetastoreBackend(DEFAULT_URL)
        return _default


def set_default_backend(backend: StateBackend | None) -> None:
    """Make ``backend`` the default (the runner does this); None resets it."""
    global _default
    with _default_lock:
        _default = backend


class _Accessor:
    __slots__ = ("_backend", "_scope")

    def __init__(self, scope: Scope, backend: StateBackend | None) -> None:
        self._scope = scope
        self._backend = backend if backend is not None else default_backend()

    @property
    def backend(self) -> StateBackend:
        return self._backend

    def _encode(self, key: str, value: object) -> EncodedValue:
        validate_key(key)
        encoded = encode_value(key, value, max_bytes=None)
        limit = self._backend.settings.max_value_bytes
        if encoded.nbytes > limit and not self._backend.offloads(encoded.nbytes, key, self._scope):
            raise ValueTooLargeError(key, encoded.nbytes, limit)
        return encoded

    # -- sync ------------------------------------------------------------------------------

    def get(self, key: str, default: JsonValue = None) -> JsonValue:
        """The value of ``key``, or ``default`` when it is missing or expired."""
        entry = self._backend.get(self._scope, validate_key(key))
        return default if entry is None else entry.value

    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is a no-op."""
        self._backend.delete(self._scope, validate_key(key))

    def keys(self) -> list[str]:
        """The live keys, sorted."""
        return self._backend.keys(self._scope)

    def entry(self, key: str) -> StateEntry | None:
        """``key``'s value with when it was written, when it expires and who wrote it."""
        return self._backend.get(self._scope, validate_key(key))

    def entries(self) -> list[StateEntry]:
        """Every live entry, sorted by key."""
        return self._backend.entries(self._scope)

    # -- async -----------------------------------------------------------------------------

    async def aget(self, key: str, default: JsonValue = None) -> JsonValue:
        entry = await self._backend.aget(self._scope, validate_key(key))
        return default if entry is None else entry.value

    async def adelete(self, key: str) -> None:
        await self._backend.adelete(self._scope, validate_key(key))

    async def akeys(self) -> list[str]:
        return await self._backend.akeys(self._scope)

    async def aentry(self, key: str) -> StateEntry | None:
        return await self._backend.aget(self._scope, validate_key(key))

    async def aentries(self) -> list[StateEntry]:
        return await self._backend.aentries(self._scope)


class TaskStore(_Accessor):
    """Keys of one task instance; every attempt of the instance sees the same keys.

    Use it for what must survive a worker crash or a retry: the id of an
    external job submitted before polling it, a checkpoint within a run.
    """

    __slots__ = ()

    def __init__(self, scope: TaskScope, *, backend: StateBackend | None = None) -> None:
        if not isinstance(scope, TaskScope):
            raise TypeError(f"TaskStore needs a TaskScope, got {type(scope).__name__}")
        super().__init__(scope, backend)

    @property
    def scope(self) -> TaskScope:
        assert isinstance(self._scope, TaskScope)
        return self._scope

    def __repr__(self) -> str:
        return f"TaskStore({self._scope!r}, backend={self._backend!r})"

    def _expires_at(self, key: str, retention: Retention) -> float | None:
        if retention is NEVER_EXPIRE:
            return None
        if retention is None:
            days = self._backend.settings.default_retention_days
            if days == 0:
                return None
            return self._backend.now() + days * _DAY
        if not isinstance(retention, timedelta):
            raise TypeError(
                f"state key {key!r}: retention must be a timedelta, NEVER_EXPIRE or None, "
                f"got {type(retention).__name__}; nothing was written"
            )
        seconds = retention.total_seconds()
        if seconds <= 0:
            raise ValueError(
                f"state key {key!r}: retention {retention} is not positive; nothing was written"
            )
        return self._backend.now() + seconds

    def _write(self, key: str, value: object, retention: Retention) -> StateWrite:
        encoded = self._encode(key, value)
        return StateWrite(key=key, encoded=encoded, expires_at=self._expires_at(key, retention))

    def set(self, key: str, value: JsonInput, *, retention: Retention = None) -> None:
        """Insert or replace ``key``; ``retention`` (default ``default_retention_days``)
        sets when it expires, :data:`NEVER_EXPIRE` keeps it until deleted."""
        self._backend.set(self._scope, self._write(key, value, retention))

    def clear(self) -> None:
        """Remove every key of this task instance (this map index only)."""
        self._backend.clear(self._scope)

    def mark_success(self) -> bool:
        """Report the task instance successful: clears it if ``clear_on_success``.

        Returns whether the keys were cleared.
        """
        if not self._backend.settings.clear_on_success:
            return False
        self._backend.clear(self._scope)
        return True

    async def aset(self, key: str, value: JsonInput, *, retention: Retention = None) -> None:
        await self._backend.aset(self._scope, self._write(key, value, retention))

    async def aclear(self) -> None:
        await self._backend.aclear(self._scope)

    async def amark_success(self) -> bool:
        if not self._backend.settings.clear_on_success:
            return False
        await self._backend.aclear(self._scope)
        return True


class AssetStore(_Accessor):
    """Keys of one asset, independent of any run: watermarks, cursors, metadata.

    Name the asset (``asset="orders"``) or, for an asset known only by its URI,
    the URI (``uri="s3://bucket/orders/"``); an asset's name is its URI when it
    has no other, so both address the same keys. ``writer`` records who writes
    through this accessor: ``task``, ``watcher`` (the engine) or ``api``.
    """

    __slots__ = ("_writer",)

    def __init__(
        self,
        asset: str | None = None,
        *,
        uri: str | None = None,
        backend: StateBackend | None = None,
        writer: WriterKind = "task",
    ) -> None:
        if (asset is None) == (uri is None):
            raise TypeError("AssetStore needs exactly one of asset= (a name) or uri=")
        if writer not in WRITER_KINDS:
            raise ValueError(f"writer must be one of {', '.join(WRITER_KINDS)}, got {writer!r}")
        name = asset if asset is not None else uri
        assert name is not None
        super().__init__(AssetScope(name), backend)
        self._writer: WriterKind = writer

    @property
    def scope(self) -> AssetScope:
        assert isinstance(self._scope, AssetScope)
        return self._scope

    @property
    def asset(self) -> str:
        return self.scope.asset

    @property
    def writer(self) -> WriterKind:
        return self._writer

    def __repr__(self) -> str:
        return f"AssetStore({self.asset!r}, writer={self._writer!r}, backend={self._backend!r})"

    def _write(self, key: str, value: object) -> StateWrite:
        return StateWrite(key=key, encoded=self._encode(key, value), writer=self._writer)

    def set(self, key: str, value: JsonInput) -> None:
        """Insert or replace ``key``; raises AssetInactiveError if the asset was deactivated."""
        self._backend.set(self._scope, self._write(key, value))

    def clear(self) -> None:
        """Remove every key of the asset."""
        self._backend.clear(self._scope)

    async def aset(self, key: str, value: JsonInput) -> None:
        await self._backend.aset(self._scope, self._write(key, value))

    async def aclear(self) -> None:
        await self._backend.aclear(self._scope)
