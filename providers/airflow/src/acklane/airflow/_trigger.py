"""The base class of acklane's Airflow event triggers: one connector's stream, shared.

An :class:`AcklaneEventTrigger` subclass names one acklane connector. Its kwargs
(what :meth:`serialize` returns, what Airflow stores and rebuilds it from) are
plain JSON: the connector's settings that are not secrets, an optional Airflow
connection id for the rest, and the filter block as written in acklane's YAML.

In Airflow's triggerer, triggers with equal :meth:`shared_stream_key` share one
poll (Airflow's ``SharedStreamManager``, in ack mode): the group's producer is
acklane's own for the broker, wrapped so that the connection is read lazily and
the reasons given to ``reject_shared_stream_event(reason)`` reach the
dead-letter copy (Airflow's outcomes have no room for them).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, cast

from pydantic import BaseModel, SecretStr, ValidationError

from acklane.core.connectors import Connector, deprecated_names
from acklane.core.pipeline.filters import CompiledFilter, FilterSpecError, compile_filter
from acklane.core.producer import AdvanceItem, AdvanceOutcome, SharedStreamProducer
from acklane.core.producer import reject_reasons_of as _reasons_of
from acklane.core.redact import is_secret_name
from acklane.core.trigger import TriggerEvent, current_window
from airflow.triggers.base import BaseEventTrigger
from airflow.triggers.base import TriggerEvent as AirflowTriggerEvent

from ._errors import AirflowTriggerError

if TYPE_CHECKING:
    from airflow.sdk.definitions.connection import Connection

__all__ = ["AcklaneEventTrigger", "AirflowTriggerError"]

log = logging.getLogger("acklane.airflow")

#: The kwargs every acklane trigger takes besides its connector's settings.
OWN_KWARGS = ("conn_id", "filter", "name")


def _json_copy(value: Any, where: str) -> Any:
    """``value`` as plain JSON (tuples become lists), or an error naming ``where``."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise AirflowTriggerError(f"{where}: not JSON-serializable ({exc})") from None


def _secret_fields(model: type[BaseModel]) -> frozenset[str]:
    """The fields of a connector's model typed ``SecretStr`` (optionally)."""
    out = set()
    for name, info in model.model_fields.items():
        annotation = info.annotation
        args = getattr(annotation, "__args__", ())
        if annotation is SecretStr or SecretStr in args:
            out.add(name)
    return frozenset(out)


def _secret_paths(value: Any, path: str) -> list[str]:
    """Where inside ``value`` a key is named like a secret (``sasl.password``, ...)."""
    found: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            inner = f"{path}.{key}"
            if isinstance(key, str) and is_secret_name(key):
                found.append(inner)
            found.extend(_secret_paths(item, inner))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(_secret_paths(item, f"{path}[{index}]"))
    return found


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# -- the wrapped producer: the connection read lazily, reject reasons carried --------------

#: The producers running in this process, by shared stream key (a closing one and
#: its successor may overlap for a moment).
_LIVE: dict[Hashable, list[_AcklaneProducer]] = {}


class _Pending:
    __slots__ = ("payload", "raw", "reasons")

    def __init__(self, raw: Any, payload: Any) -> None:
        self.raw = raw
        self.payload = payload
        self.reasons: list[str] = []


class _AcklaneProducer(SharedStreamProducer):
    """acklane's producer for one group, built when the poll starts.

    The Airflow connection is read and the configuration validated in
    :meth:`open_stream` (in the triggerer's event loop, never at DAG parse time).
    Every event handed out is remembered until it is advanced, with the reasons
    its watchers gave when they rejected it; :meth:`advance` hands them to acklane's
    producer in an acklane ``AdvanceOutcome``, so the dead-letter copy says why.
    """

    def __init__(self, trigger_class: type[AcklaneEventTrigger], kwargs: Mapping[str, Any]) -> None:
        self.trigger_class = trigger_class
        self.kwargs = dict(kwargs)
        self.key = trigger_class.key_of(self.kwargs)
        self.settings = trigger_class.settings_of(self.kwargs)
        self.inner: SharedStreamProducer | None = None
        self._pending: dict[int, _Pending] = {}
        self._raw_of: dict[int, int] = {}  # id(broker payload) -> id(raw event)
        self._closed = False

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        config = await self.trigger_class.aconfig(self.kwargs)
        inner = self.inner = self.trigger_class.connector_class.create_producer(config)
        _LIVE.setdefault(self.key, []).append(self)
        log.info("acklane %s", self.trigger_class.connector_class.describe(config))
        async for raw, payload in inner.open_stream():
            self._pending[id(raw)] = _Pending(raw, payload)
            self._raw_of[id(payload)] = id(raw)
            yield raw, payload

    def note_reject(self, raw: Any, reason: str | None) -> bool:
        """Keep ``reason`` for the dead-letter copy of ``raw``; False if not ours."""
        pending = self._pending.get(id(raw))
        if pending is None or pending.raw is not raw:
            return False
        if reason:
            pending.reasons.append(reason)
        return True

    def holds(self, raw: Any) -> bool:
        pending = self._pending.get(id(raw))
        return pending is not None and pending.raw is raw

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        assert self.inner is not None
        return self.inner.get_advance_lane(broker_payload)

    def message_id(self, broker_payload: Any) -> str | None:
        return None if self.inner is None else self.inner.message_id(broker_payload)

    def counters(self) -> Mapping[str, float]:
        return {} if self.inner is None else self.inner.counters()

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        assert self.inner is not None
        items: list[AdvanceItem] = []
        for item in batch:
            raw_id = self._raw_of.pop(id(item.broker_payload), None)
            pending = None if raw_id is None else self._pending.pop(raw_id, None)
            outcome = item.outcome
            reasons = () if pending is None else tuple(pending.reasons)
            if reasons and outcome.rejected:
                outcome = AdvanceOutcome(
                    acked=outcome.acked,
                    failed=outcome.failed,
                    rejected=outcome.rejected,
                    reject_reasons=(*_reasons_of(outcome), *reasons),
                )
            items.append(AdvanceItem(item.broker_payload, outcome))
        await self.inner.advance(items)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        live = _LIVE.get(self.key, [])
        with contextlib.suppress(ValueError):
            live.remove(self)
        if not live:
            _LIVE.pop(self.key, None)
        self._pending.clear()
        self._raw_of.clear()
        if self.inner is not None:
            await self.inner.aclose()


class _ReasonWindow:
    """acklane's binding window under Airflow's manager: keeps the reason, then rejects.

    Set (in the filter's task) for the raw event the filter is on, so that
    ``acklane.core.trigger.reject_shared_stream_event(reason)`` reaches it. Under
    acklane's own manager (its window was open first) the reject goes there.
    """

    __slots__ = ("key", "previous", "raw")

    def __init__(self, key: Hashable, raw: Any, previous: Any) -> None:
        self.key = key
        self.raw = raw
        self.previous = previous

    def reject(self, reason: str | None) -> bool:
        if self.previous is not None and self.previous.reject(reason):
            return True
        from airflow.triggers import shared_stream

        if shared_stream._reject_context.get() is None:
            return False  # no Airflow window either: the caller warns
        for producer in _LIVE.get(self.key, ()):
            if producer.note_reject(self.raw, reason):
                break
        shared_stream.reject_shared_stream_event()
        return True


# -- the trigger ---------------------------------------------------------------------------


class AcklaneEventTrigger(BaseEventTrigger):
    """An Airflow event trigger over one acklane connector; use it in an ``AssetWatcher``.

    Keyword arguments:

    - the connector's settings, as in a stream block of acklane's YAML (``topics``,
      ``group_id``, ``queue_url``, ``dead_letter``...), secrets excepted;
    - ``conn_id``: an Airflow connection holding the rest (servers, endpoint,
      region, credentials...); read in the triggerer when the poll starts;
    - ``filter``: acklane's filter block (``match`` / ``reject`` / ``emit`` rules,
      ``reject_invalid_json``, or ``function: "module:function"``), or the function's
      import path alone; default: fire with the JSON body, dead-letter what is not JSON;
    - ``name``: the watcher's name in reject reasons (``watcher <name>: ...``).

    Triggers with the same connection settings share one poll in the triggerer;
    the broker is advanced only once every trigger of the poll is done with a
    message and Airflow has stored the asset events it fired.
    """

    #: The acklane connector whose stream this trigger watches.
    connector_class: ClassVar[type[Connector[Any]]]
    #: The settings that pick the upstream when part of them comes from a connection.
    upstream_settings: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        *,
        conn_id: str | None = None,
        filter: Mapping[str, Any] | str | None = None,  # the YAML block's name
        name: str | None = None,
        **settings: Any,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.conn_id = conn_id
        self.name = name
        spec = {"function": filter} if isinstance(filter, str) else filter
        self.filter = None if spec is None else _json_copy(dict(spec), "filter")
        self.settings = self.check_settings(settings, conn_id)
        label = f"watcher {name}" if name else ""
        try:
            self._compiled: CompiledFilter = compile_filter(self.filter, label=label)
        except FilterSpecError as exc:
            raise AirflowTriggerError(f"{type(self).__name__}: filter: {exc}") from None
        if conn_id is None:
            type(self).config_of(self.settings, {})  # everything is here: refuse it now

    # -- kwargs, key and configuration (class-level: the producer has only the kwargs)

    @classmethod
    def check_settings(cls, settings: Mapping[str, Any], conn_id: str | None) -> dict[str, Any]:
        """The connector settings of a trigger, as JSON; secrets and unknown names refused."""
        model = cls.connector_class.config_model
        fields = {*model.model_fields, *deprecated_names(model)}  # old names still read
        secret_fields = _secret_fields(model)
        name = cls.__name__
        problems: list[str] = []
        for key, value in settings.items():
            if key not in fields:
                problems.append(f"{key}: not a setting of {cls.connector_class.name} streams")
            elif key in secret_fields or is_secret_name(key):
                problems.append(
                    f"{key}: a secret; keep it in the Airflow connection (conn_id), never in "
                    "the trigger's arguments (Airflow stores and shows them)"
                )
            else:
                problems.extend(
                    f"{path}: named like a secret; keep it in the Airflow connection (conn_id)"
                    for path in _secret_paths(value, key)
                )
        if problems:
            raise AirflowTriggerError(f"{name}: " + "; ".join(problems))
        if conn_id is not None and (not isinstance(conn_id, str) or not conn_id):
            raise AirflowTriggerError(f"{name}: conn_id must be a non-empty string")
        copied: dict[str, Any] = _json_copy(dict(settings), name)
        return copied

    @classmethod
    def settings_of(cls, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """What triggers of one key must agree on: the settings and the connection id."""
        out = {k: v for k, v in kwargs.items() if k not in ("filter", "name")}
        return _json_copy(out, cls.__name__)  # type: ignore[no-any-return]

    @classmethod
    def key_of(cls, kwargs: Mapping[str, Any]) -> tuple[Hashable, ...]:
        """The shared stream key of a trigger with these kwargs.

        All settings given: acklane's own key for the connector (as ``acklane run``
        derives it). With a connection: the connection id and the settings in
        :attr:`upstream_settings` that the trigger gives itself.
        """
        connector = cls.connector_class
        settings = {k: v for k, v in kwargs.items() if k not in OWN_KWARGS}
        conn_id = kwargs.get("conn_id")
        if conn_id is None:
            return ("acklane", connector.name, *connector.stream_key(settings))
        upstream = {
            k: sorted(v) if isinstance(v, list) and all(isinstance(i, str) for i in v) else v
            for k, v in settings.items()
            if k in cls.upstream_settings
        }
        return ("acklane", connector.name, "conn", conn_id, _canonical(upstream))

    @classmethod
    def config_of(cls, settings: Mapping[str, Any], from_connection: Mapping[str, Any]) -> Any:
        """The validated configuration: the connection's fields, then the trigger's."""
        merged: dict[str, Any] = dict(from_connection)
        for key, value in settings.items():
            base = merged.get(key)
            if isinstance(base, Mapping) and isinstance(value, Mapping):
                merged[key] = {**base, **value}  # client properties: the trigger's win
            else:
                merged[key] = value
        try:
            return cls.connector_class.config_model.model_validate(merged)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}"
                for e in exc.errors()
            )
            raise AirflowTriggerError(f"{cls.__name__}: {problems}") from None

    @classmethod
    def connection_fields(cls, conn: Connection, extra: Mapping[str, Any]) -> dict[str, Any]:
        """The connector settings an Airflow connection holds (a broker overrides this).

        The default takes the keys of the connection's extra that are names of the
        connector's settings.
        """
        model = cls.connector_class.config_model
        fields = {*model.model_fields, *deprecated_names(model)}
        return {k: v for k, v in extra.items() if k in fields}

    @classmethod
    async def aconfig(cls, kwargs: Mapping[str, Any]) -> Any:
        """The configuration of a group's producer: the connection read now, if any."""
        settings = {k: v for k, v in kwargs.items() if k not in OWN_KWARGS}
        conn_id = kwargs.get("conn_id")
        from_connection: dict[str, Any] = {}
        if conn_id is not None:
            from airflow.sdk import BaseHook

            conn = await BaseHook.aget_connection(conn_id)
            extra = await conn.aextra_dejson()
            from_connection = cls.connection_fields(conn, extra)
        return cls.config_of(settings, from_connection)

    # -- Airflow's trigger

    def serialize(self) -> tuple[str, dict[str, Any]]:
        cls = type(self)
        kwargs: dict[str, Any] = dict(self.settings)
        for own in OWN_KWARGS:
            value = getattr(self, own)
            if value is not None:
                kwargs[own] = value
        return f"{cls.__module__}.{cls.__qualname__}", kwargs

    def shared_stream_key(self) -> Hashable:
        return self.key_of(self.serialize()[1])

    def shared_stream_settings(self) -> dict[str, Any]:
        """acklane's manager refuses a trigger joining a poll with other settings."""
        return self.settings_of(self.serialize()[1])

    @classmethod
    def create_shared_stream_producer(  # type: ignore[override]
        cls, kwargs: dict[str, Any]
    ) -> SharedStreamProducer:
        """acklane's producer for the connector (it has the shape of Airflow's, which
        the manager never checks by class)."""
        return _AcklaneProducer(cls, kwargs)

    @property
    def asset_store(self) -> Any:
        """The asset store of the asset(s) this watcher feeds: Airflow's ``asset_state_store``.

        The name acklane's filters use (``watcher.asset_store``); the same methods as
        acklane's ``AssetStore`` (``get``, ``set``, ``delete``, ``clear`` and their
        async twins ``aget``...), kept by Airflow in its metadata database. ``None``
        outside Airflow's triggerer.
        """
        return self.asset_state_store

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[AirflowTriggerEvent]:
        """acklane's filter over the shared raw stream, yielding Airflow's trigger events."""
        events = cast(
            "AsyncGenerator[TriggerEvent, None]",
            self._compiled.run(self._windowed(shared_stream), self),
        )
        async with contextlib.aclosing(events):
            async for event in events:
                payload = event.payload if isinstance(event, TriggerEvent) else event
                yield AirflowTriggerEvent(payload)  # type: ignore[no-untyped-call]

    async def _windowed(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """The raw stream, with acklane's reject window open on each event."""
        key = self.shared_stream_key()
        checked = False
        async for raw in shared_stream:
            if not checked:
                self._check_group_settings(key, raw)
                checked = True
            previous = current_window.get()
            current_window.set(_ReasonWindow(key, raw, previous))
            try:
                yield raw
            finally:
                current_window.set(previous)

    def _check_group_settings(self, key: Hashable, raw: Any) -> None:
        """Refuse to watch a poll whose producer was built from other settings.

        Airflow's manager builds a group's producer from its first trigger's kwargs
        and does not compare the others': a trigger with another dead-letter
        destination or other tuning would silently run with the first one's.
        """
        mine = self.shared_stream_settings()
        for producer in _LIVE.get(key, ()):
            if producer.holds(raw) and producer.settings != mine:
                differ = sorted(
                    k
                    for k in set(mine) | set(producer.settings)
                    if mine.get(k) != producer.settings.get(k)
                )
                raise AirflowTriggerError(
                    f"{type(self).__name__}: joins the poll of {key!r} whose producer has other "
                    f"settings ({', '.join(differ)}); give triggers of one poll the same settings"
                )

    async def run(self) -> AsyncIterator[AirflowTriggerEvent]:
        raise NotImplementedError(
            f"{type(self).__name__} runs only through the triggerer's shared streams "
            "(its key is never None): the ack channel needs Airflow's SharedStreamManager"
        )
        yield  # pragma: no cover
