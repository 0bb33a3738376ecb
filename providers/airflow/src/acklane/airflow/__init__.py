"""acklane's connectors as Apache Airflow 3.3 event triggers.

One trigger class per broker, usable as ``AssetWatcher(name=..., trigger=...)``:

- :class:`~acklane.airflow.kafka.KafkaEventTrigger` (``acklane-airflow[kafka]``),
- :class:`~acklane.airflow.sqs.SqsEventTrigger` (``[sqs]``),
- :class:`~acklane.airflow.pubsub.PubSubEventTrigger` (``[pubsub]``),
- :class:`~acklane.airflow.servicebus.ServiceBusEventTrigger` (``[servicebus]``).

Each broker's module imports its connector only when it is imported (here, on
first use of its name), so only the brokers in use need their client libraries;
importing this package alone loads neither Airflow nor a connector.
See ``docs/airflow.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._errors import AirflowTriggerError

if TYPE_CHECKING:
    from ._trigger import AcklaneEventTrigger
    from .kafka import KafkaEventTrigger
    from .pubsub import PubSubEventTrigger
    from .servicebus import ServiceBusEventTrigger
    from .sqs import SqsEventTrigger

__all__ = [
    "AcklaneEventTrigger",
    "AirflowTriggerError",
    "KafkaEventTrigger",
    "PubSubEventTrigger",
    "ServiceBusEventTrigger",
    "SqsEventTrigger",
]

_LAZY = {
    "AcklaneEventTrigger": "._trigger",
    "KafkaEventTrigger": ".kafka",
    "SqsEventTrigger": ".sqs",
    "PubSubEventTrigger": ".pubsub",
    "ServiceBusEventTrigger": ".servicebus",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
