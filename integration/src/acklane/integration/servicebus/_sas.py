"""Shared access signatures: the namespace's key, and the check of a token the SDK
puts on ``$cbs`` (signed with that key, not expired).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import urllib.parse

__all__ = ["DEFAULT_KEY", "DEFAULT_KEY_NAME", "verify_sas_token"]

DEFAULT_KEY_NAME = "RootManageSharedAccessKey"
DEFAULT_KEY = "SAS_KEY_VALUE"


def verify_sas_token(token: str, key_name: str, key: str, now: float | None = None) -> str | None:
    """None when the token is signed with ``key`` and not expired, else why not."""
    if not token.startswith("SharedAccessSignature "):
        return "not a SharedAccessSignature token"
    fields: dict[str, str] = {}
    for part in token[len("SharedAccessSignature ") :].split("&"):
        name, _, value = part.partition("=")
        fields[name] = value
    try:
        resource, expiry = fields["sr"], fields["se"]
        signature = urllib.parse.unquote_plus(fields["sig"])
    except KeyError:
        return "incomplete token"
    if fields.get("skn") != key_name:
        return f"unknown key name {fields.get('skn')!r}"
    expected = base64.b64encode(
        hmac.new(key.encode(), f"{resource}\n{expiry}".encode(), hashlib.sha256).digest()
    ).decode()
    if not hmac.compare_digest(expected, signature):
        return "invalid signature"
    if int(expiry) < (now or time.time()):
        return "token expired"
    return None
