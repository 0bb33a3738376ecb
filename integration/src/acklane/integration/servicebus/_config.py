"""Entities of the Service Bus emulator, read from a ``Config.json`` like Microsoft's emulator's.

The file's shape::

    {"UserConfig": {"Namespaces": [{"Name": "sbemulatorns",
        "Queues": [{"Name": "orders", "Properties": {"LockDuration": "PT30S",
                                                     "MaxDeliveryCount": 10,
                                                     "RequiresSession": false}}],
        "Topics": [{"Name": "events", "Properties": {},
                    "Subscriptions": [{"Name": "audit", "Properties": {...}}]}]}]}}

Durations are ISO 8601 (``PT1M``, ``PT0.5S``, ``P1D``). Unknown properties are
ignored (the emulator does not implement forwarding or duplicate detection).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_NAMESPACE",
    "EmulatorConfig",
    "EntityProperties",
    "TopicSpec",
    "parse_duration",
]

DEFAULT_NAMESPACE = "sbemulatorns"

_DURATION = re.compile(
    r"^P(?:(?P<d>\d+(?:\.\d+)?)D)?(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?"
    r"(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?$"
)


def parse_duration(value: Any) -> float:
    """Seconds of an ISO 8601 duration (``PT30S``); a number is taken as seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    match = _DURATION.match(str(value).strip().upper())
    if not match or str(value).strip().upper() in ("P", "PT"):
        raise ValueError(f"not an ISO 8601 duration: {value!r}")
    parts = {k: float(v) for k, v in match.groupdict().items() if v}
    return (
        parts.get("d", 0.0) * 86400
        + parts.get("h", 0.0) * 3600
        + parts.get("m", 0.0) * 60
        + parts.get("s", 0.0)
    )


@dataclass(frozen=True, slots=True)
class EntityProperties:
    """What the emulator honours of a queue's or a subscription's properties."""

    lock_duration: float = 60.0
    max_delivery_count: int = 10
    requires_session: bool = False
    default_ttl: float | None = None  # seconds; None: forever
    dead_lettering_on_expiration: bool = False

    @classmethod
    def from_json(cls, props: dict[str, Any] | None) -> EntityProperties:
        props = props or {}
        ttl = props.get("DefaultMessageTimeToLive")
        return cls(
            lock_duration=parse_duration(props.get("LockDuration", "PT1M")),
            max_delivery_count=int(props.get("MaxDeliveryCount", 10)),
            requires_session=bool(props.get("RequiresSession", False)),
            default_ttl=parse_duration(ttl) if ttl else None,
            dead_lettering_on_expiration=bool(props.get("DeadLetteringOnMessageExpiration", False)),
        )

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EntityProperties:
        """From snake_case keywords (``lock_duration=2``) or the JSON names (``LockDuration``)."""
        if any(k[:1].isupper() for k in kwargs):
            return cls.from_json(kwargs)
        return replace(cls(), **kwargs)


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    subscriptions: dict[str, EntityProperties] = field(default_factory=dict)


@dataclass(slots=True)
class EmulatorConfig:
    namespace: str = DEFAULT_NAMESPACE
    queues: dict[str, EntityProperties] = field(default_factory=dict)
    topics: dict[str, TopicSpec] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> EmulatorConfig:
        return cls.from_json(json.loads(Path(path).read_text()))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EmulatorConfig:
        namespaces = (data.get("UserConfig") or data).get("Namespaces") or [{}]
        if len(namespaces) != 1:
            raise ValueError("the emulator serves exactly one namespace")
        ns = namespaces[0]
        config = cls(namespace=ns.get("Name") or DEFAULT_NAMESPACE)
        for queue in ns.get("Queues") or ():
            config.queues[queue["Name"]] = EntityProperties.from_json(queue.get("Properties"))
        for topic in ns.get("Topics") or ():
            subs = {
                sub["Name"]: EntityProperties.from_json(sub.get("Properties"))
                for sub in topic.get("Subscriptions") or ()
            }
            config.topics[topic["Name"]] = TopicSpec(topic["Name"], subs)
        return config
