"""One redaction for every output of acklane: logs, errors, ``validate``, ``config show``.

The rule (docs/configuration.md, "Secrets in output"):

1. **Known secrets.** A value is a secret when it sits in a field typed
   :class:`pydantic.SecretStr` (a connector's ``sasl_password``,
   ``aws_secret_access_key``...), under a key whose name is secret-like
   (:func:`is_secret_name`: ``sasl.password`` in a Kafka ``client:`` block), when it
   is the password of a URL (``store.url``), or when it came from a ``${VAR}`` whose
   name is secret-like (``${PGPASS}``, ``${AWS_SECRET}``). Loading a configuration
   registers its secrets here (:func:`remember`) for the life of the process, and
   every occurrence of one of them in any output is replaced by ``***`` (as
   written, JSON-escaped, ``repr``-escaped and URL-decoded). Values shorter than
   :data:`MIN_LENGTH` characters are masked where they stand (their field, their
   URL) but not searched for in free text, where they would mask ids and numbers.
2. **Credential shapes.** Messages and log records are also cleared of what looks
   like a credential whether or not it was registered: the password of any
   ``scheme://user:password@host`` URL, and the value of a ``name=value`` or
   ``"name": "value"`` pair whose name is secret-like (``password=...``,
   ``SharedAccessKey=...`` in a connection string, ``'sasl.password': '...'``).

:func:`redact` applies both; :func:`redact_known` only the first (for data the
user asked for: event payloads and store values are printed as stored, minus the
known secrets). :class:`RedactingStream` applies :func:`redact_known` to everything
a process writes to stdout and stderr, as the last line of defence.
"""

from __future__ import annotations

import io
import json
import re
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final, TextIO
from urllib.parse import unquote

__all__ = [
    "MASK",
    "MIN_LENGTH",
    "RedactingStream",
    "forget_all",
    "guard_std_streams",
    "is_secret_name",
    "known_secrets",
    "redact",
    "redact_known",
    "redact_structure",
    "redact_url",
    "remember",
    "secrets_in",
    "url_password",
]

#: What a secret is replaced with (SQLAlchemy's choice for URLs, too).
MASK: Final = "***"
#: Shorter secrets are masked in their own field and URL, not searched for in text.
MIN_LENGTH: Final = 5

# Secret-like names: variables (PGPASS, AWS_SECRET), keys (sasl.password, ssl_key_pem).
_SECRET_WORDS: Final = re.compile(
    r"pass|pwd|secret|token|credential|private|api[_.\-]?key|access[_.\-]?key"
    r"|account[_.\-]?key|key[_.\-]?pem|connection[_.\-]?string|signature",
    re.IGNORECASE,
)
# ... unless the name says the value is where a secret is, not the secret itself.
_LOCATOR: Final = re.compile(
    r"(?:[_.\-](?:url|uri|endpoint|location|path|file|dir|mechanism|method|type|id)|name)$",
    re.IGNORECASE,
)


def is_secret_name(name: str) -> bool:
    """Whether a variable or key named ``name`` holds a secret.

    Secret-like: the name contains ``pass``, ``pwd``, ``secret``, ``token``,
    ``credential``, ``private``, ``api_key``, ``access_key``, ``account_key``,
    ``key_pem``, ``connection_string`` or ``signature`` (any case, ``_``, ``.`` or
    ``-`` between words), and does not end in ``_url``, ``_uri``, ``_endpoint``,
    ``_location``, ``_path``, ``_file``, ``_dir``, ``_mechanism``, ``_method``,
    ``_type``, ``_id`` or ``name`` (which name where a secret is, what kind, or whose:
    ``SharedAccessKeyName``, not the secret).
    ``aws_access_key_id`` is still a secret: its field is a ``SecretStr``.
    """
    return bool(_SECRET_WORDS.search(name)) and not _LOCATOR.search(name)


# scheme://user:PASSWORD@host: the password, up to the last @ of the token.
_URL_PASSWORD: Final = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@'\"]*:)(?P<secret>[^\s'\"]*)(?P<tail>@)"
)
_NAME: Final = r"[A-Za-z0-9_.\-]*"
# password=..., SharedAccessKey=...; (query strings, connection strings, log text)
_ASSIGNMENT: Final = re.compile(
    rf"(?P<head>\b(?P<name>{_NAME})\s*=\s*)(?P<secret>[^\s;&,'\"]+)",
)
# "sasl.password": "..." or 'sasl.password': '...' (JSON, Python reprs of mappings)
_QUOTED_PAIR: Final = re.compile(
    r"(?P<head>(?P<q>[\"'])(?P<name>[^\"'\s]{1,100})(?P=q)\s*:\s*(?P<q2>[\"']))"
    r"(?P<secret>(?:\\.|(?!(?P=q2)).)*)(?P<tail>(?P=q2))"
)


def _mask_url_password(match: re.Match[str]) -> str:
    return match["head"] + MASK + match["tail"]


def _mask_assignment(match: re.Match[str]) -> str:
    if not is_secret_name(match["name"]) or match["secret"] == MASK:
        return match.group(0)
    return match["head"] + MASK


def _mask_quoted_pair(match: re.Match[str]) -> str:
    if not is_secret_name(match["name"]):
        return match.group(0)
    return match["head"] + MASK + match["tail"]


def url_password(text: str) -> str | None:
    """The password of a ``scheme://user:password@host`` URL in ``text``, if any."""
    match = _URL_PASSWORD.search(text)
    return match["secret"] if match and match["secret"] not in ("", MASK) else None


def redact_url(url: str) -> str:
    """``url`` with its password and secret-named query parameters masked."""
    return _ASSIGNMENT.sub(_mask_assignment, _URL_PASSWORD.sub(_mask_url_password, url))


class _Registry:
    """The process's known secrets and one compiled pattern that finds them all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._secrets: set[str] = set()
        self._pattern: re.Pattern[str] | None = None

    def add(self, values: Iterable[str]) -> None:
        forms: set[str] = set()
        for value in values:
            if not isinstance(value, str) or len(value) < MIN_LENGTH or value == MASK:
                continue
            forms.update(
                form
                for form in (
                    value,
                    json.dumps(value)[1:-1],
                    repr(value)[1:-1],
                    unquote(value),
                )
                if len(form) >= MIN_LENGTH
            )
        with self._lock:
            if forms <= self._secrets:
                return
            self._secrets |= forms
            ordered = sorted(self._secrets, key=len, reverse=True)
            self._pattern = re.compile("|".join(re.escape(s) for s in ordered))

    def clear(self) -> None:
        with self._lock:
            self._secrets.clear()
            self._pattern = None

    def snapshot(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._secrets)

    def sub(self, text: str) -> str:
        pattern = self._pattern
        return text if pattern is None else pattern.sub(MASK, text)


_registry = _Registry()


def remember(values: Iterable[str]) -> None:
    """Register secret values: from now on no output of this process shows them."""
    _registry.add(values)


def forget_all() -> None:
    """Forget every registered secret (for tests)."""
    _registry.clear()


def known_secrets() -> frozenset[str]:
    """The registered secrets (and their escaped forms)."""
    return _registry.snapshot()


def redact_known(text: str) -> str:
    """``text`` without the registered secrets (rule 1 only: for data output)."""
    return _registry.sub(text)


def redact(text: str) -> str:
    """``text`` without registered secrets and without credential shapes (rules 1 and 2)."""
    text = _registry.sub(text)
    if "://" in text:
        text = _URL_PASSWORD.sub(_mask_url_password, text)
    if "=" in text:
        text = _ASSIGNMENT.sub(_mask_assignment, text)
    if ":" in text:
        text = _QUOTED_PAIR.sub(_mask_quoted_pair, text)
    return text


def secrets_in(value: Any, *, name: str = "", secret: bool = False) -> Iterator[str]:
    """The secrets held in a configuration value: SecretStr values, values under
    secret-like keys (``name``) and the passwords of URLs; recurses into models,
    mappings and sequences."""
    from pydantic import BaseModel, SecretBytes, SecretStr  # a value to look into has them

    secret = secret or (bool(name) and is_secret_name(name))
    if isinstance(value, SecretStr):
        yield value.get_secret_value()
    elif isinstance(value, SecretBytes):
        yield value.get_secret_value().decode("utf-8", "replace")
    elif isinstance(value, BaseModel):
        for field in type(value).model_fields:
            yield from secrets_in(getattr(value, field), name=field, secret=secret)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from secrets_in(item, name=str(key), secret=secret)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            yield from secrets_in(item, name=name, secret=secret)
    elif isinstance(value, str):
        if secret:
            yield value
        password = url_password(value)
        if password is not None:
            yield password
            yield unquote(password)


def redact_structure(value: Any, *, name: str = "") -> Any:
    """A JSON-able copy of ``value`` with every secret replaced by ``"***"``.

    Models become mappings of every field (defaults included), SecretStr fields and
    values under secret-like keys become ``***``, URLs lose their password, and the
    registered secrets are masked in every other string.
    """
    from pydantic import BaseModel, SecretBytes, SecretStr

    if isinstance(value, SecretStr | SecretBytes):
        return MASK
    if name and is_secret_name(name) and isinstance(value, str | int | float | bytes):
        return MASK
    if isinstance(value, BaseModel):
        return {
            field: redact_structure(getattr(value, field), name=field)
            for field in type(value).model_fields
        }
    if isinstance(value, Mapping):
        return {str(k): redact_structure(v, name=str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [redact_structure(item, name=name) for item in value]
    if isinstance(value, str):
        return redact(redact_url(value))
    if value is None or isinstance(value, bool | int | float):
        return value
    return redact(str(value))


class RedactingStream(io.TextIOBase):
    """A text stream that writes through to another with the known secrets masked."""

    def __init__(self, target: TextIO) -> None:
        super().__init__()
        self.target = target

    def write(self, text: str) -> int:
        self.target.write(redact_known(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:  # type: ignore[override]
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        # (also called by this stream's own close, at garbage collection: a target closed
        # before it, as a test runner's capture is, has nothing left to flush)
        if not self.target.closed:
            self.target.flush()

    def isatty(self) -> bool:
        return self.target.isatty()

    def fileno(self) -> int:
        return self.target.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.target, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self.target, "errors", None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)


@contextmanager
def guard_std_streams() -> Iterator[None]:
    """Within the block, ``sys.stdout`` and ``sys.stderr`` mask the known secrets."""
    saved = sys.stdout, sys.stderr
    if not isinstance(sys.stdout, RedactingStream):
        sys.stdout = RedactingStream(sys.stdout)
    if not isinstance(sys.stderr, RedactingStream):
        sys.stderr = RedactingStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
