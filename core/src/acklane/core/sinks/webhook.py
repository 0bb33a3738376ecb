"""``kind: webhook``: each stored event POSTed as JSON to a URL, signed when a secret is set.

One event per request (``batch_size: 1``, the default) is the event's JSON document,
acklane's own fields beside the payload; with ``batch_size`` > 1 a request carries
``{"events": [<document>, ...]}``. Every request has an ``Idempotency-Key`` that is
the same on every attempt (the event id, or a key derived from a batch's event ids),
and, with ``secret``, an ``Acklane-Signature`` in Stripe's scheme:
``t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>``, which
:func:`verify_signature` checks on the receiving side.

A 2xx answer is a delivery. Connection errors, timeouts, 408, 429 and 5xx are worth
another attempt (``Retry-After`` of a 429 or 503 is passed on, at most
``backoff_max``); any other answer (another 4xx, a 3xx: redirects are not followed)
parks the event with the status and the start of the answer's body, of which no more
than that start is read. See docs/sinks/webhook.md.

The secret and the values of secret-looking headers (``Authorization``, ``Cookie``,
``X-Api-Key``...) are :class:`~pydantic.SecretStr` in the settings, so the
configuration loader registers them for redaction; the sink registers them too
(with the URL's password and secret-named query parameters) and scrubs them from
every reason it gives.
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import hmac
import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any, Final, Literal, Self

import aiohttp
import yarl
from pydantic import BeforeValidator, ConfigDict, Field, SecretStr, field_validator, model_validator

from ..durations import Duration, format_duration
from ..errors import AcklaneError
from ..redact import MASK, MIN_LENGTH, is_secret_name, redact, redact_url, remember
from ._base import (
    Delivery,
    DeliveryError,
    DeliveryResult,
    RefusedDelivery,
    RetryableDelivery,
    Sink,
    SinkContext,
    SinkError,
)
from ._http import parse_retry_after, read_up_to
from ._settings import SinkSettings

__all__ = [
    "DEFAULT_TOLERANCE",
    "IDEMPOTENCY_HEADER",
    "SIGNATURE_HEADER",
    "USER_AGENT",
    "SignatureError",
    "WebhookSink",
    "WebhookSinkSettings",
    "batch_idempotency_key",
    "is_secret_header",
    "parse_retry_after",
    "sign",
    "verify_signature",
]

#: The header that carries the signature (with ``secret``).
SIGNATURE_HEADER: Final = "Acklane-Signature"
#: The header that carries the stable key of a request (the same on every attempt).
IDEMPOTENCY_HEADER: Final = "Idempotency-Key"
#: The signature's tolerance by default: 5 minutes either way, as Stripe's.
DEFAULT_TOLERANCE: Final = 300.0
#: The shortest HMAC key accepted: a short one can be guessed from signed bodies.
MIN_SECRET_LENGTH: Final = 16
#: How much of a refusing answer's body goes into the reason.
EXCERPT_BYTES: Final = 200
#: How much of a delivered answer's body is read (and discarded) so that its
#: connection can be reused; past it the connection is closed instead.
DRAIN_BYTES: Final = 64 * 1024
#: The longest ``t=`` of a signature: unix seconds have 10 digits until the year 2286;
#: a longer one is no timestamp, and not worth turning into a number.
_TIMESTAMP: Final = re.compile(r"[0-9]{1,12}")

try:
    _VERSION = version("acklane-core")
except PackageNotFoundError:  # pragma: no cover - running from a bare source tree
    _VERSION = "0+unknown"
USER_AGENT: Final = f"acklane/{_VERSION}"

# Headers acklane sets itself (or aiohttp does, from the body): not configurable.
_RESERVED: Final = frozenset(
    {
        "content-type",
        "content-length",
        "content-encoding",
        "transfer-encoding",
        "host",
        "connection",
        IDEMPOTENCY_HEADER.lower(),
        SIGNATURE_HEADER.lower(),
    }
)
# Header names whose values are credentials although is_secret_name() would not say so.
_SECRET_HEADER_WORDS: Final = re.compile(
    r"auth|cookie|session|(?:^|[-_.])(?:key|sig)|key$", re.IGNORECASE
)
# RFC 9110 field names (tokens) and values (no control characters but tab).
_TOKEN: Final = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_BAD_VALUE: Final = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# What an excerpt of a body may not hold: control characters, runs of whitespace.
_UNPRINTABLE: Final = re.compile(r"[\x00-\x1f\x7f-\x9f\s]+")
# One encoder for every request: json.dumps with options builds a new one per call.
_ENCODE: Final = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def is_secret_header(name: str) -> bool:
    """Whether the value of the header ``name`` is a credential: ``auth``, ``cookie`` or
    ``session`` anywhere in it (``Authorization``, ``X-Auth-Token``, ``Set-Cookie``), a
    word ``key...`` or ``sig...`` (``X-Api-Key``, ``Ocp-Apim-Subscription-Key``,
    ``X-Hub-Signature``), or what
    :func:`~acklane.core.redact.is_secret_name` calls secret (``token``,
    ``secret``, ``pass``...)."""
    return bool(_SECRET_HEADER_WORDS.search(name)) or is_secret_name(name)


def _header_value(value: object) -> object:
    """A header's value: a string (a number, as YAML reads ``X-Version: 2``, as written)."""
    if isinstance(value, str | SecretStr):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    kind = "true or false" if isinstance(value, bool) else type(value).__name__
    raise ValueError(f"expected a string, got {kind}")


class WebhookSinkSettings(SinkSettings):
    """``kind: webhook``: where to POST, how to sign, which headers, how long to wait."""

    # A validation error's text never repeats the input: a URL's password or a header's
    # credential would be in it (the loader words its own messages from errors()).
    model_config = ConfigDict(hide_input_in_errors=True)

    kind: Literal["webhook"] = "webhook"
    #: The receiver: an http:// or https:// URL (a ``user:password@`` is sent as Basic
    #: authentication and masked in every output).
    url: str
    #: The HMAC-SHA256 key of the ``Acklane-Signature`` header; no signature without it.
    secret: SecretStr | None = None
    #: Extra headers of every request; the values of secret-looking names are SecretStr.
    headers: dict[str, Annotated[str | SecretStr, BeforeValidator(_header_value)]] = Field(
        default_factory=dict
    )
    #: The whole request, connecting included, from the first byte sent to the last read.
    timeout: Annotated[Duration, Field(gt=0)] = 10.0
    #: Connecting (TCP and TLS) to the receiver, within ``timeout``.
    connect_timeout: Annotated[Duration, Field(gt=0)] = 5.0
    #: Check the receiver's TLS certificate (https) against the system's trust store.
    verify_tls: bool = True

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if value != value.strip() or any(c.isspace() for c in value):
            raise ValueError("the URL holds whitespace")
        try:
            url = yarl.URL(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a URL ({exc})") from None
        if url.scheme not in ("http", "https"):
            raise ValueError(
                f"expected an http:// or https:// URL, got the scheme {url.scheme or 'none'!r}"
            )
        if not url.host:
            raise ValueError("the URL names no host")
        if url.fragment:
            raise ValueError("the URL has a #fragment, which is never sent; remove it")
        return value

    @field_validator("secret")
    @classmethod
    def _secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_SECRET_LENGTH:
            raise ValueError(
                f"the secret needs at least {MIN_SECRET_LENGTH} characters (a random one: "
                "python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        return value

    @field_validator("headers", mode="after")
    @classmethod
    def _headers(cls, value: dict[str, str | SecretStr]) -> dict[str, str | SecretStr]:
        checked: dict[str, str | SecretStr] = {}
        seen: set[str] = set()
        for name, item in value.items():
            if not _TOKEN.match(name):
                raise ValueError(f"{name!r} is not a valid header name")
            if name.lower() in _RESERVED:
                raise ValueError(f"the header {name} is set by acklane and cannot be configured")
            if name.lower() in seen:
                raise ValueError(f"the header {name} is given twice (header names ignore case)")
            seen.add(name.lower())
            text = item.get_secret_value() if isinstance(item, SecretStr) else item
            if _BAD_VALUE.search(text):
                # The value is not shown: it may be a credential.
                raise ValueError(f"the value of the header {name} holds a control character")
            secret = isinstance(item, SecretStr) or is_secret_header(name)
            checked[name] = SecretStr(text) if secret else text
        return checked

    @model_validator(mode="after")
    def _userinfo(self) -> Self:
        url = yarl.URL(self.url)
        if url.user is not None and any(n.lower() == "authorization" for n in self.headers):
            raise ValueError(
                "the URL's user:password and an Authorization header both authenticate; give one"
            )
        return self


# -- the signature ---------------------------------------------------------------------


class SignatureError(AcklaneError, ValueError):
    """An ``Acklane-Signature`` header does not prove the body came from acklane: it is
    missing or malformed, its timestamp is outside the tolerance, or it does not match."""


def sign(body: bytes, secret: str | bytes, *, timestamp: int | None = None) -> str:
    """The ``Acklane-Signature`` value of ``body``: ``t=<timestamp>,v1=<hex HMAC-SHA256
    of "<timestamp>." + body>`` (``timestamp``: now, in unix seconds, by default)."""
    key = secret.encode("utf-8") if isinstance(secret, str) else secret
    t = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(key, b"%d." % t, hashlib.sha256)
    mac.update(body)
    return f"t={t},v1={mac.hexdigest()}"


def verify_signature(
    body: bytes,
    header: str | None,
    secret: str,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> None:
    """Check that ``header`` (the request's ``Acklane-Signature``) signs ``body`` (the
    raw bytes received, before any JSON parsing) with ``secret``, at most ``tolerance``
    seconds from ``now`` (the current time by default).

    Raises :class:`SignatureError` saying what is wrong: no header, a malformed one, a
    timestamp outside the tolerance (a replay, or clocks apart), or no ``v1`` that
    matches (a wrong secret or an altered body). The comparison is constant-time.
    Several ``v1=`` entries are accepted (any one matching is enough), so that a
    sender may sign with an old and a new secret while the key is rotated.
    """
    if not math.isfinite(tolerance) or tolerance < 0:
        raise ValueError(f"tolerance must be a number of seconds >= 0, got {tolerance!r}")
    if not header or not header.strip():
        raise SignatureError(f"no {SIGNATURE_HEADER} header: the request is not signed")
    timestamps: list[str] = []
    signatures: list[str] = []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            raise SignatureError(_malformed(f"{key!r} is not key=value"))
        if key == "t":
            timestamps.append(value)
        elif key == "v1":
            signatures.append(value)
        # other schemes (v0, v2...) are for other receivers: ignored
    # ASCII digits only: str.isdigit() also takes "٣" and "²", which int() reads or rejects
    if len(timestamps) != 1 or not _TIMESTAMP.fullmatch(timestamps[0]):
        raise SignatureError(_malformed("expected one t=<unix seconds>"))
    if not signatures:
        raise SignatureError(_malformed("no v1=<hex> signature"))
    timestamp = int(timestamps[0])
    current = time.time() if now is None else now
    skew = current - timestamp
    if abs(skew) > tolerance:
        when = "old" if skew > 0 else "in the future"
        raise SignatureError(
            f"the signature's timestamp is {abs(skew):.0f} s {when} (tolerance "
            f"{tolerance:g} s): a replayed request, or the clocks are apart"
        )
    expected = sign(body, secret, timestamp=timestamp).rpartition("v1=")[2]
    # compare_digest on every candidate, no early exit that would time the match
    matched = False
    for candidate in signatures:
        matched |= hmac.compare_digest(candidate.encode("ascii", "replace"), expected.encode())
    if not matched:
        raise SignatureError(
            "the signature does not match the body: a wrong secret, or the body was "
            "altered (verify the raw bytes, before parsing them)"
        )


def _malformed(detail: str) -> str:
    return f"malformed {SIGNATURE_HEADER} header ({detail}): expected t=<unix seconds>,v1=<hex>"


# -- the parts of a request ---------------------------------------------------------------


def batch_idempotency_key(event_ids: Sequence[str]) -> str:
    """The ``Idempotency-Key`` of a batch: ``batch_`` + 32 hex of the SHA-256 of its event
    ids in order; the same for the same batch on every attempt."""
    digest = hashlib.sha256("\x1f".join(event_ids).encode("utf-8", "surrogatepass"))
    return "batch_" + digest.hexdigest()[:32]


def _document(delivery: Delivery) -> dict[str, Any]:
    document = delivery.acklane_fields()
    document["payload"] = delivery.payload
    return document


def _excerpt(raw: bytes, charset: str | None, *, truncated: bool) -> str:
    """The start of a body as one line of text: decoded by its charset (UTF-8 when it
    names none or an unknown one), undecodable bytes replaced, a character cut at the
    end dropped, control characters and runs of whitespace made one space."""
    try:
        decoder = codecs.getincrementaldecoder(charset or "utf-8")("replace")
    except LookupError:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
    text = _UNPRINTABLE.sub(" ", decoder.decode(raw, final=not truncated)).strip()
    return text + "..." if truncated and text else text


# -- the sink ----------------------------------------------------------------------------


class WebhookSink(Sink):
    """POSTs stored events to ``url``: one aiohttp session per sink, a keep-alive pool of
    ``concurrency`` connections, headers prepared once."""

    kind = "webhook"
    settings_model = WebhookSinkSettings

    def __init__(self, settings: SinkSettings, context: SinkContext | None = None) -> None:
        if not isinstance(settings, WebhookSinkSettings):
            raise SinkError(
                f"a webhook sink needs WebhookSinkSettings, got {type(settings).__name__}"
            )
        super().__init__(settings, context)
        self._config = settings
        url = yarl.URL(settings.url)
        self._url = url
        self._destination = redact_url(settings.url)
        self._secrets = _secrets_of(settings, url)
        remember(self._secrets)
        self._base_headers: dict[str, str] = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
        }
        for name, value in settings.headers.items():
            text = value.get_secret_value() if isinstance(value, SecretStr) else value
            # a configured User-Agent replaces acklane's (the names ignore case)
            for own in [k for k in self._base_headers if k.lower() == name.lower()]:
                del self._base_headers[own]
            self._base_headers[name] = text
        self._mac = (
            hmac.new(settings.secret.get_secret_value().encode("utf-8"), digestmod=hashlib.sha256)
            if settings.secret is not None
            else None
        )
        self._timeout = aiohttp.ClientTimeout(
            total=settings.timeout, sock_connect=min(settings.connect_timeout, settings.timeout)
        )
        self._session: aiohttp.ClientSession | None = None

    @property
    def destination(self) -> str:
        """The URL, its password and secret-named query parameters masked."""
        return self._destination

    def _new_session(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=self._config.concurrency,
            limit_per_host=self._config.concurrency,
            ssl=self._config.verify_tls,
        )
        return aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            auto_decompress=True,
            raise_for_status=False,
            # no proxies or .netrc credentials from the environment: what is sent where
            # is what the YAML says
            trust_env=False,
        )

    async def open(self) -> None:
        """Open the session and its connection pool (idempotent)."""
        if self._session is None or self._session.closed:
            self._session = self._new_session()

    async def aclose(self) -> None:
        """Close the session and its connections (idempotent)."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def check(self) -> None:
        """Reach the URL with a ``HEAD`` request (nothing delivered): any HTTP answer, even
        a 404 or a 405, proves it is reachable. A connection error, a TLS failure or no
        answer within ``timeout`` raises :class:`SinkError`, secret-free."""
        session = self._session
        own = session is None or session.closed
        if own:
            session = self._new_session()
        assert session is not None
        try:
            async with session.head(self._url, headers=self._base_headers, allow_redirects=False):
                pass
        except TimeoutError as exc:
            raise SinkError(self._scrub(f"{self._label}: {self._timed_out(exc)}")) from None
        except aiohttp.ClientSSLError as exc:
            raise SinkError(
                self._scrub(
                    f"{self._label}: TLS failed ({_describe(exc)}); a certificate of a "
                    "private CA is trusted with SSL_CERT_FILE=<the CA bundle>, a test "
                    "server's self-signed one with verify_tls: false"
                )
            ) from None
        except aiohttp.ClientError as exc:
            raise SinkError(
                self._scrub(f"{self._label}: cannot reach it ({_describe(exc)})")
            ) from None
        finally:
            if own:
                await session.close()

    @property
    def _label(self) -> str:
        return f"webhook sink {self.name} ({self._destination})"

    async def deliver(self, batch: Sequence[Delivery]) -> list[DeliveryResult]:
        """POST ``batch`` as one request and give every event of it the request's outcome.

        With ``batch_size: 1`` the body is the event's document and the key its id; with
        a larger ``batch_size`` it is always ``{"events": [...]}`` (one event too: the
        receiver sees one shape) and the key the batch's.
        """
        if not batch:
            return []
        if len(batch) > self.max_batch:
            raise ValueError(
                f"{self._label} takes at most {self.max_batch} events per request (its "
                f"batch_size), got {len(batch)}"
            )
        single = self.max_batch == 1
        try:
            if single:
                body = _ENCODE(_document(batch[0])).encode()
            else:
                body = _ENCODE({"events": [_document(d) for d in batch]}).encode()
        except (TypeError, ValueError) as exc:
            refused = RefusedDelivery(self._scrub(f"the payload cannot be sent as JSON: {exc}"))
            return [refused] * len(batch)
        headers = dict(self._base_headers)
        headers[IDEMPOTENCY_HEADER] = (
            batch[0].event_id if single else batch_idempotency_key([d.event_id for d in batch])
        )
        if self._mac is not None:
            timestamp = int(time.time())
            mac = self._mac.copy()
            mac.update(b"%d." % timestamp)
            mac.update(body)
            headers[SIGNATURE_HEADER] = f"t={timestamp},v1={mac.hexdigest()}"
        with self.delivery_spans(batch) as spans:
            # the trace context of the (first) event's delivery: W3C traceparent/tracestate
            headers.update(spans.carrier(0))
            outcome = await self._post(body, headers)
            results: list[DeliveryResult] = [outcome] * len(batch)
            spans.results(results)
        return results

    async def _post(self, body: bytes, headers: Mapping[str, str]) -> DeliveryError | None:
        session = self._session
        if session is None or session.closed:
            raise SinkError(f"{self._label} is not open: call open() first")
        try:
            async with session.post(
                self._url, data=body, headers=headers, allow_redirects=False
            ) as response:
                status = response.status
                if 200 <= status < 300:
                    if not response.content.is_eof():  # most answers are in already
                        await _drain(response)
                    return None
                return await self._failure(response)
        except TimeoutError as exc:
            return RetryableDelivery(self._scrub(self._timed_out(exc)))
        except aiohttp.ClientError as exc:
            return RetryableDelivery(self._scrub(f"request failed: {_describe(exc)}"))

    async def _failure(self, response: aiohttp.ClientResponse) -> DeliveryError:
        status = response.status
        raw, truncated = b"", False
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            raw, truncated = await read_up_to(response, EXCERPT_BYTES)
        excerpt = _excerpt(raw, response.charset, truncated=truncated)
        reason = f"HTTP {status}" + (f" {response.reason}" if response.reason else "")
        if 300 <= status < 400:
            location = response.headers.get("Location")
            reason += " (redirects are not followed: set url to the final address"
            reason += f", {redact_url(location)})" if location else ")"
        if excerpt:
            reason += f": {excerpt}"
        reason = self._scrub(reason)
        if status in (408, 429) or 500 <= status <= 599:
            retry_after = None
            if status in (429, 503):
                retry_after = parse_retry_after(
                    response.headers.get("Retry-After"), cap=self._config.backoff_max
                )
            return RetryableDelivery(reason, retry_after=retry_after)
        return RefusedDelivery(reason)

    def _timed_out(self, exc: BaseException) -> str:
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            limit = format_duration(self._config.connect_timeout)
            return f"could not connect within connect_timeout ({limit})"
        return f"no complete answer within timeout ({format_duration(self._config.timeout)})"

    def _scrub(self, text: str) -> str:
        """``text`` without this sink's secrets and without what looks like a credential
        (even when the process's registry was cleared)."""
        for secret in self._secrets:
            text = text.replace(secret, MASK)
        return redact(text)


def _secrets_of(settings: WebhookSinkSettings, url: yarl.URL) -> tuple[str, ...]:
    """The sink's secret values, longest first: the HMAC key, the secret headers' values
    (and a ``Bearer <token>``'s token alone), the URL's password and its secret-named
    query parameters; those shorter than :data:`~acklane.core.redact.MIN_LENGTH`
    are left out, as the registry leaves them out of free text (where they would mask
    ordinary words)."""
    found: set[str] = set()
    if settings.secret is not None:
        found.add(settings.secret.get_secret_value())
    for value in settings.headers.values():
        if isinstance(value, SecretStr):
            text = value.get_secret_value()
            found.add(text)
            # a "Bearer <token>" or "Basic <credentials>": the scheme is no secret
            found.update(text.split()[1:])
    if url.password:
        found.add(url.password)
    for name, value in url.query.items():
        if is_secret_name(name) and value:
            found.add(value)
    return tuple(sorted((s for s in found if len(s) >= MIN_LENGTH), key=len, reverse=True))


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _drain(response: aiohttp.ClientResponse) -> None:
    """Read a delivered answer's body to its end, discarding it, so that the connection
    goes back to the pool; at most :data:`DRAIN_BYTES` of it, since a body that never
    ends would hold the sink until its timeout (the connection is then closed instead).
    An error past the status changes nothing: it was delivered."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        await read_up_to(response, DRAIN_BYTES)
