"""Entities of the Service Bus emulator, read from a ``Config.json`` like Microsoft's emulator's.

The file's shape::

    {"UserConfig": {"Namespaces": [{"Name": "sbemulatorns",
        "Queues": [{"Name": "orders", "Properties": {"LockDuration": "PT30S",
                                                     "MaxDeliveryCount": 10,
                                                     "RequiresSession": false}}],
        "Topics": [{"Name": "events", "Properties": {},
                    "Subscriptions": [{"Name": "audit", "Properties": {...}}]}]}]}}

Durations are ISO 8601 (``PT1M``, ``PT0.5S``, ``P1D``). A subscription's ``Rules``
(``Name``, ``Properties`` with ``FilterType`` ``Sql`` / ``Correlation``, ``SqlFilter``,
``CorrelationFilter``, ``Action``) are honoured. Properties that would change delivery
and are not modelled (duplicate detection, forwarding, partitioning, auto-delete) are
refused with an error naming them; properties with no effect on delivery are accepted.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ._rules import Rule, RuleError

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
    #: Each subscription's declared rules (none declared: the ``$Default`` true filter).
    rules: dict[str, tuple[Rule, ...]] = field(default_factory=dict)


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
        for queue in ns.get("Queues") or ():
            _refuse_unmodelled(f"queue {queue['Name']}", queue.get("Properties"))
        for topic in ns.get("Topics") or ():
            _refuse_unmodelled(f"topic {topic['Name']}", topic.get("Properties"))
            subs: dict[str, EntityProperties] = {}
            rules: dict[str, tuple[Rule, ...]] = {}
            for sub in topic.get("Subscriptions") or ():
                where = f"subscription {topic['Name']}/{sub['Name']}"
                _refuse_unmodelled(where, sub.get("Properties"))
                subs[sub["Name"]] = EntityProperties.from_json(sub.get("Properties"))
                try:
                    rules[sub["Name"]] = tuple(Rule.from_json(r) for r in sub.get("Rules") or ())
                except RuleError as exc:
                    raise ValueError(f"{where}: invalid rule: {exc}") from None
            config.topics[topic["Name"]] = TopicSpec(topic["Name"], subs, rules)
        return config


#: Properties of Microsoft's Config.json that change what the service does and that
#: this emulator does not model: refused, so that a pipeline never behaves differently
#: here without a word. (Properties with no effect on delivery, such as
#: MaxSizeInMegabytes or EnableBatchedOperations, are accepted.)
_UNMODELLED = {
    "RequiresDuplicateDetection": "duplicate detection",
    "ForwardTo": "auto-forwarding",
    "ForwardDeadLetteredMessagesTo": "auto-forwarding of dead letters",
    "DeadLetteringOnFilterEvaluationExceptions": "dead-lettering on filter errors",
    "EnablePartitioning": "partitioned entities",
    "AutoDeleteOnIdle": "auto-delete on idle",
}


def _refuse_unmodelled(where: str, props: dict[str, Any] | None) -> None:
    for name, feature in _UNMODELLED.items():
        value = (props or {}).get(name)
        if value not in (None, False, "", "P10675199DT2H48M5.4775807S"):
            raise ValueError(
                f"{where}: {name} ({feature}) is not implemented by acklane's Service Bus "
                "emulator; remove it, or test this feature against the service"
            )
