"""A trigger class for Service Bus watchers written in Python."""

from __future__ import annotations

from acklane.core.connectors import ConnectorTrigger

from ._config import ServiceBusConfig
from ._connector import ServiceBusConnector

__all__ = ["ServiceBusMessageTrigger"]


class ServiceBusMessageTrigger(ConnectorTrigger[ServiceBusConfig]):
    """A watcher of one queue or subscription; override ``filter_shared_stream``."""

    connector_class = ServiceBusConnector
