"""acklane's Azure Service Bus connector (azure-servicebus >= 7.15).

``connector: servicebus`` in a stream's YAML block; :class:`ServiceBusTrigger` for
watchers written in Python. See ``docs/connectors/servicebus.md``.
"""

from ._config import ServiceBusConfig, namespace_of
from ._connector import ServiceBusConnector
from ._producer import ServiceBusDelivery, ServiceBusRecord, ServiceBusStreamProducer
from ._trigger import ServiceBusTrigger

__all__ = [
    "ServiceBusConfig",
    "ServiceBusConnector",
    "ServiceBusDelivery",
    "ServiceBusRecord",
    "ServiceBusStreamProducer",
    "ServiceBusTrigger",
    "namespace_of",
]
