"""The sinks' HTTP boundary against hostile answers: redirects to another host, huge
bodies, a credential echoed back, absurd ``Retry-After`` values, malformed signatures.

Every server here is a real one (``aiohttp.web`` on 127.0.0.1). The Airflow sink talks
to a small server that answers ``/auth/token`` and ``/api/v2/assets...`` as Airflow
3.x's API does: what is tested is the client side of the boundary (what the sink
sends where, how much of an answer it reads, what it reports), which depends only on
the bytes of the answers, not on what produced them; a real Airflow would not answer
a redirect, a 200 MB body or its token in an error on demand. A second server plays
the "other host" a redirect points to and records whether anything reached it.
"""

from __future__ import annotations

import importlib.util
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from acklane.core.observe import redact
from acklane.core.sinks import Delivery, RefusedDelivery, RetryableDelivery, SinkContext
from acklane.core.sinks._policy import judge  # the retry verdict alone, without waiting it
from acklane.core.sinks.airflow import AirflowSink, AirflowSinkSettings
from acklane.core.sinks.webhook import (
    SignatureError,
    WebhookSink,
    WebhookSinkSettings,
    sign,
    verify_signature,
)

pytestmark = pytest.mark.usefixtures("forget_secrets")

PASSWORD = "PLANTED-airflow-password"
#: The token the fake Airflow hands out: no "token" in it, so that a 403 quoting it
#: reads as a permission refusal, not as an invalid token.
TOKEN = "eyJPLANTED.runtime-jwt.c2lnbmF0dXJl"
SECRET = "whsec-PLANTED-0123456789abcdef"
STORED_AT = datetime(2026, 3, 1, 12, 30, 5, tzinfo=UTC)
#: Bytes a hostile server offers: far more than any cap, sent only as fast as read.
HUGE = 200 * 1024 * 1024
CHUNK = 64 * 1024
#: What a capped reader may have let the server push (the cap, plus socket buffers).
BOUNDED = 40 * 1024 * 1024

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Server:
    """A real HTTP server: routes answered by handlers, every request recorded."""

    routes: dict[tuple[str, str], Handler] = field(default_factory=dict)
    seen: list[tuple[str, str, bytes]] = field(default_factory=list)
    url: str = ""
    #: Body bytes the last streaming answer got out before the client stopped reading.
    sent: int = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append((request.method, request.path, body))
        handler = self.routes.get((request.method, request.path))
        if handler is None:
            return web.Response(status=200, text="ok")
        return await handler(request)

    async def stream(self, request: web.Request, status: int) -> web.StreamResponse:
        """Answer ``status`` with a body of :data:`HUGE` bytes, counting what went out."""
        response = web.StreamResponse(status=status)
        response.content_length = HUGE
        await response.prepare(request)
        chunk = b"x" * CHUNK
        self.sent = 0
        try:
            while self.sent < HUGE:
                await response.write(chunk)
                self.sent += CHUNK
        except (ConnectionError, RuntimeError):
            pass  # the client hung up: the point
        return response


@asynccontextmanager
async def serve() -> AsyncIterator[Server]:
    server = Server()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app, shutdown_timeout=1)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock)
    await site.start()
    server.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        yield server
    finally:
        await runner.cleanup()


@pytest.fixture
async def other_host() -> AsyncIterator[Server]:
    """Where a redirect points: nothing may reach it."""
    async with serve() as server:
        yield server


@pytest.fixture
async def airflow() -> AsyncIterator[Server]:
    """Airflow 3.x's API as far as the sink uses it: a login, one asset, its events."""
    async with serve() as server:

        async def token(request: web.Request) -> web.StreamResponse:
            return web.json_response({"access_token": TOKEN}, status=201)

        async def assets(request: web.Request) -> web.StreamResponse:
            found = [{"id": 7, "name": "orders", "uri": "orders"}]
            return web.json_response({"assets": found, "total_entries": 1})

        async def events(request: web.Request) -> web.StreamResponse:
            return web.json_response({"asset_events": [], "total_entries": 0})

        async def posted(request: web.Request) -> web.StreamResponse:
            return web.json_response({"id": 1, "asset_id": 7}, status=200)

        server.routes.update(
            {
                ("POST", "/auth/token"): token,
                ("GET", "/api/v2/assets"): assets,
                ("GET", "/api/v2/assets/events"): events,
                ("POST", "/api/v2/assets/events"): posted,
            }
        )
        yield server


def redirect(to: str, status: int) -> Handler:
    async def respond(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, headers={"Location": to + request.path})

    return respond


def delivery(*, attempt: int = 1) -> Delivery:
    return Delivery(
        event_id="ev_hostile_1",
        store_id=1,
        watcher="orders",
        stream="orders",
        message_id="m-1",
        position=1,
        payload={"order": 1},
        created_at=STORED_AT,
        attempt=attempt,
    )


def airflow_sink(url: str, **fields: Any) -> AirflowSink:
    settings = AirflowSinkSettings.model_validate(
        {
            "name": "af",
            "kind": "airflow",
            "url": url,
            "username": "acklane",
            "password": PASSWORD,
            "asset": "orders",
            "timeout": 5,
            **fields,
        }
    )
    return AirflowSink(settings, SinkContext(watcher_assets={"orders": "orders"}))


def webhook_sink(url: str, **fields: Any) -> WebhookSink:
    settings = WebhookSinkSettings.model_validate(
        {"name": "hook", "kind": "webhook", "url": url, "timeout": 5, **fields}
    )
    return WebhookSink(settings)


async def deliver_airflow(sink: AirflowSink) -> BaseException | None:
    async with sink:
        try:
            await sink.deliver_one(delivery())
        except Exception as exc:
            return exc
    return None


# -- redirects --------------------------------------------------------------------------


async def test_airflow_login_redirected_elsewhere_sends_no_password_there(
    airflow: Server, other_host: Server
) -> None:
    airflow.routes[("POST", "/auth/token")] = redirect(other_host.url, 307)
    outcome = await deliver_airflow(airflow_sink(airflow.url))
    assert isinstance(outcome, RetryableDelivery)
    assert "redirect" in outcome.reason and "not followed" in outcome.reason
    assert PASSWORD not in outcome.reason
    assert other_host.seen == []


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_airflow_event_redirected_elsewhere_is_not_delivered(
    airflow: Server, other_host: Server, status: int
) -> None:
    airflow.routes[("POST", "/api/v2/assets/events")] = redirect(other_host.url, status)
    outcome = await deliver_airflow(airflow_sink(airflow.url))
    assert isinstance(outcome, RetryableDelivery)  # held as the sink's 4xx rules say
    assert f"{status}" in outcome.reason and "redirects are not followed" in outcome.reason
    assert other_host.url.replace("http://", "") in outcome.reason  # where it pointed
    assert other_host.seen == []


async def test_airflow_asset_lookup_redirected_elsewhere_is_not_followed(
    airflow: Server, other_host: Server
) -> None:
    airflow.routes[("GET", "/api/v2/assets")] = redirect(other_host.url, 302)
    outcome = await deliver_airflow(airflow_sink(airflow.url))
    assert isinstance(outcome, RetryableDelivery) and "not followed" in outcome.reason
    assert other_host.seen == []


async def test_webhook_redirected_elsewhere_is_parked_and_not_followed(
    other_host: Server,
) -> None:
    """The webhook sink refused redirects already: the rule the Airflow sink now shares."""
    async with serve() as receiver:
        receiver.routes[("POST", "/hook")] = redirect(other_host.url, 307)
        async with webhook_sink(receiver.url + "/hook") as sink:
            (result,) = await sink.deliver([delivery()])
    assert isinstance(result, RefusedDelivery) and "not followed" in result.reason
    assert other_host.seen == []


# -- bodies -----------------------------------------------------------------------------


@pytest.mark.parametrize("status", [500, 400])
async def test_airflow_huge_error_body_is_read_only_in_part(airflow: Server, status: int) -> None:
    async def huge(request: web.Request) -> web.StreamResponse:
        return await airflow.stream(request, status)

    airflow.routes[("POST", "/api/v2/assets/events")] = huge
    outcome = await deliver_airflow(airflow_sink(airflow.url))
    assert isinstance(outcome, RefusedDelivery if status == 400 else RetryableDelivery)
    assert f"{status} xxx" in outcome.reason
    assert airflow.sent < BOUNDED


async def test_airflow_huge_ok_body_is_an_error_not_read_whole(airflow: Server) -> None:
    async def huge(request: web.Request) -> web.StreamResponse:
        return await airflow.stream(request, 200)

    airflow.routes[("GET", "/api/v2/assets")] = huge
    outcome = await deliver_airflow(airflow_sink(airflow.url))
    assert isinstance(outcome, RetryableDelivery)
    assert "larger than" in outcome.reason
    assert airflow.sent < BOUNDED


async def test_webhook_huge_ok_body_is_not_read_to_its_end() -> None:
    async with serve() as receiver:

        async def huge(request: web.Request) -> web.StreamResponse:
            return await receiver.stream(request, 200)

        receiver.routes[("POST", "/hook")] = huge
        async with webhook_sink(receiver.url + "/hook") as sink:
            assert await sink.deliver([delivery()]) == [None]
        assert receiver.sent < BOUNDED


async def test_webhook_huge_error_body_is_read_only_in_part() -> None:
    async with serve() as receiver:

        async def huge(request: web.Request) -> web.StreamResponse:
            return await receiver.stream(request, 500)

        receiver.routes[("POST", "/hook")] = huge
        async with webhook_sink(receiver.url + "/hook") as sink:
            (result,) = await sink.deliver([delivery()])
        assert isinstance(result, RetryableDelivery) and "HTTP 500" in result.reason
        assert receiver.sent < BOUNDED


NOT_AIRFLOWS = [
    "<html>maintenance</html>",
    "[]",
    '{"assets": 5, "asset_events": 5, "total_entries": 1}',
    '{"assets": [1], "asset_events": [1], "total_entries": 1}',
    '{"assets": [{"id": "x", "name": "orders"}], "asset_events": [], "total_entries": 1}',
    '{"assets": [], "asset_events": [], "total_entries": "many"}',
]


@pytest.mark.parametrize("body", NOT_AIRFLOWS)
async def test_airflow_asset_lookup_answer_of_another_shape_is_a_clear_retry(
    airflow: Server, body: str
) -> None:
    async def odd(request: web.Request) -> web.StreamResponse:
        return web.Response(status=200, text=body, content_type="application/json")

    airflow.routes[("GET", "/api/v2/assets")] = odd
    outcome = await deliver_airflow(airflow_sink(airflow.url))
    assert isinstance(outcome, RetryableDelivery), outcome
    assert "GET /api/v2/assets" in outcome.reason and "not Airflow's" in outcome.reason


@pytest.mark.parametrize("body", [b for b in NOT_AIRFLOWS if '"id": "x"' not in b])
async def test_airflow_events_lookup_answer_of_another_shape_is_a_clear_retry(
    airflow: Server, body: str
) -> None:
    async def odd(request: web.Request) -> web.StreamResponse:
        return web.Response(status=200, text=body, content_type="application/json")

    airflow.routes[("GET", "/api/v2/assets/events")] = odd
    sink = airflow_sink(airflow.url)
    async with sink:
        with pytest.raises(RetryableDelivery, match="not Airflow's"):
            await sink.delivered_already([delivery(attempt=2)])


# -- the token obtained at run time -----------------------------------------------------


async def test_airflow_token_echoed_in_a_refusal_is_masked(
    airflow: Server, caplog: pytest.LogCaptureFixture
) -> None:
    async def forbidden(request: web.Request) -> web.StreamResponse:
        echoed = request.headers.get("Authorization", "")
        return web.json_response({"detail": f"Forbidden for {echoed}"}, status=403)

    airflow.routes[("POST", "/api/v2/assets/events")] = forbidden
    outcome = await deliver_airflow(airflow_sink(airflow.url))
    assert isinstance(outcome, RetryableDelivery) and "403" in outcome.reason
    assert TOKEN not in outcome.reason and "***" in outcome.reason
    assert TOKEN not in redact.redact(f"later output quoting {TOKEN}")
    assert TOKEN not in caplog.text


# -- Retry-After ------------------------------------------------------------------------

ABSURD = [
    "9" * 400,  # float() makes it inf
    "99999999999",  # the year 5195
    "Fri, 31 Dec 9999 23:59:59 GMT",
]


def _verdict_after(result: object, backoff_max: float) -> timedelta:
    settings = WebhookSinkSettings.model_validate(
        {"name": "hook", "kind": "webhook", "url": "http://x", "backoff_max": backoff_max}
    )
    now = datetime.now(UTC)
    assert isinstance(result, RetryableDelivery)
    verdict = judge(result, attempts=1, stored_at=now, now=now, settings=settings)
    assert verdict.outcome == "retry" and verdict.next_attempt_at is not None
    return verdict.next_attempt_at - now


@pytest.mark.parametrize("value", ABSURD)
async def test_webhook_absurd_retry_after_is_capped_at_backoff_max(value: str) -> None:
    async with serve() as receiver:

        async def throttled(request: web.Request) -> web.StreamResponse:
            return web.Response(status=429, headers={"Retry-After": value})

        receiver.routes[("POST", "/hook")] = throttled
        async with webhook_sink(receiver.url + "/hook", backoff_max=60) as sink:
            (result,) = await sink.deliver([delivery()])
    assert isinstance(result, RetryableDelivery) and result.retry_after == 60.0
    assert _verdict_after(result, 60) <= timedelta(seconds=60)


@pytest.mark.parametrize("value", ABSURD)
async def test_airflow_absurd_retry_after_is_capped_at_backoff_max(
    airflow: Server, value: str
) -> None:
    async def throttled(request: web.Request) -> web.StreamResponse:
        return web.Response(status=429, headers={"Retry-After": value})

    airflow.routes[("POST", "/api/v2/assets/events")] = throttled
    outcome = await deliver_airflow(airflow_sink(airflow.url, backoff_max=60))
    assert isinstance(outcome, RetryableDelivery) and outcome.retry_after == 60.0
    assert _verdict_after(outcome, 60) <= timedelta(seconds=60)


@pytest.mark.parametrize("asked", [float("inf"), 1e300, float("nan")])
def test_a_function_sinks_absurd_retry_after_is_capped_at_backoff_max(asked: float) -> None:
    """A function sink's ``RetryableDelivery(retry_after=...)`` is untrusted too: inf
    made an OverflowError in every verdict, so the event was never parked."""
    result = RetryableDelivery("busy", retry_after=asked)
    assert _verdict_after(result, 60) <= timedelta(seconds=60)


@pytest.mark.parametrize("value", ["\u0663", "1\u00b2", "\uff15"])
async def test_retry_after_in_other_scripts_digits_is_ignored(value: str) -> None:
    from acklane.core.sinks.webhook import parse_retry_after

    assert parse_retry_after(value, cap=60) is None


# -- signatures -------------------------------------------------------------------------

MALFORMED_T = [
    "9" * 400,  # OverflowError against the clock
    "9" * 5000,  # past int()'s digit limit: ValueError
    "\u0663",  # an Arabic-Indic 3: isdigit() says yes
    "\u00b2",  # a superscript 2: isdigit() says yes, int() says no
    "1e9",
    "-5",
    "",
    " 1",
]


@pytest.mark.parametrize("t", MALFORMED_T)
def test_a_malformed_timestamp_is_a_signature_error(t: str) -> None:
    body = b"{}"
    v1 = sign(body, SECRET).rpartition("v1=")[2]
    with pytest.raises(SignatureError, match="malformed"):
        verify_signature(body, f"t={t},v1={v1}", SECRET)


def _documented_check() -> Callable[..., Any]:
    """docs/sinks/webhook.md's standard-library check, as a reader would copy it."""
    doc = Path(__file__).parents[2] / "docs" / "sinks" / "webhook.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), re.DOTALL)
    (source,) = [b for b in blocks if "def signed_by_acklane(" in b]
    namespace: dict[str, Any] = {}
    exec(compile(source, str(doc), "exec"), namespace)
    check: Callable[..., Any] = namespace["signed_by_acklane"]
    return check


@pytest.mark.parametrize("t", MALFORMED_T)
def test_the_documented_check_says_no_to_a_malformed_timestamp(t: str) -> None:
    body = b"{}"
    v1 = sign(body, SECRET).rpartition("v1=")[2]
    assert _documented_check()(body, f"t={t},v1={v1}", SECRET) is False


def test_the_documented_check_says_no_to_a_non_ascii_signature() -> None:
    header = sign(b"{}", SECRET) + ",v1=\u00e9\u00e9"
    assert _documented_check()(b"{} ", header, SECRET) is False


def _example_receiver() -> web.Application:
    path = Path(__file__).parents[2] / "examples" / "sinks" / "webhook_receiver.py"
    spec = importlib.util.spec_from_file_location("webhook_receiver_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app: web.Application = module.make_app()
    return app


@pytest.mark.parametrize("t", ["9" * 400, "9" * 5000, "\u00b2"])
async def test_the_example_receiver_answers_401_to_a_malformed_timestamp(t: str) -> None:
    runner = web.AppRunner(_example_receiver(), shutdown_timeout=1)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock)
    await site.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/orders"
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                url,
                data=b"{}",
                headers={"Acklane-Signature": f"t={t},v1=00", "Idempotency-Key": "k"},
            ) as response,
        ):
            assert response.status == 401
            assert "malformed" in await response.text()
    finally:
        await runner.cleanup()
