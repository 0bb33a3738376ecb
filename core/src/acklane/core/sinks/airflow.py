"""The ``airflow`` sink: each stored event becomes one asset event in Apache Airflow 3.x,
exactly once, through its REST API.

``POST /api/v2/assets/events`` with ``{"asset_id": <id>, "extra": {...}}``: the extra
holds the payload (an object's keys at the top level, any other JSON value under
``"payload"``) and acklane's fields under ``"acklane"`` (the event id among them).
Airflow has no idempotency key, so exactly once rests on a lookup:
:meth:`AirflowSink.delivered_already` lists the asset's events since the batch was
stored and matches ``extra.acklane.event_id``. The dispatcher asks it for what a
crash left in flight; the sink asks it itself before any retry (``attempt > 1``),
since the attempt before may have got through (a timeout, a reset, a 5xx).

Settings, outcomes and the window exactly once leaves: docs/sinks/airflow.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, ClassVar, Final, Literal, Self
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from ..durations import Duration
from ..redact import MASK, MIN_LENGTH, redact
from ._airflow_client import (
    AirflowClient,
    AssetRef,
    CredentialsRefused,
    Reply,
    UnsureDelivery,
    detail_of,
    redirect_note,
    retry_after_of,
)
from ._base import (
    Delivery,
    DeliveryError,
    RefusedDelivery,
    RetryableDelivery,
    Sink,
    SinkContext,
    SinkError,
    field_problem,
)
from ._settings import SinkSettings

__all__ = [
    "RESERVED_KEYS",
    "AirflowSink",
    "AirflowSinkSettings",
    "CredentialsRefused",
    "UnsureDelivery",
    "encode_extra",
    "event_extra",
    "outcome_of",
    "post_body",
]

log = logging.getLogger("acklane.core.sinks.airflow")

#: Top-level keys of an asset event's extra that a payload object cannot use: acklane's
#: own, and the one Airflow sets on every event posted through the API.
RESERVED_KEYS: Final = ("acklane", "from_rest_api")


class AirflowSinkSettings(SinkSettings):
    """``kind: airflow``: an Airflow 3.x API server and the asset events go to."""

    kind: Literal["airflow"]
    #: The API server's base URL (``http://localhost:8080``, or with the path prefix
    #: the server is mounted under).
    url: str
    #: For ``POST /auth/token``; both or neither.
    username: Annotated[str, Field(min_length=1)] | None = None
    password: SecretStr | None = None
    #: A token given directly (not refreshed), instead of username and password.
    token: SecretStr | None = None
    #: The asset by name, or by URI; neither: each event's watcher's ``asset``.
    asset: Annotated[str, Field(min_length=1)] | None = None
    asset_uri: Annotated[str, Field(min_length=1)] | None = None
    verify_tls: bool = True
    #: Per request (the whole exchange: connect, send, read).
    timeout: Annotated[Duration, Field(gt=0)] = 10.0
    #: The lookup of what Airflow already has searches from this long before the
    #: earliest stored_at of the events looked up (clock skew between hosts).
    lookup_window: Duration = 3600.0

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"expected the API server's base URL, such as http://localhost:8080, got {value!r}"
            )
        if parts.username is not None or parts.password is not None:
            raise ValueError("url must not hold credentials: use username and password, or token")
        if parts.query or parts.fragment:
            raise ValueError("url must be a base URL, without a query or a fragment")
        return value.strip().rstrip("/")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together (for POST /auth/token)")
        if self.token is not None and self.username is not None:
            raise ValueError("give either token or username and password, not both")
        if self.asset is not None and self.asset_uri is not None:
            raise ValueError("give either asset (a name) or asset_uri, not both")
        if self.batch_size != 1:
            raise ValueError(
                "batch_size must be 1: Airflow's API takes one asset event per request"
            )
        return self

    def asset_ref(self) -> AssetRef | None:
        """The asset the sink names, if it names one."""
        if self.asset is not None:
            return AssetRef("name", self.asset)
        if self.asset_uri is not None:
            return AssetRef("uri", self.asset_uri)
        return None


def event_extra(delivery: Delivery, trace: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The asset event's ``extra`` for ``delivery``.

    ``trace``: the W3C fields of the delivery's span (``traceparent``, ``tracestate``),
    kept beside acklane's own fields when tracing is on.

    A payload object whose keys clash with none of :data:`RESERVED_KEYS` is spread at
    the top level; any other payload (not an object, or with an ``acklane`` or
    ``from_rest_api`` key, which would be overwritten) goes whole under ``"payload"``.
    ``acklane.payload_wrapped`` says which, so a DAG never has to guess.
    """
    payload = delivery.payload
    spread = isinstance(payload, dict) and not any(key in payload for key in RESERVED_KEYS)
    ours = {**delivery.acklane_fields(), "payload_wrapped": not spread}
    if trace:
        ours.update(trace)
    if spread:
        return {**payload, "acklane": ours}
    return {"payload": payload, "acklane": ours}


def encode_extra(delivery: Delivery, trace: Mapping[str, str] | None = None) -> bytes:
    """The extra as strict JSON in UTF-8; :class:`RefusedDelivery` for a payload that
    has no such form (NaN or infinity, which Airflow would store as null; a lone
    surrogate; a value JSON cannot hold; nesting too deep to encode)."""
    try:
        text = json.dumps(
            event_extra(delivery, trace), allow_nan=False, ensure_ascii=False, separators=(",", ":")
        )
        return text.encode("utf-8")
    except (ValueError, TypeError, UnicodeEncodeError, RecursionError) as exc:
        raise RefusedDelivery(
            f"the payload of event {delivery.event_id} cannot be sent as JSON: "
            f"{type(exc).__name__}: {exc}"
        ) from None


def post_body(asset_id: int, extra: bytes) -> bytes:
    """``{"asset_id": <id>, "extra": <extra>}`` around an encoded extra."""
    return b'{"asset_id":%d,"extra":%s}' % (asset_id, extra)


def outcome_of(
    reply: Reply, what: str, scrub: Callable[[str], str] = redact, *, retry_after_cap: float
) -> DeliveryError | None:
    """What a reply to ``POST /api/v2/assets/events`` means (401 and the 403 of an
    invalid token were handled by the client, 404 by the sink).

    2xx: delivered. 400, 413, 422: refused, about this event's body, with the status
    and the first bytes of the body. 408, 429, 5xx: retryable, ``Retry-After``
    honoured (5xx as :class:`UnsureDelivery`: it may come after Airflow's commit).
    403 (permission), 3xx (a redirect, not followed: the event did not arrive) and any
    other status: retryable, since a permission or a setting the operator fixes should
    not need every event retried by hand. ``Retry-After`` is capped at
    ``retry_after_cap`` (the sink's ``backoff_max``).
    """
    status = reply.status
    if 200 <= status < 300:
        return None
    detail = scrub(detail_of(reply.text))
    if status in (400, 413, 422):
        return RefusedDelivery(f"{what}: Airflow refused the event: {status} {detail}")
    if status == 403:
        return RetryableDelivery(
            f"{what}: 403 {detail}: the Airflow user may not create asset events "
            f"(needs the asset's POST permission)"
        )
    if 300 <= status < 400:
        return RetryableDelivery(f"{what}: {status} {detail}{scrub(redirect_note(reply))}")
    retry_after = retry_after_of(reply.headers, cap=retry_after_cap)
    if status >= 500:
        # from a proxy, or from Airflow after its commit: the event may be there
        return UnsureDelivery(f"{what}: {status} {detail}", retry_after=retry_after)
    return RetryableDelivery(f"{what}: {status} {detail}", retry_after=retry_after)


class AirflowSink(Sink):
    """Asset events in Airflow 3.x through ``POST /api/v2/assets/events``."""

    kind: ClassVar[str] = "airflow"
    settings_model: ClassVar[type[SinkSettings]] = AirflowSinkSettings
    exactly_once: ClassVar[bool] = True

    def __init__(self, settings: SinkSettings, context: SinkContext | None = None) -> None:
        if not isinstance(settings, AirflowSinkSettings):
            raise SinkError(
                f"sink {settings.name}: expected AirflowSinkSettings, got {type(settings).__name__}"
            )
        super().__init__(settings, context)
        self.config: AirflowSinkSettings = settings
        # masked in reasons as redact() masks registered secrets (too short: not searched)
        self._secrets = [
            value
            for secret in (settings.password, settings.token)
            if secret is not None and len(value := secret.get_secret_value()) >= MIN_LENGTH
        ]
        self._client: AirflowClient | None = None
        self._asset_ids: dict[AssetRef, int] = {}
        self._resolving = asyncio.Lock()

    def __repr__(self) -> str:
        return f"<AirflowSink {self.name} -> {self.destination}>"

    @property
    def destination(self) -> str:
        ref = self.config.asset_ref()
        target = str(ref) if ref is not None else "each watcher's asset"
        return f"airflow {self.config.url} ({target})"

    # -- configuration ----------------------------------------------------------------------

    @classmethod
    def config_problems(cls, settings: SinkSettings, context: SinkContext) -> list[tuple[str, str]]:
        assert isinstance(settings, AirflowSinkSettings)
        return [field_problem(p) for p in cls.check_config(settings, context.watcher_assets)]

    @staticmethod
    def check_config(
        settings: AirflowSinkSettings, watcher_assets: Mapping[str, str | None]
    ) -> list[str]:
        """Problems of ``settings`` for the watchers that name the sink
        (``watcher_assets``: those watchers' ``asset``). Without ``asset`` or
        ``asset_uri`` the sink posts to each event's watcher's asset, so each of
        them needs one."""
        if settings.asset_ref() is not None:
            return []
        return [
            f"sink {settings.name} (kind airflow) names no asset and watcher {watcher} has "
            f"none: give the watcher an asset, or the sink asset or asset_uri"
            for watcher, asset in sorted(watcher_assets.items())
            if not asset
        ]

    def _asset_for(self, delivery: Delivery) -> AssetRef:
        ref = self.config.asset_ref()
        if ref is not None:
            return ref
        asset = self.context.watcher_assets.get(delivery.watcher)
        if not asset:
            # a configuration error check_config reports at load time; held, not parked
            raise RetryableDelivery(
                f"sink {self.name} names no asset and watcher {delivery.watcher} has none"
            )
        return AssetRef("name", asset)

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, MASK)
        return redact(text)

    # -- life -------------------------------------------------------------------------------

    async def open(self) -> None:
        if self._client is not None:
            return
        settings = self.config
        client = AirflowClient(
            url=settings.url,
            username=settings.username,
            password=settings.password.get_secret_value() if settings.password else None,
            token=settings.token.get_secret_value() if settings.token else None,
            verify_tls=settings.verify_tls,
            timeout=settings.timeout,
            retry_after_cap=settings.backoff_max,
            scrub=self._scrub,
        )
        await client.open()
        self._client = client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def _open_client(self) -> AirflowClient:
        if self._client is None:
            raise RetryableDelivery(f"sink {self.name} is not open")
        return self._client

    async def check(self) -> None:
        """Reach Airflow, log in, and resolve the sink's asset (or, when the assets are
        the watchers', read one page of assets: the credentials and the read
        permission); deliver nothing. :class:`SinkError` names what failed."""
        opened_here = self._client is None
        await self.open()
        client = self._open_client()
        try:
            version = await client.version()
            ref = self.config.asset_ref()
            if ref is None:
                reply = await client.request("GET", "api/v2/assets", params={"limit": 1})
                client.expect_ok(reply, "GET /api/v2/assets")
            elif await self._resolve(ref, fresh=True) is None:
                raise SinkError(
                    f"sink {self.name}: Airflow {version} at {self.config.url} has no active "
                    f"{ref} (is the DAG that uses it parsed?)"
                )
        except DeliveryError as exc:
            raise SinkError(f"sink {self.name}: {exc.reason}") from None
        finally:
            if opened_here:
                await self.aclose()

    # -- assets -----------------------------------------------------------------------------

    async def _resolve(self, ref: AssetRef, *, fresh: bool = False) -> int | None:
        """The asset's id, cached; ``fresh`` asks Airflow again."""
        async with self._resolving:
            if not fresh and ref in self._asset_ids:
                return self._asset_ids[ref]
            asset_id = await self._open_client().find_asset(ref)
            if asset_id is None:
                self._asset_ids.pop(ref, None)
            else:
                if self._asset_ids.get(ref) not in (None, asset_id):
                    log.info("sink %s: %s is now asset id %d", self.name, ref, asset_id)
                self._asset_ids[ref] = asset_id
            return asset_id

    def _not_found(self, ref: AssetRef) -> RetryableDelivery:
        return RetryableDelivery(
            f"Airflow at {self.config.url} has no active {ref} (is the DAG that uses it "
            f"parsed? an asset no DAG uses is not active)"
        )

    # -- delivery ---------------------------------------------------------------------------

    async def deliver_one(self, delivery: Delivery) -> None:
        with self.delivery_spans((delivery,)) as spans:
            await self._deliver_one(delivery, spans.carrier(0))
            spans.results((None,))

    async def _deliver_one(self, delivery: Delivery, trace: Mapping[str, str]) -> None:
        ref = self._asset_for(delivery)
        what = f"event {delivery.event_id} to {ref}"
        extra = encode_extra(delivery, trace)  # no JSON form: refused before any I/O
        if delivery.attempt > 1 and await self.delivered_already([delivery]):
            log.info("sink %s: %s was in Airflow already; not sent again", self.name, what)
            return
        client = self._open_client()
        asset_id = await self._resolve(ref)
        if asset_id is None:
            raise self._not_found(ref)
        reply = await client.post_event(post_body(asset_id, extra))
        if reply.status == 404:
            # the asset went (its DAG removed, or recreated under a new id): look again
            fresh = await self._resolve(ref, fresh=True)
            if fresh is None:
                raise self._not_found(ref)
            if fresh == asset_id:
                raise RetryableDelivery(
                    self._scrub(f"{what}: 404 {detail_of(reply.text)} (asset id {asset_id})")
                )
            reply = await client.post_event(post_body(fresh, extra))
            if reply.status == 404:
                raise self._not_found(ref)
        outcome = outcome_of(reply, what, self._scrub, retry_after_cap=self.config.backoff_max)
        if outcome is not None:
            raise outcome

    async def delivered_already(self, batch: Sequence[Delivery]) -> set[str]:
        """The event ids of ``batch`` that Airflow already has: the asset's events from
        ``lookup_window`` before the earliest stored_at on, matched on
        ``extra.acklane.event_id``. Raises (retryable) when Airflow cannot be asked:
        then nothing is known and nothing should be sent."""
        by_asset: dict[AssetRef, list[Delivery]] = {}
        for delivery in batch:
            by_asset.setdefault(self._asset_for(delivery), []).append(delivery)
        client = self._open_client()
        found: set[str] = set()
        window = timedelta(seconds=self.config.lookup_window)
        for ref, deliveries in by_asset.items():
            asset_id = await self._resolve(ref)
            if asset_id is None:
                continue  # no such asset: none of its events can be there
            since = min(_aware(d.created_at) for d in deliveries) - window
            wanted = {d.event_id for d in deliveries}
            found |= await client.event_ids_since(asset_id, since, wanted)
        return found


def _aware(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
