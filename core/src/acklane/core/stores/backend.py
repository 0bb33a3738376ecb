"""The backend interface every state backend implements.

A backend stores already-validated values for a scope (a task instance or an
asset). The accessors (:class:`~acklane.core.stores.TaskStore`,
:class:`~acklane.core.stores.AssetStore`) validate keys and values, compute
expiry and enforce ``max_value_bytes`` before calling it, so a backend never
sees a value it should refuse.

To write your own backend, subclass :class:`StateBackend` and implement the
sync methods; the async twins run them in a worker thread unless you override
them. To offload large values while keeping rows in the metastore, subclass
:class:`~acklane.core.stores.MetastoreBackend` instead and override
:meth:`StateBackend.offloads`, :meth:`StateBackend.serialize_to_ref`,
:meth:`StateBackend.deserialize_from_ref` and :meth:`StateBackend.purge_ref`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, NoReturn, Self

from ._scope import Scope, WriterKind
from ._values import EncodedValue, JsonValue
from .settings import StateStoreSettings

__all__ = ["Clock", "GcReport", "StateBackend", "StateEntry", "StateWrite"]

log = logging.getLogger("acklane.core.stores")

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class StateEntry:
    """One live key as a backend returns it."""

    key: str
    value: JsonValue
    updated_at: float
    """Seconds since the epoch of the last write."""
    expires_at: float | None = None
    """Task store: when the key stops being visible; None = never."""
    writer: WriterKind | None = None
    """Asset store: who wrote last (task, watcher or api)."""
    ref: str | None = None
    """Set when the value is offloaded: the reference kept in the row."""


@dataclass(frozen=True, slots=True)
class StateWrite:
    """A validated write handed to a backend."""

    key: str
    encoded: EncodedValue
    expires_at: float | None = None
    writer: WriterKind | None = None


@dataclass(frozen=True, slots=True)
class GcReport:
    """What one garbage collection removed (or, with ``dry_run``, would remove)."""

    dry_run: bool
    task_keys: int = 0
    """Expired task-store keys."""
    asset_keys: int = 0
    """Keys of deactivated assets."""
    offloaded_values: int = 0
    """Offloaded values removed with their rows."""
    orphan_files: int = 0
    """Offloaded values no row references any more (left by a crash)."""
    batches: int = 0
    """Transactions that removed rows."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __add__(self, other: GcReport) -> GcReport:
        return GcReport(
            dry_run=self.dry_run and other.dry_run,
            task_keys=self.task_keys + other.task_keys,
            asset_keys=self.asset_keys + other.asset_keys,
            offloaded_values=self.offloaded_values + other.offloaded_values,
            orphan_files=self.orphan_files + other.orphan_files,
            batches=self.batches + other.batches,
        )


class StateBackend(ABC):
    """Storage for the task store and the asset store, shared by many accessors.

    Rules every backend keeps:

    - ``get``/``keys`` never return an expired task key or a key of a deactivated asset;
    - ``set`` is an upsert that replaces the value, the expiry and the writer;
    - ``delete``/``clear`` remove the row first, then any offloaded value;
    - ``set`` on a deactivated asset raises :class:`AssetInactiveError`.
    """

    def __init__(self, settings: StateStoreSettings | None = None, *, clock: Clock = time.time):
        self.settings = settings if settings is not None else StateStoreSettings()
        self._clock = clock

    def now(self) -> float:
        """The backend's clock (seconds since the epoch); injectable for tests."""
        return self._clock()

    # -- storage, sync ---------------------------------------------------------------

    @abstractmethod
    def get(self, scope: Scope, key: str) -> StateEntry | None:
        """The live entry for ``key`` in ``scope``, or None."""

    @abstractmethod
    def set(self, scope: Scope, write: StateWrite) -> None:
        """Insert or replace ``write.key`` in ``scope``."""

    @abstractmethod
    def delete(self, scope: Scope, key: str) -> bool:
        """Remove ``key`` from ``scope``; return whether a row existed (missing: no-op)."""

    @abstractmethod
    def clear(self, scope: Scope) -> int:
        """Remove every key of ``scope`` (expired ones included); return how many."""

    @abstractmethod
    def keys(self, scope: Scope) -> list[str]:
        """The live keys of ``scope``, sorted."""

    @abstractmethod
    def entries(self, scope: Scope) -> list[StateEntry]:
        """The live entries of ``scope``, sorted by key."""

    @abstractmethod
    def gc(self, *, dry_run: bool = False) -> GcReport:
        """Remove expired task keys and keys of deactivated assets, in batches."""

    @abstractmethod
    def deactivate_asset(self, asset: str) -> None:
        """Mark ``asset`` as gone: its keys vanish at once, GC removes them, writes fail."""

    @abstractmethod
    def activate_asset(self, asset: str) -> None:
        """Make a deactivated ``asset`` writable again, with an empty store."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the backend's sync resources."""

    # -- storage, async twins (threads unless overridden) ----------------------------

    async def aget(self, scope: Scope, key: str) -> StateEntry | None:
        return await asyncio.to_thread(self.get, scope, key)

    async def aset(self, scope: Scope, write: StateWrite) -> None:
        await asyncio.to_thread(self.set, scope, write)

    async def adelete(self, scope: Scope, key: str) -> bool:
        return await asyncio.to_thread(self.delete, scope, key)

    async def aclear(self, scope: Scope) -> int:
        return await asyncio.to_thread(self.clear, scope)

    async def akeys(self, scope: Scope) -> list[str]:
        return await asyncio.to_thread(self.keys, scope)

    async def aentries(self, scope: Scope) -> list[StateEntry]:
        return await asyncio.to_thread(self.entries, scope)

    async def agc(self, *, dry_run: bool = False) -> GcReport:
        return await asyncio.to_thread(lambda: self.gc(dry_run=dry_run))

    async def adeactivate_asset(self, asset: str) -> None:
        await asyncio.to_thread(self.deactivate_asset, asset)

    async def aactivate_asset(self, asset: str) -> None:
        await asyncio.to_thread(self.activate_asset, asset)

    async def aclose(self) -> None:
        """Release the backend's resources (sync and async)."""
        self.close()

    # -- offloading hooks --------------------------------------------------------------

    def offloads(self, nbytes: int, key: str, scope: Scope) -> bool:
        """Whether a value of ``nbytes`` (encoded JSON) goes through :meth:`serialize_to_ref`."""
        return False

    def serialize_to_ref(self, value: JsonValue, key: str, scope: Scope) -> str:
        """Store ``value`` outside the metastore and return its reference.

        The reference must be deterministic for ``(scope, key)`` so that a retry
        overwrites the same object instead of leaving another one behind.
        """
        raise NotImplementedError(f"{type(self).__name__} does not offload values")

    def deserialize_from_ref(self, ref: str) -> JsonValue:
        """Load a value stored by :meth:`serialize_to_ref`."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot read offloaded value {ref!r}: configure the "
            "offloading backend that wrote it (state.offload_dir or state.backend)"
        )

    def purge_ref(self, ref: str) -> None:
        """Remove an offloaded value; called after its row is gone. Missing: no-op."""
        raise NotImplementedError(f"{type(self).__name__} cannot remove offloaded value {ref!r}")

    async def aserialize_to_ref(self, value: JsonValue, key: str, scope: Scope) -> str:
        return await asyncio.to_thread(self.serialize_to_ref, value, key, scope)

    async def adeserialize_from_ref(self, ref: str) -> JsonValue:
        return await asyncio.to_thread(self.deserialize_from_ref, ref)

    async def apurge_ref(self, ref: str) -> None:
        await asyncio.to_thread(self.purge_ref, ref)

    # -- garbage collection in a long-running engine -----------------------------------

    async def run_gc_forever(
        self,
        *,
        interval: float | None = None,
        on_report: Callable[[GcReport], None] | None = None,
    ) -> NoReturn:
        """Collect garbage now and then every ``interval`` seconds (``gc_interval``).

        Meant to run as a task owned by the engine's TaskGroup and cancelled with
        it. A failed round is logged and retried at the next interval: a database
        hiccup must not bring the engine down.
        """
        period = self.settings.gc_interval if interval is None else interval
        while True:
            try:
                report = await self.agc()
            except Exception:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    # cancelled inside a database call, which turned the cancellation
                    # into a driver error: stop, do not sleep a whole period
                    raise asyncio.CancelledError from None
                log.exception("state store garbage collection failed; next try in %.0f s", period)
            else:
                if report.task_keys or report.asset_keys or report.orphan_files:
                    log.info(
                        "state store garbage collection removed task_keys=%d asset_keys=%d "
                        "offloaded_values=%d orphan_files=%d in %d batches",
                        report.task_keys,
                        report.asset_keys,
                        report.offloaded_values,
                        report.orphan_files,
                        report.batches,
                    )
                if on_report is not None:
                    on_report(report)
            await asyncio.sleep(period)

    # -- context managers --------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
