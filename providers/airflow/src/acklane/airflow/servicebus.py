"""acklane's Service Bus connector as an Airflow event trigger."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from acklane.connectors.servicebus import ServiceBusConfig, ServiceBusConnector

from ._trigger import AcklaneEventTrigger

if TYPE_CHECKING:
    from airflow.sdk.definitions.connection import Connection

__all__ = ["ServiceBusEventTrigger"]


class ServiceBusEventTrigger(AcklaneEventTrigger):
    """One Service Bus queue or topic subscription, received once for every trigger of it.

    Settings: those of acklane's Service Bus stream block (``queue``, or ``topic``
    and ``subscription``, ``sessions``, ``max_lock_renewal``...). The connection
    string is a secret, so it comes from ``conn_id``: an Airflow Azure Service Bus
    connection holds it in its "Connection String" field (``schema``), as the Azure
    provider reads it, or in its password or its extra's ``connection_string``;
    else its extra's ``fully_qualified_namespace`` with azure-identity's default
    credential. Rejected messages go to the entity's own dead-letter queue, with
    acklane's reason.
    """

    connector_class = ServiceBusConnector
    upstream_settings: ClassVar[tuple[str, ...]] = (
        "fully_qualified_namespace",
        "queue",
        "topic",
        "subscription",
    )

    @classmethod
    def connection_fields(cls, conn: Connection, extra: Mapping[str, Any]) -> dict[str, Any]:
        fields = ServiceBusConfig.model_fields
        out: dict[str, Any] = {k: v for k, v in extra.items() if k in fields}
        if "connection_string" not in out and "fully_qualified_namespace" not in out:
            text = conn.schema or conn.password
            if text:
                out["connection_string"] = text
        if "fully_qualified_namespace" in out and "connection_string" not in out:
            out.setdefault("credential", "default")
        return out
