"""A thin asyncio client of Apache Airflow 3.x's REST API, for the ``airflow`` sink.

Only what the sink needs: a token from ``POST /auth/token`` (refreshed once when
Airflow says it expired or is invalid), the assets by name or URI
(``GET /api/v2/assets``), asset events posted (``POST /api/v2/assets/events``) and
listed (``GET /api/v2/assets/events``), and ``GET /api/v2/version``. Why not
``apache-airflow-client``: docs/sinks/airflow.md.

Errors come out as the sink contract's outcomes: :class:`RetryableDelivery` (with
:class:`UnsureDelivery` when a request may have reached Airflow before it failed),
:class:`CredentialsRefused` for a login or token Airflow does not take. Every reason
passes through the client's ``scrub`` (the password and the token replaced by
``***``, then :func:`acklane.core.redact.redact`); a token obtained at run
time is registered there as a secret, so that an answer quoting it shows ``***``.

Airflow's answers are untrusted input: redirects are not followed (a login sent on
to another host would carry the password, an event would count as delivered where
it never arrived), a body is read up to a limit (:data:`MAX_REPLY_BYTES` for a 2xx,
:data:`ERROR_BYTES` of any other), and ``Retry-After`` is capped at the sink's
``backoff_max``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

import aiohttp

from ..redact import redact_url, remember
from ._base import RetryableDelivery
from ._http import parse_retry_after, read_up_to

__all__ = [
    "PAGE_SIZE",
    "AirflowClient",
    "AssetRef",
    "CredentialsRefused",
    "Reply",
    "UnsureDelivery",
    "detail_of",
    "redirect_note",
    "retry_after_of",
]

log = logging.getLogger("acklane.core.sinks.airflow")

TOKEN_PATH: Final = "auth/token"
VERSION_PATH: Final = "api/v2/version"
ASSETS_PATH: Final = "api/v2/assets"
EVENTS_PATH: Final = "api/v2/assets/events"
#: Rows asked per page; Airflow caps it at ``[api] maximum_page_limit`` (100 by
#: default) without saying so, so paging follows ``total_entries``, not this number.
PAGE_SIZE: Final = 100
#: How much of a response body a reason quotes.
EXCERPT: Final = 300
#: The largest 2xx body read: a page of 100 asset events with large extras fits many
#: times over; a larger answer is an error (retried), not a reason to fill memory.
MAX_REPLY_BYTES: Final = 16 * 1024 * 1024
#: How much of any other answer's body is read: its ``detail`` is all a reason needs.
ERROR_BYTES: Final = 64 * 1024


class UnsureDelivery(RetryableDelivery):
    """Retryable, and the request may have reached Airflow before it failed (a timeout,
    a connection reset, a 5xx from a proxy): look up (:meth:`Sink.delivered_already`)
    before sending the event again."""


class CredentialsRefused(RetryableDelivery):
    """Airflow refused the login or the token. Retryable, not parked: it holds every
    event alike, and the operator fixes it in the configuration."""


@dataclass(frozen=True, slots=True)
class AssetRef:
    """An Airflow asset as the configuration names it: by name or by URI."""

    by: Literal["name", "uri"]
    value: str

    def __str__(self) -> str:
        return f"asset {self.value!r}" if self.by == "name" else f"asset with URI {self.value!r}"


@dataclass(frozen=True, slots=True)
class Reply:
    """A response of Airflow's, read whole."""

    status: int
    text: str
    headers: Mapping[str, str]

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        return json.loads(self.text)


def detail_of(text: str, limit: int = EXCERPT) -> str:
    """The gist of an error body: FastAPI's ``detail`` when there is one, else the
    body's first ``limit`` characters."""
    gist = text
    try:
        data = json.loads(text)
    except ValueError:
        pass
    else:
        if isinstance(data, dict) and "detail" in data:
            detail = data["detail"]
            gist = detail if isinstance(detail, str) else json.dumps(detail, separators=(",", ":"))
    gist = " ".join(gist.split())
    return gist if len(gist) <= limit else gist[:limit] + "..."


def retry_after_of(
    headers: Mapping[str, str], *, cap: float, now: datetime | None = None
) -> float | None:
    """Seconds of a ``Retry-After`` header (a number, or an HTTP date), if any, at most
    ``cap`` (the sink's ``backoff_max``)."""
    return parse_retry_after(
        headers.get("Retry-After"), cap=cap, now=None if now is None else now.timestamp()
    )


def redirect_note(reply: Reply) -> str:
    """For a 3xx: that it was not followed, and where it pointed (a password in the
    ``Location`` masked); else nothing."""
    if not 300 <= reply.status < 400:
        return ""
    location = reply.headers.get("Location")
    where = f", it points to {redact_url(location)}" if location else ""
    return f" (redirects are not followed: set url to the API server's final address{where})"


class AirflowClient:
    """One Airflow API server, one aiohttp session, one token (shared by concurrent
    requests; a refresh is done once for all of them)."""

    def __init__(
        self,
        *,
        url: str,
        username: str | None,
        password: str | None,
        token: str | None,
        verify_tls: bool,
        timeout: float,
        retry_after_cap: float,
        scrub: Callable[[str], str],
    ) -> None:
        self._base = url.rstrip("/") + "/"
        self._username = username
        self._password = password
        self._static_token = token
        self._verify_tls = verify_tls
        self._timeout = timeout
        self.retry_after_cap = retry_after_cap
        self.scrub = scrub
        self._session: aiohttp.ClientSession | None = None
        self._token: str | None = None
        self._login_lock = asyncio.Lock()

    @property
    def base_url(self) -> str:
        return self._base

    @property
    def logs_in(self) -> bool:
        """Whether the client gets its tokens itself (username and password)."""
        return self._username is not None and self._password is not None

    async def open(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout),
                connector=aiohttp.TCPConnector(ssl=self._verify_tls),
                raise_for_status=False,
            )

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # -- requests ---------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        body: bytes | None = None,
        sends: bool = False,
    ) -> Reply:
        """``method path`` with the bearer token; once more with a fresh token when
        Airflow says the token expired or is invalid. ``sends``: the request writes
        (a failure in flight is then an :class:`UnsureDelivery`).

        Returns any reply except an authentication failure, which raises
        :class:`CredentialsRefused`.
        """
        token = await self._bearer()
        reply = await self._send(method, path, params=params, body=body, token=token, sends=sends)
        if _auth_failed(reply) and self.logs_in:
            log.info(
                "Airflow at %s refused the token (%s); logging in again", self._base, reply.status
            )
            token = await self._relogin(stale=token)
            reply = await self._send(
                method, path, params=params, body=body, token=token, sends=sends
            )
        if _auth_failed(reply):
            raise CredentialsRefused(self._refused(reply, f"{method} /{path}"))
        return reply

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None,
        body: bytes | None,
        token: str | None,
        sends: bool,
    ) -> Reply:
        if self._session is None:
            raise RetryableDelivery(f"the Airflow client of {self._base} is not open")
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        what = f"{method} {self._base}{path}"
        try:
            async with self._session.request(
                method,
                self._base + path,
                params=params,
                data=body,
                headers=headers,
                allow_redirects=False,
            ) as resp:
                return await self._read(resp, what, sends=sends)
        except TimeoutError:
            reason = f"{what}: no answer within {self._timeout:g} s"
            raise (UnsureDelivery if sends else RetryableDelivery)(reason) from None
        except aiohttp.ClientConnectorCertificateError as exc:
            raise RetryableDelivery(
                self.scrub(f"{what}: TLS certificate not accepted ({exc.certificate_error})")
            ) from None
        except aiohttp.ClientConnectorError as exc:
            # refused before anything was sent: not unsure
            raise RetryableDelivery(
                self.scrub(f"{what}: cannot connect ({exc.os_error or exc})")
            ) from None
        except aiohttp.ClientError as exc:
            reason = self.scrub(f"{what}: {type(exc).__name__}: {exc}")
            raise (UnsureDelivery if sends else RetryableDelivery)(reason) from None

    async def _read(self, resp: aiohttp.ClientResponse, what: str, *, sends: bool) -> Reply:
        """The reply, its body read up to its limit: a 2xx past :data:`MAX_REPLY_BYTES`
        is an error (its content cannot be trusted whole), any other answer is cut at
        :data:`ERROR_BYTES`."""
        ok = 200 <= resp.status < 300
        raw, more = await read_up_to(resp, MAX_REPLY_BYTES if ok else ERROR_BYTES)
        if more and ok:
            reason = (
                f"{what}: {resp.status} with a body larger than "
                f"{MAX_REPLY_BYTES // (1024 * 1024)} MiB; not read"
            )
            raise (UnsureDelivery if sends else RetryableDelivery)(self.scrub(reason))
        try:
            text = raw.decode(resp.charset or "utf-8", errors="replace")
        except LookupError:  # a charset Python does not know
            text = raw.decode("utf-8", errors="replace")
        return Reply(resp.status, text, resp.headers)

    # -- tokens -----------------------------------------------------------------------------

    async def _bearer(self) -> str | None:
        if self._static_token is not None:
            return self._static_token
        if not self.logs_in:
            return None
        async with self._login_lock:
            if self._token is None:
                self._token = await self._login()
            return self._token

    async def _relogin(self, *, stale: str | None) -> str:
        async with self._login_lock:
            # another request may have refreshed it meanwhile
            if self._token is None or self._token == stale:
                self._token = None
                self._token = await self._login()
            return self._token

    async def _login(self) -> str:
        """A token from ``POST /auth/token`` (the simple auth manager and FAB answer
        201; any 2xx with an ``access_token`` is taken)."""
        body = json.dumps({"username": self._username, "password": self._password}).encode()
        reply = await self._send(
            "POST", TOKEN_PATH, params=None, body=body, token=None, sends=False
        )
        what = f"POST {self._base}{TOKEN_PATH}"
        if reply.ok:
            try:
                token = reply.json()["access_token"]
            except (ValueError, KeyError, TypeError):
                token = None
            if not isinstance(token, str) or not token:
                raise RetryableDelivery(
                    self.scrub(f"{what}: {reply.status} without an access_token")
                )
            # a secret from now on: an answer that quotes it is masked like the password
            remember([token])
            return token
        if reply.status in (400, 401, 403, 422):
            raise CredentialsRefused(self._refused(reply, what))
        if reply.status in (404, 405):
            raise RetryableDelivery(
                self.scrub(
                    f"{what}: {reply.status}: no token endpoint there (is url the API "
                    f"server's base URL? an auth manager without /auth/token needs token:)"
                )
            )
        raise RetryableDelivery(
            self.scrub(f"{what}: {reply.status} {detail_of(reply.text)}{redirect_note(reply)}"),
            retry_after=retry_after_of(reply.headers, cap=self.retry_after_cap),
        )

    def _refused(self, reply: Reply, what: str) -> str:
        who = (
            "the configured token"
            if self._static_token is not None
            else f"user {self._username!r}"
            if self.logs_in
            else "no credentials (set username and password, or token)"
        )
        return self.scrub(
            f"credentials refused by Airflow ({who}): {what}: {reply.status} "
            f"{detail_of(reply.text, 120)}"
        )

    # -- endpoints --------------------------------------------------------------------------

    async def version(self) -> str:
        """``GET /api/v2/version`` (no authentication needed): Airflow's version."""
        reply = await self._send(
            "GET", VERSION_PATH, params=None, body=None, token=None, sends=False
        )
        what = f"GET /{VERSION_PATH}"
        self.expect_ok(reply, what)
        version = self._object(reply, what).get("version", "?")
        return version if isinstance(version, str) else "?"

    async def find_asset(self, ref: AssetRef) -> int | None:
        """The id of the active asset ``ref`` names exactly; None when Airflow has none.

        ``name_pattern`` / ``uri_pattern`` are case-insensitive substring searches (and
        ``|`` means "or"), so every page is searched for the exact name or URI.
        """
        param = "name_pattern" if ref.by == "name" else "uri_pattern"
        offset = 0
        while True:
            reply = await self.request(
                "GET",
                ASSETS_PATH,
                params={param: ref.value, "limit": PAGE_SIZE, "offset": offset, "order_by": "id"},
            )
            what = f"GET /{ASSETS_PATH} for {ref}"
            self.expect_ok(reply, what)
            assets, total = self._page(reply, what, "assets")
            for asset in assets:
                if asset.get(ref.by) == ref.value:
                    asset_id = asset.get("id")
                    if not isinstance(asset_id, int) or isinstance(asset_id, bool):
                        raise self._not_airflows(
                            reply, what, f"the asset's id is a {type(asset_id).__name__}"
                        )
                    return asset_id
            offset += len(assets)
            if not assets or offset >= total:
                return None

    async def post_event(self, body: bytes) -> Reply:
        """``POST /api/v2/assets/events``; the reply whatever its status."""
        return await self.request("POST", EVENTS_PATH, body=body, sends=True)

    async def event_ids_since(self, asset_id: int, since: datetime, wanted: set[str]) -> set[str]:
        """The ids of ``wanted`` among the ``extra.acklane.event_id`` of the asset's
        events from ``since`` on, oldest first, until all are found or none are left.

        Pages by a timestamp cursor (plus an offset within one timestamp), so that
        events added or cleaned meanwhile move no page boundary.
        """
        found: set[str] = set()
        cursor = since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        skip = 0
        while found != wanted:
            reply = await self.request(
                "GET",
                EVENTS_PATH,
                params={
                    "asset_id": asset_id,
                    "timestamp_gte": cursor,
                    "order_by": "timestamp",
                    "limit": PAGE_SIZE,
                    "offset": skip,
                },
            )
            what = f"GET /{EVENTS_PATH} of asset id {asset_id}"
            self.expect_ok(reply, what)
            events, total = self._page(reply, what, "asset_events")
            for event in events:
                extra = event.get("extra")
                ours = extra.get("acklane") if isinstance(extra, dict) else None
                event_id = ours.get("event_id") if isinstance(ours, dict) else None
                if isinstance(event_id, str) and event_id in wanted:
                    found.add(event_id)
            if not events or skip + len(events) >= total:
                break
            last = events[-1].get("timestamp")
            at_last = sum(1 for e in events if e.get("timestamp") == last)
            if last == cursor or not isinstance(last, str):
                skip += len(events)
            else:
                cursor, skip = last, at_last
        return found

    def _object(self, reply: Reply, what: str) -> dict[str, Any]:
        """A 2xx body as the JSON object Airflow sends, or a retryable error saying it
        is not one (an HTML page of a proxy, a truncated answer)."""
        try:
            data = reply.json()
        except ValueError:
            raise self._not_airflows(reply, what, "not JSON") from None
        if not isinstance(data, dict):
            raise self._not_airflows(reply, what, f"JSON {type(data).__name__}, not an object")
        return data

    def _page(self, reply: Reply, what: str, key: str) -> tuple[list[dict[str, Any]], int]:
        """A page of a listing: its rows under ``key`` (objects) and ``total_entries``;
        a retryable error for any other shape."""
        data = self._object(reply, what)
        rows = data.get(key, [])
        total = data.get("total_entries", 0)
        if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
            raise self._not_airflows(reply, what, f"{key} is not a list of objects")
        if not isinstance(total, int) or isinstance(total, bool):
            raise self._not_airflows(reply, what, f"total_entries is a {type(total).__name__}")
        return rows, total

    def _not_airflows(self, reply: Reply, what: str, problem: str) -> RetryableDelivery:
        return RetryableDelivery(
            self.scrub(
                f"{what}: {reply.status} but the answer is not Airflow's ({problem}; is url "
                f"the API server's base URL?): {detail_of(reply.text, 120)}"
            )
        )

    def expect_ok(self, reply: Reply, what: str) -> None:
        """Raise the retryable outcome of a failed read (any non-2xx)."""
        if reply.ok:
            return
        hint = " (is url the API server's base URL?)" if reply.status in (404, 405) else ""
        if reply.status == 403:
            hint = " (the user lacks permission to read assets)"
        if reply.status == 500 and EVENTS_PATH in what:
            hint = (
                " (Airflow 3.3 answers 500 here while a DAG run created by one of the"
                " asset's events has not started yet: apache/airflow#71360; retried)"
            )
        hint += redirect_note(reply)
        raise RetryableDelivery(
            self.scrub(f"{what}: {reply.status} {detail_of(reply.text)}{hint}"),
            retry_after=retry_after_of(reply.headers, cap=self.retry_after_cap),
        )


def _auth_failed(reply: Reply) -> bool:
    """Airflow 3 answers 401 for a missing or expired token and 403 "Invalid JWT token"
    for one it cannot verify (revoked, signed with another secret); a 403 about
    permissions ("Forbidden") is not an authentication failure."""
    if reply.status == 401:
        return True
    return reply.status == 403 and "token" in detail_of(reply.text).lower()
