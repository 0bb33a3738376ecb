"""acklane's Azure Service Bus connector (azure-servicebus >= 7.15).

``connector: servicebus`` in a stream's YAML block; :class:`ServiceBusMessageTrigger`
for watchers written in Python. See ``docs/connectors/servicebus.md``.
"""

from acklane.core.deprecation import old_names

from ._config import ServiceBusConfig, namespace_of
from ._connector import ServiceBusConnector
from ._message import ServiceBusMessage
from ._producer import ServiceBusDelivery, ServiceBusStreamProducer
from ._trigger import ServiceBusMessageTrigger

__all__ = [
    "ServiceBusConfig",
    "ServiceBusConnector",
    "ServiceBusDelivery",
    "ServiceBusMessage",
    "ServiceBusMessageTrigger",
    "ServiceBusStreamProducer",
    "namespace_of",
]

#: Names of earlier releases: still importable, with a DeprecationWarning.
__getattr__ = old_names(
    __name__,
    {"ServiceBusTrigger": ServiceBusMessageTrigger, "ServiceBusRecord": ServiceBusMessage},
)
