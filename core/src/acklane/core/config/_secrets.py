"""The file's secrets, found as it is parsed and registered with the redaction.

SecretStr fields of the models (a stream's, a sink's), secret-like keys and values,
URL passwords: remembered by acklane.core.observe.redact, so no message or output
of the process shows them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from ..observe.redact import remember, secrets_in
from ._yaml import _Reader


def _secret_fields(model: type[BaseModel]) -> list[str]:
    """The fields of ``model`` typed SecretStr (possibly optional)."""
    names = []
    for name, field in model.model_fields.items():
        if "SecretStr" in repr(field.annotation) or "SecretBytes" in repr(field.annotation):
            names.append(field.alias or name)
    return names


def _remember_secrets(reader: _Reader, data: Any, *more: str) -> frozenset[str]:
    found = set(reader.secrets) | set(more)
    if data is not None:
        found.update(secrets_in(data))
    found.discard("")
    remember(found)
    return frozenset(found)
