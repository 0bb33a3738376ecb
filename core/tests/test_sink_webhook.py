"""The webhook sink against a real HTTP server (``aiohttp.web`` on 127.0.0.1).

The receiver records every request (method, path, headers, raw body) and answers
from a script (a status, headers, a body; or a stall past the sink's timeout). Each
test drives the sink's methods directly, as the dispatcher does, and checks what
the receiver got and the outcome the sink reported: delivered, retryable (with its
``retry_after``) or refused. TLS is a real handshake against a certificate from a
throwaway CA (trustme).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import re
import socket
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiohttp import web
from multidict import CIMultiDictProxy
from pydantic import SecretStr, ValidationError

from acklane.core.observe import redact
from acklane.core.sinks import (
    Delivery,
    RefusedDelivery,
    RetryableDelivery,
    SinkError,
    event_id_for,
    sink_class,
)
from acklane.core.sinks.webhook import (
    IDEMPOTENCY_HEADER,
    SIGNATURE_HEADER,
    USER_AGENT,
    SignatureError,
    WebhookSink,
    WebhookSinkSettings,
    batch_idempotency_key,
    is_secret_header,
    parse_retry_after,
    sign,
    verify_signature,
)

pytestmark = pytest.mark.usefixtures("forget_secrets")

SECRET = "whsec-PLANTED-0123456789abcdef"
TOKEN = "PLANTEDbearer-token-42"
STORED_AT = datetime(2026, 3, 1, 12, 30, 5, 250000, tzinfo=UTC)

# -- the receiver -----------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Seen:
    """One request as the receiver got it."""

    method: str
    path: str
    headers: CIMultiDictProxy[str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    """A real HTTP server that records requests and answers from a script (200 when
    the script is empty)."""

    def __init__(self) -> None:
        self.requests: list[Seen] = []
        self.script: deque[Handler] = deque()
        #: Set at teardown: a stalled handler returns then.
        self.released = asyncio.Event()
        self.url = ""

    def answer(self, status: int, body: bytes | str = b"", **headers: str) -> None:
        async def respond(request: web.Request) -> web.StreamResponse:
            data = body.encode() if isinstance(body, str) else body
            return web.Response(status=status, body=data, headers=headers)

        self.script.append(respond)

    def echo_headers(self, status: int) -> None:
        """Answer ``status`` with the request's headers in the body (a leaky receiver)."""

        async def respond(request: web.Request) -> web.StreamResponse:
            return web.json_response(dict(request.headers), status=status)

        self.script.append(respond)

    def stall(self) -> None:
        """Answer nothing until teardown."""

        async def respond(request: web.Request) -> web.StreamResponse:
            await self.released.wait()
            return web.Response(status=200)

        self.script.append(respond)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(Seen(request.method, request.path, request.headers, body))
        if self.script:
            return await self.script.popleft()(request)
        return web.Response(status=200, text="ok")

    @property
    def posts(self) -> list[Seen]:
        return [r for r in self.requests if r.method == "POST"]


@asynccontextmanager
async def serve(ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[Receiver]:
    receiver = Receiver()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", receiver.handle)
    runner = web.AppRunner(app, shutdown_timeout=1)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    site = web.SockSite(runner, sock, ssl_context=ssl_context)
    await site.start()
    scheme = "https" if ssl_context is not None else "http"
    receiver.url = f"{scheme}://127.0.0.1:{port}/hook"
    try:
        yield receiver
    finally:
        receiver.released.set()
        await runner.cleanup()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with serve() as running:
        yield running


@pytest.fixture
def dead_url() -> str:
    """A URL on a port nothing listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


# -- helpers ----------------------------------------------------------------------------


def delivery(n: int = 1, payload: Any = None, *, attempt: int = 1) -> Delivery:
    message_id = f"m-{n}"
    return Delivery(
        event_id=event_id_for(
            watcher="orders",
            stream="orders",
            message_id=message_id,
            position=n,
            store_id=n,
            created_at=STORED_AT,
        ),
        store_id=n,
        watcher="orders",
        stream="orders",
        message_id=message_id,
        position=n,
        payload={"order": n, "amount": 12.5} if payload is None else payload,
        created_at=STORED_AT,
        attempt=attempt,
    )


def settings(url: str, **fields: Any) -> WebhookSinkSettings:
    return WebhookSinkSettings.model_validate(
        {"name": "orders-hook", "kind": "webhook", "url": url, **fields}
    )


@asynccontextmanager
async def opened(url: str, **fields: Any) -> AsyncIterator[WebhookSink]:
    async with WebhookSink(settings(url, **fields)) as sink:
        yield sink


# -- one event --------------------------------------------------------------------------


async def test_the_registry_finds_the_webhook_kind() -> None:
    assert sink_class("webhook") is WebhookSink
    assert WebhookSink.settings_model is WebhookSinkSettings


async def test_one_event_is_posted_as_its_json_document(receiver: Receiver) -> None:
    event = delivery(7, {"order": 7, "items": ["a", "é"]})
    async with opened(receiver.url) as sink:
        assert await sink.deliver([event]) == [None]
    (seen,) = receiver.requests
    assert (seen.method, seen.path) == ("POST", "/hook")
    assert seen.json() == {
        "event_id": event.event_id,
        "watcher": "orders",
        "stream": "orders",
        "message_id": "m-7",
        "position": 7,
        "stored_at": "2026-03-01T12:30:05.250000+00:00",
        "payload": {"order": 7, "items": ["a", "é"]},
    }
    assert b" " not in seen.body  # compact


async def test_one_event_carries_its_headers(receiver: Receiver) -> None:
    event = delivery(3)
    async with opened(receiver.url, headers={"X-Team": "data-platform"}) as sink:
        await sink.deliver([event])
    headers = receiver.requests[0].headers
    assert headers["Content-Type"] == "application/json"
    assert headers["User-Agent"] == USER_AGENT
    assert USER_AGENT.startswith("acklane/")
    assert headers[IDEMPOTENCY_HEADER] == event.event_id
    assert headers["X-Team"] == "data-platform"
    assert SIGNATURE_HEADER not in headers  # no secret, no signature


async def test_a_configured_authorization_header_is_sent(receiver: Receiver) -> None:
    async with opened(receiver.url, headers={"Authorization": f"Bearer {TOKEN}"}) as sink:
        await sink.deliver([delivery()])
    assert receiver.requests[0].headers["Authorization"] == f"Bearer {TOKEN}"


async def test_a_url_password_is_sent_as_basic_authentication(receiver: Receiver) -> None:
    url = receiver.url.replace("http://", "http://acklane:PLANTEDurlpass@")
    async with opened(url) as sink:
        assert await sink.deliver([delivery()]) == [None]
        assert "PLANTEDurlpass" not in sink.destination
    assert receiver.requests[0].headers["Authorization"].startswith("Basic ")


# -- the signature ----------------------------------------------------------------------


async def test_the_signature_verifies_with_the_secret(receiver: Receiver) -> None:
    async with opened(receiver.url, secret=SECRET) as sink:
        await sink.deliver([delivery()])
    seen = receiver.requests[0]
    header = seen.headers[SIGNATURE_HEADER]
    verify_signature(seen.body, header, SECRET)  # raises if it does not verify
    timestamp = int(header.split(",")[0].removeprefix("t="))
    assert abs(timestamp - time.time()) < 60


async def test_a_tampered_body_fails_verification(receiver: Receiver) -> None:
    async with opened(receiver.url, secret=SECRET) as sink:
        await sink.deliver([delivery()])
    seen = receiver.requests[0]
    tampered = seen.body.replace(b'"amount":12.5', b'"amount":99.5')
    assert tampered != seen.body
    with pytest.raises(SignatureError, match="does not match"):
        verify_signature(tampered, seen.headers[SIGNATURE_HEADER], SECRET)


async def test_a_wrong_secret_fails_verification(receiver: Receiver) -> None:
    async with opened(receiver.url, secret=SECRET) as sink:
        await sink.deliver([delivery()])
    seen = receiver.requests[0]
    with pytest.raises(SignatureError, match="wrong secret"):
        verify_signature(seen.body, seen.headers[SIGNATURE_HEADER], "another-secret-0123456")


def test_an_old_timestamp_fails_verification() -> None:
    body = b'{"event_id":"ev_1"}'
    header = sign(body, SECRET, timestamp=1_700_000_000)
    verify_signature(body, header, SECRET, now=1_700_000_000 + 299)
    with pytest.raises(SignatureError, match="301 s old"):
        verify_signature(body, header, SECRET, now=1_700_000_000 + 301)


def test_a_timestamp_far_in_the_future_fails_verification() -> None:
    body = b"{}"
    header = sign(body, SECRET, timestamp=1_700_000_600)
    with pytest.raises(SignatureError, match="in the future"):
        verify_signature(body, header, SECRET, now=1_700_000_000)


@pytest.mark.parametrize(
    ("header", "words"),
    [
        (None, "no Acklane-Signature header"),
        ("", "no Acklane-Signature header"),
        ("v1=abc", "expected one t="),
        ("t=soon,v1=abc", "expected one t="),
        ("t=1,t=2,v1=abc", "expected one t="),
        ("t=1700000000", "no v1="),
        ("t=1700000000,v1", "is not key=value"),
    ],
)
def test_a_missing_or_malformed_header_fails_verification(header: str | None, words: str) -> None:
    with pytest.raises(SignatureError, match=words):
        verify_signature(b"{}", header, SECRET, now=1_700_000_000)


def test_any_matching_v1_verifies_during_a_key_rotation() -> None:
    body = b'{"a":1}'
    old = sign(body, "the-old-secret-0123456", timestamp=1_700_000_000)
    new = sign(body, SECRET, timestamp=1_700_000_000)
    header = f"{old},v1={new.rpartition('v1=')[2]}"
    verify_signature(body, header, SECRET, now=1_700_000_000)
    verify_signature(body, header, "the-old-secret-0123456", now=1_700_000_000)


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    import hashlib
    import hmac

    body = b'{"event_id":"ev_1"}'
    expected = hmac.new(SECRET.encode(), b"1700000000." + body, hashlib.sha256).hexdigest()
    assert sign(body, SECRET, timestamp=1_700_000_000) == f"t=1700000000,v1={expected}"


# -- batches ----------------------------------------------------------------------------


async def test_a_batch_is_one_request_with_an_events_array(receiver: Receiver) -> None:
    events = [delivery(n) for n in range(1, 6)]
    async with opened(receiver.url, batch_size=5, secret=SECRET) as sink:
        assert sink.max_batch == 5
        assert await sink.deliver(events) == [None] * 5
    (seen,) = receiver.requests
    documents = seen.json()["events"]
    assert [d["event_id"] for d in documents] == [e.event_id for e in events]
    assert documents[2] == {**events[2].acklane_fields(), "payload": events[2].payload}
    key = seen.headers[IDEMPOTENCY_HEADER]
    assert key.startswith("batch_") and key not in {e.event_id for e in events}
    verify_signature(seen.body, seen.headers[SIGNATURE_HEADER], SECRET)


async def test_a_batch_keeps_its_body_and_idempotency_key_across_attempts(
    receiver: Receiver,
) -> None:
    receiver.answer(500)
    events = [delivery(n) for n in range(1, 4)]
    retried = [delivery(n, attempt=2) for n in range(1, 4)]
    async with opened(receiver.url, batch_size=10) as sink:
        first = await sink.deliver(events)
        second = await sink.deliver(retried)
    assert all(isinstance(r, RetryableDelivery) for r in first)
    assert second == [None, None, None]
    one, two = receiver.requests
    assert one.body == two.body
    assert one.headers[IDEMPOTENCY_HEADER] == two.headers[IDEMPOTENCY_HEADER]


async def test_a_batch_of_one_keeps_the_batch_shape(receiver: Receiver) -> None:
    event = delivery(9)
    async with opened(receiver.url, batch_size=100) as sink:
        assert await sink.deliver([event]) == [None]
    seen = receiver.requests[0]
    assert seen.json() == {"events": [{**event.acklane_fields(), "payload": event.payload}]}
    assert seen.headers[IDEMPOTENCY_HEADER] == batch_idempotency_key([event.event_id])


@pytest.mark.parametrize("batch_size", [1, 3])
async def test_more_events_than_batch_size_are_a_caller_error(
    receiver: Receiver, batch_size: int
) -> None:
    async with opened(receiver.url, batch_size=batch_size) as sink:
        with pytest.raises(ValueError, match=f"at most {batch_size} events per request"):
            await sink.deliver([delivery(n) for n in range(batch_size + 1)])
    assert receiver.requests == []


async def test_another_batch_has_another_idempotency_key(receiver: Receiver) -> None:
    async with opened(receiver.url, batch_size=10) as sink:
        await sink.deliver([delivery(1), delivery(2)])
        await sink.deliver([delivery(2), delivery(3)])
    one, two = receiver.requests
    assert one.headers[IDEMPOTENCY_HEADER] != two.headers[IDEMPOTENCY_HEADER]


async def test_a_refusal_is_every_event_of_the_batch(receiver: Receiver) -> None:
    receiver.answer(422, "event 2 is invalid")
    async with opened(receiver.url, batch_size=3) as sink:
        results = await sink.deliver([delivery(1), delivery(2), delivery(3)])
    assert len(results) == 3
    assert all(isinstance(r, RefusedDelivery) and "422" in r.reason for r in results)


# -- outcomes ---------------------------------------------------------------------------


async def test_a_500_is_retryable_and_the_next_attempt_is_delivered(receiver: Receiver) -> None:
    receiver.answer(500, "database is down")
    async with opened(receiver.url) as sink:
        (first,) = await sink.deliver([delivery()])
        (second,) = await sink.deliver([delivery(attempt=2)])
    assert isinstance(first, RetryableDelivery)
    assert first.reason == "HTTP 500 Internal Server Error: database is down"
    assert first.retry_after is None
    assert second is None
    assert len(receiver.posts) == 2


@pytest.mark.parametrize("status", [408, 502, 504])
async def test_a_timeout_or_gateway_status_is_retryable(receiver: Receiver, status: int) -> None:
    receiver.answer(status)
    async with opened(receiver.url) as sink:
        (result,) = await sink.deliver([delivery()])
    assert isinstance(result, RetryableDelivery)
    assert result.reason.startswith(f"HTTP {status}")


async def test_a_429_retry_after_in_seconds_is_passed_on(receiver: Receiver) -> None:
    receiver.answer(429, "slow down", **{"Retry-After": "2"})
    async with opened(receiver.url) as sink:
        (result,) = await sink.deliver([delivery()])
    assert isinstance(result, RetryableDelivery)
    assert result.retry_after == 2.0
    assert "429 Too Many Requests" in result.reason


async def test_a_503_retry_after_as_an_http_date_is_passed_on(receiver: Receiver) -> None:
    when = email.utils.formatdate(time.time() + 120, usegmt=True)
    receiver.answer(503, **{"Retry-After": when})
    async with opened(receiver.url) as sink:
        (result,) = await sink.deliver([delivery()])
    assert isinstance(result, RetryableDelivery)
    assert result.retry_after is not None
    assert 110 <= result.retry_after <= 121


async def test_retry_after_is_ignored_on_a_500(receiver: Receiver) -> None:
    receiver.answer(500, **{"Retry-After": "30"})
    async with opened(receiver.url) as sink:
        (result,) = await sink.deliver([delivery()])
    assert isinstance(result, RetryableDelivery)
    assert result.retry_after is None


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("2", 2.0),
        (" 120 ", 120.0),
        ("1.5", 1.5),
        ("Sun, 06 Nov 1994 08:49:37 GMT", 0.0),  # passed
        ("Thu, 01 Jan 2037 00:00:30 GMT", 30.0),
        ("soon", None),
        ("-5", None),
        (None, None),
    ],
)
def test_retry_after_values(value: str | None, seconds: float | None) -> None:
    now = datetime(2037, 1, 1, tzinfo=UTC).timestamp()
    assert parse_retry_after(value, cap=300, now=now) == seconds


async def test_a_400_is_refused_with_its_status_and_body_excerpt(receiver: Receiver) -> None:
    receiver.answer(400, '{"error": "unknown field \\"amount\\""}\n')
    async with opened(receiver.url) as sink:
        (result,) = await sink.deliver([delivery()])
    assert isinstance(result, RefusedDelivery)
    assert result.reason == 'HTTP 400 Bad Request: {"error": "unknown field \\"amount\\""}'


async def test_a_long_body_is_cut_to_an_excerpt(receiver: Receiver) -> None:
    receiver.answer(404, "é" * 1000 + "\x00\r\nend")
    async with opened(receiver.url) as sink:
        (result,) = await sink.deliver([delivery()])
    assert isinstance(result, RefusedDelivery)
    head, _, excerpt = result.reason.partition(": ")
    assert head == "HTTP 404 Not Found"
    # 200 bytes are 100 two-byte characters; none cut in half, none undecodable
    assert excerpt == "é" * 100 + "..."


async def test_an_undecodable_body_is_replaced_not_raised(receiver: Receiver) -> None:
    receiver.answer(403, b"\xff\xfe denied \x1b[31m")
    async with opened(receiver.url) as sink:
        (result,) = await sink.deliver([delivery()])
    assert isinstance(result, RefusedDelivery)
    assert result.reason == "HTTP 403 Forbidden: \ufffd\ufffd denied [31m"


async def test_a_redirect_is_refused_not_followed(receiver: Receiver) -> None:
    receiver.answer(301, Location=receiver.url.replace("/hook", "/elsewhere"))
    async with opened(receiver.url) as sink:
        (result,) = await sink.deliver([delivery()])
    assert isinstance(result, RefusedDelivery)
    assert "HTTP 301" in result.reason and "redirects are not followed" in result.reason
    assert "/elsewhere" in result.reason
    assert [r.path for r in receiver.requests] == ["/hook"]


async def test_nothing_listening_is_retryable(dead_url: str) -> None:
    async with opened(dead_url) as sink:
        (result,) = await sink.deliver([delivery()])
    assert isinstance(result, RetryableDelivery)
    assert "request failed" in result.reason and "127.0.0.1" in result.reason


async def test_a_receiver_slower_than_the_timeout_is_retryable(receiver: Receiver) -> None:
    receiver.stall()
    async with opened(receiver.url, timeout=0.3) as sink:
        (result,) = await sink.deliver([delivery()])
        receiver.released.set()
    assert isinstance(result, RetryableDelivery)
    assert result.reason == "no complete answer within timeout (0.3s)"


async def test_the_pool_keeps_one_connection_alive(receiver: Receiver) -> None:
    peers: set[Any] = set()

    async def record_peer(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        peers.add(request.transport.get_extra_info("peername"))
        return web.Response(status=204)

    receiver.script.extend([record_peer] * 5)
    async with opened(receiver.url) as sink:
        for n in range(5):
            assert await sink.deliver([delivery(n)]) == [None]
    assert len(peers) == 1


async def test_a_payload_that_is_not_json_is_refused(receiver: Receiver) -> None:
    async with opened(receiver.url) as sink:
        (result,) = await sink.deliver([delivery(payload={"x": float("nan")})])
    assert isinstance(result, RefusedDelivery)
    assert "cannot be sent as JSON" in result.reason
    assert receiver.requests == []


async def test_deliver_before_open_says_so(receiver: Receiver) -> None:
    sink = WebhookSink(settings(receiver.url))
    with pytest.raises(SinkError, match="not open"):
        await sink.deliver([delivery()])


async def test_aclose_is_idempotent(receiver: Receiver) -> None:
    sink = WebhookSink(settings(receiver.url))
    await sink.open()
    await sink.aclose()
    await sink.aclose()


# -- secrets ----------------------------------------------------------------------------


def test_secrets_are_absent_from_the_settings_repr() -> None:
    configured = settings(
        "https://hooks.example.com/in?token=PLANTEDquerytoken",
        secret=SECRET,
        headers={"Authorization": f"Bearer {TOKEN}", "X-Api-Key": "PLANTEDapikey", "X-Team": "dp"},
    )
    for text in (repr(configured), str(configured)):
        assert "PLANTED" not in text.replace("PLANTEDquerytoken", "")
        assert "dp" in text
    assert isinstance(configured.headers["Authorization"], SecretStr)
    assert isinstance(configured.headers["X-Api-Key"], SecretStr)
    assert configured.headers["X-Team"] == "dp"
    shown = json.dumps(redact.redact_structure(configured))
    assert "PLANTED" not in shown


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("Authorization", True),
        ("proxy-authorization", True),
        ("Cookie", True),
        ("X-Api-Key", True),
        ("Ocp-Apim-Subscription-Key", True),
        ("X-Auth-Token", True),
        ("X-Hub-Signature-256", True),
        ("X-Session-Id", True),
        ("X-Client-Secret", True),
        ("X-Team", False),
        ("X-Design-Version", False),
        ("Accept-Language", False),
        ("User-Agent", False),
    ],
)
def test_secret_looking_header_names(name: str, secret: bool) -> None:
    assert is_secret_header(name) is secret


def test_the_loader_finds_the_secret_header_values() -> None:
    configured = settings(
        "https://hooks.example.com/in",
        secret=SECRET,
        headers={"Authorization": f"Bearer {TOKEN}", "Cookie": "session=PLANTEDcookie"},
    )
    found = set(redact.secrets_in(configured))
    assert {SECRET, f"Bearer {TOKEN}", "session=PLANTEDcookie"} <= found


def test_building_the_sink_registers_its_secrets() -> None:
    WebhookSink(
        settings(
            "https://acklane:PLANTEDurlpass@hooks.example.com/in?api_key=PLANTEDquerykey",
            secret=SECRET,
            headers={"X-Api-Key": TOKEN},
        )
    )
    text = f"{SECRET} {TOKEN} PLANTEDurlpass PLANTEDquerykey"
    assert "PLANTED" not in redact.redact_known(text)


async def test_secrets_are_absent_from_reasons(receiver: Receiver) -> None:
    receiver.echo_headers(401)
    receiver.echo_headers(500)
    url = receiver.url + "?token=PLANTEDquerytoken"
    async with opened(url, secret=SECRET, headers={"Authorization": f"Bearer {TOKEN}"}) as sink:
        redact.forget_all()  # the sink's own scrubbing, not the process registry
        (refused,) = await sink.deliver([delivery()])
        (retried,) = await sink.deliver([delivery()])
        assert "PLANTED" not in sink.destination
    assert receiver.posts[0].headers["Authorization"] == f"Bearer {TOKEN}"
    for result in (refused, retried):
        assert isinstance(result, RefusedDelivery | RetryableDelivery)
        assert "Authorization" in result.reason  # the echo got into the excerpt...
        assert "PLANTED" not in result.reason  # ...without the token


async def test_secrets_are_absent_from_connection_errors(dead_url: str) -> None:
    url = dead_url.replace("http://", "http://acklane:PLANTEDurlpass@")
    async with opened(url, headers={"X-Auth-Token": TOKEN}) as sink:
        redact.forget_all()
        (result,) = await sink.deliver([delivery()])
        with pytest.raises(SinkError) as failed:
            await sink.check()
    assert isinstance(result, RetryableDelivery)
    assert "PLANTED" not in result.reason
    assert "PLANTED" not in str(failed.value)


# -- check ------------------------------------------------------------------------------


async def test_check_passes_against_a_live_url_and_delivers_nothing(receiver: Receiver) -> None:
    receiver.answer(405)  # a receiver that takes POST only is still reachable
    async with opened(receiver.url) as sink:
        await sink.check()
    assert [r.method for r in receiver.requests] == ["HEAD"]


async def test_check_works_on_a_sink_not_opened(receiver: Receiver) -> None:
    await WebhookSink(settings(receiver.url)).check()
    assert [r.method for r in receiver.requests] == ["HEAD"]


async def test_check_names_a_dead_url(dead_url: str) -> None:
    async with opened(dead_url) as sink:
        with pytest.raises(SinkError, match=r"webhook sink orders-hook \(http://127\.0\.0\.1"):
            await sink.check()


async def test_check_times_out_against_a_silent_receiver(receiver: Receiver) -> None:
    receiver.stall()
    async with opened(receiver.url, timeout=0.3) as sink:
        with pytest.raises(SinkError, match=r"no complete answer within timeout \(0\.3s\)"):
            await sink.check()


# -- TLS --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server_context() -> ssl.SSLContext:
    """A server context with a certificate for 127.0.0.1 from a CA nobody trusts."""
    authority = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(context)
    return context


async def test_an_untrusted_certificate_fails_check(tls_server_context: ssl.SSLContext) -> None:
    async with serve(tls_server_context) as tls, opened(tls.url) as sink:
        with pytest.raises(SinkError, match=r"TLS failed.*SSL_CERT_FILE.*verify_tls: false"):
            await sink.check()
        (result,) = await sink.deliver([delivery()])
    assert isinstance(result, RetryableDelivery)
    assert tls.requests == []


async def test_verify_tls_false_delivers_to_a_self_signed_receiver(
    tls_server_context: ssl.SSLContext,
) -> None:
    async with serve(tls_server_context) as tls, opened(tls.url, verify_tls=False) as sink:
        await sink.check()
        assert await sink.deliver([delivery()]) == [None]
    assert [r.method for r in tls.requests] == ["HEAD", "POST"]


# -- settings ---------------------------------------------------------------------------


def test_the_defaults() -> None:
    configured = settings("https://hooks.example.com/in")
    assert (configured.timeout, configured.connect_timeout) == (10.0, 5.0)
    assert configured.verify_tls is True
    assert configured.secret is None and configured.headers == {}
    assert (configured.batch_size, configured.ordered, configured.concurrency) == (1, True, 1)


def test_a_number_as_a_header_value_is_sent_as_written() -> None:
    assert settings("http://h/in", headers={"X-Version": 2}).headers == {"X-Version": "2"}


def test_a_bad_header_value_is_one_error_at_its_header() -> None:
    with pytest.raises(ValidationError) as failed:
        settings("http://h/in", headers={"X-Flag": True})
    assert [e["loc"] for e in failed.value.errors()] == [("headers", "X-Flag")]


def test_durations_take_units() -> None:
    configured = settings("http://h/in", timeout="1m", connect_timeout="2.5s")
    assert (configured.timeout, configured.connect_timeout) == (60.0, 2.5)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"url": "ftp://hooks.example.com/in"}, "expected an http:// or https:// URL"),
        ({"url": "hooks.example.com/in"}, "expected an http:// or https:// URL"),
        ({"url": "https:///in"}, "names no host"),
        ({"url": "https://h/in #x"}, "whitespace"),
        ({"url": "https://h/in#x"}, "fragment"),
        ({"secret": "short"}, "at least 16 characters"),
        ({"headers": {"Bad Name": "x"}}, "not a valid header name"),
        ({"headers": {"X-Team": "a\r\nInjected: yes"}}, "control character"),
        ({"headers": {"Idempotency-Key": "x"}}, "set by acklane"),
        ({"headers": {"content-type": "text/plain"}}, "set by acklane"),
        ({"headers": {"X-A": "1", "x-a": "2"}}, "given twice"),
        ({"headers": {"X-Flag": True}}, "expected a string, got true or false"),
        ({"headers": {"X-List": ["a"]}}, "expected a string, got list"),
        ({"timeout": 0}, "greater than 0"),
        ({"timeout": "soon"}, "expected a duration"),
        ({"concurrency": 4}, "needs ordered: false"),
        ({"method": "PUT"}, "Extra inputs are not permitted"),
    ],
)
def test_bad_settings_are_refused_clearly(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        settings(fields.pop("url", "https://hooks.example.com/in"), **fields)


def test_a_url_password_and_an_authorization_header_are_refused_together() -> None:
    with pytest.raises(ValidationError, match="give one"):
        settings("https://u:p@hooks.example.com/in", headers={"Authorization": "Bearer x"})


def test_a_control_character_error_does_not_show_the_value() -> None:
    with pytest.raises(ValidationError) as failed:
        settings("https://h/in", headers={"Authorization": f"Bearer {TOKEN}\n"})
    assert "PLANTED" not in str(failed.value)


# -- the documentation ------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "sinks" / "webhook.md"


def _doc_function(name: str) -> Callable[..., Any]:
    """The function ``name`` of a Python block of docs/sinks/webhook.md."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)
    (source,) = [b for b in blocks if f"def {name}(" in b]
    namespace: dict[str, Any] = {}
    exec(compile(source, str(DOC), "exec"), namespace)
    function: Callable[..., Any] = namespace[name]
    return function


async def test_the_documented_plain_hmac_check_accepts_a_real_request(receiver: Receiver) -> None:
    signed_by_acklane = _doc_function("signed_by_acklane")
    async with opened(receiver.url, secret=SECRET, batch_size=2) as sink:
        await sink.deliver([delivery(1), delivery(2)])
    seen = receiver.requests[0]
    header = seen.headers[SIGNATURE_HEADER]
    assert signed_by_acklane(seen.body, header, SECRET) is True
    assert signed_by_acklane(seen.body + b" ", header, SECRET) is False
    assert signed_by_acklane(seen.body, header, "another-secret-0123456") is False
    old = sign(seen.body, SECRET, timestamp=int(time.time()) - 600)
    assert signed_by_acklane(seen.body, old, SECRET) is False


async def test_the_documented_python_receiver_takes_signed_events_and_refuses_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ORDERS_HOOK_SECRET", SECRET)
    orders_hook = _doc_function("orders_hook")
    app = web.Application()
    app.router.add_post("/hook", orders_hook)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock)
    await site.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/hook"
    try:
        async with opened(url, secret=SECRET, batch_size=3) as sink:
            assert await sink.deliver([delivery(1), delivery(2)]) == [None, None]
            assert await sink.deliver([delivery(3)]) == [None]
        async with opened(url, secret="not-the-receivers-secret") as sink:
            (refused,) = await sink.deliver([delivery(4)])
    finally:
        await runner.cleanup()
    assert isinstance(refused, RefusedDelivery)
    assert refused.reason.startswith("HTTP 401 Unauthorized: the signature does not match")
