"""Settings that work but expose what they carry: warnings, not problems.

``verify_tls: false`` lets anyone between acklane and the server pose as it, and a
credential sent to a plain ``http://`` URL can be read by anyone on the network: a
password in the URL itself, or one of the URL's sibling settings that goes with each
request (``password``, ``token``, a credential header; any of ``tracing.headers``).
Both are accepted, since a test server needs them; each is said once, at its file, line
and field. A URL on the loopback interface (``localhost``, ``127.0.0.1``, ``[::1]``)
never leaves the machine and is not warned. A webhook's ``secret`` signs each request
and is never sent: not a credential here.

The walk is over the file's data as written, so every kind of sink, stream and section is
covered without each model listing its URL fields.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from ..redact import is_secret_name
from ..sinks.webhook import is_secret_header
from ._errors import ConfigProblem, Loc, format_path
from ._yaml import _Reader

#: The settings that switch certificate checks off when false.
_VERIFY_FIELDS: Final = ("verify_tls",)

#: Secret-named settings that are not sent: the webhook's HMAC key signs the body.
_NOT_SENT: Final = ("secret",)


def insecure_settings(reader: _Reader, data: Any) -> list[ConfigProblem]:
    """Each setting of ``data`` that exposes a credential or trusts any server."""
    return [
        ConfigProblem(reader.source, reader.line_of(loc), format_path(loc), message)
        for loc, message in _walk(data, ())
    ]


def _walk(value: Any, loc: Loc) -> Iterator[tuple[Loc, str]]:
    if isinstance(value, Mapping):
        yield from _mapping(value, loc)
        for key, item in value.items():
            if isinstance(key, str | int):
                yield from _walk(item, (*loc, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, (*loc, index))


def _mapping(block: Mapping[Any, Any], loc: Loc) -> Iterator[tuple[Loc, str]]:
    for key, value in block.items():
        if not isinstance(key, str):
            continue
        if key in _VERIFY_FIELDS and value is False:
            yield (
                (*loc, key),
                "false: the server's TLS certificate is not checked, so anyone on the way "
                "can pose as the server and read what is sent; keep it for test servers",
            )
        if not isinstance(value, str):
            continue
        for url in _plain_http_urls(value):
            if url.password:
                yield (
                    (*loc, key),
                    "the URL's password is sent over plain http://, readable on the "
                    "network; use https://",
                )
            every = loc[:1] == ("tracing",)  # its headers are all secrets (an API key...)
            sent = [n for n, item in block.items() if n != key and _sent(n, item, every)]
            if sent:
                yield (
                    (*loc, key),
                    f"plain http:// while {' and '.join(sent)} goes with each request, "
                    "readable on the network; use https://",
                )
            if url.password or sent:
                break  # one warning per field, not one per URL of a list


def _plain_http_urls(value: str) -> Iterator[Any]:
    """The ``http://`` URLs of ``value`` (one, or several comma-separated) off loopback."""
    for part in value.split(","):
        part = part.strip()
        if not part.lower().startswith("http://"):
            continue
        try:
            url = urlsplit(part)
            host = url.hostname
        except ValueError:
            continue  # not a URL: the field's own check says so
        if host is not None and not _loopback(host):
            yield url


def _loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _sent(name: Any, value: Any, every_header: bool) -> bool:
    """Whether the sibling setting ``name: value`` is a credential sent with requests."""
    if not isinstance(name, str) or value in (None, "", False) or name in _NOT_SENT:
        return False
    if name == "headers" and isinstance(value, Mapping):
        return any(isinstance(h, str) and (every_header or is_secret_header(h)) for h in value)
    return is_secret_name(name)
