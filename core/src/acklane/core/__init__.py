"""acklane's engine: shared upstream polls with a producer-side ack channel.

The public names keep Apache Airflow 3.3's shapes, so a producer or a trigger
written for one runs under the other.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .errors import (
        AcklaneError,
        ConfigError,
        ConnectorError,
        SharedStreamError,
        StateStoreError,
    )
    from .manager import BoundEvent, GroupStats, SharedStreamManager
    from .message import BodyDecodeError, RawMessage
    from .producer import AdvanceItem, AdvanceOutcome, SharedStreamProducer
    from .trigger import (
        AckTimeout,
        BaseEventTrigger,
        StreamEnded,
        SubscriberOverflow,
        TriggerEvent,
        reject_shared_stream_event,
    )

# Imported when first used, not with the package: `acklane --version` and every
# `import acklane.core.X` would otherwise pay for the engine (asyncio, typing_extensions).
_LAZY = {
    **dict.fromkeys(
        ("AcklaneError", "ConfigError", "ConnectorError", "SharedStreamError", "StateStoreError"),
        "errors",
    ),
    **dict.fromkeys(("BoundEvent", "GroupStats", "SharedStreamManager"), "manager"),
    **dict.fromkeys(("BodyDecodeError", "RawMessage"), "message"),
    **dict.fromkeys(("AdvanceItem", "AdvanceOutcome", "SharedStreamProducer"), "producer"),
    **dict.fromkeys(
        (
            "AckTimeout",
            "BaseEventTrigger",
            "StreamEnded",
            "SubscriberOverflow",
            "TriggerEvent",
            "reject_shared_stream_event",
        ),
        "trigger",
    ),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "AckTimeout",
    "AcklaneError",
    "AdvanceItem",
    "AdvanceOutcome",
    "BaseEventTrigger",
    "BodyDecodeError",
    "BoundEvent",
    "ConfigError",
    "ConnectorError",
    "GroupStats",
    "RawMessage",
    "SharedStreamError",
    "SharedStreamManager",
    "SharedStreamProducer",
    "StateStoreError",
    "StreamEnded",
    "SubscriberOverflow",
    "TriggerEvent",
    "reject_shared_stream_event",
]

assert set(_LAZY) == set(__all__)
