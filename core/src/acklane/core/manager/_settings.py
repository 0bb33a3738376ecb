"""Refusing a subscriber whose stream settings differ from those its group's producer uses.

The producer is built from the first subscriber's settings only, so a second trigger
with other settings would silently be served by the first one's poll.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import fields as dataclass_fields
from dataclasses import is_dataclass

from ..trigger import BaseEventTrigger


def _stream_settings(trigger: BaseEventTrigger) -> object:
    """The trigger's ``shared_stream_settings()``, or None when it has none (not checked)."""
    hook = getattr(trigger, "shared_stream_settings", None)
    return None if hook is None else hook()


def _check_settings(
    key: Hashable, founder: str, theirs: object, trigger_id: str, settings: object
) -> None:
    """Refuse a trigger whose stream settings differ from ``theirs``, those the producer
    of the group of ``key`` uses (built from trigger ``founder``'s)."""
    if settings is None or theirs is None or settings == theirs:
        return
    what = _describe_difference(theirs, settings)
    # Field names only, never values: settings may hold credentials.
    raise ValueError(
        f"trigger {trigger_id} reads the same upstream as trigger {founder} "
        f"(key {key!r}) with {what}; they would share one poll with the settings of "
        f"{founder}: make the settings identical or give the triggers different keys"
    )


def _describe_difference(theirs: object, settings: object) -> str:
    """How two unequal settings differ: by field name where their kind names the fields."""
    names = _differing_fields(theirs, settings)
    if names is not None:
        return f"different settings ({', '.join(names)})"
    if type(settings) is not type(theirs):
        kinds = f"{type(settings).__name__}, not {type(theirs).__name__}"
        return f"settings of another kind ({kinds})"
    return "different settings"


def _field_names(x: object) -> Iterable[str] | None:
    """The declared fields of a pydantic model or a dataclass instance (None: neither)."""
    model_fields = getattr(type(x), "model_fields", None)
    if isinstance(model_fields, Mapping):
        return model_fields
    if is_dataclass(x) and not isinstance(x, type):
        return [f.name for f in dataclass_fields(x)]
    return None


def _is_record(x: object) -> bool:
    """Whether a field's value has fields of its own to name (a model or a dataclass)."""
    return hasattr(type(x), "model_fields") or (is_dataclass(x) and not isinstance(x, type))


def _differing_fields(a: object, b: object, prefix: str = "") -> list[str] | None:
    """Names of the fields in which two settings objects of one kind differ (None: unknown)."""
    if type(a) is not type(b):
        return None
    fields = _field_names(a)
    if fields is None:
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            keys = dict.fromkeys([*a, *b])
            return [f"{prefix}{k}" for k in keys if a.get(k) != b.get(k)]
        return None
    names: list[str] = []
    for name in fields:
        x, y = getattr(a, name, None), getattr(b, name, None)
        if x == y:
            continue
        nested = _differing_fields(x, y, f"{prefix}{name}.") if _is_record(x) else None
        names.extend(nested or [f"{prefix}{name}"])
    return names
