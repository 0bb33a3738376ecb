"""acklane's Kafka connector as an Airflow event trigger."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from acklane.connectors.kafka import KafkaConfig, KafkaConnector

from ._trigger import AcklaneEventTrigger

if TYPE_CHECKING:
    from airflow.sdk.definitions.connection import Connection

__all__ = ["KafkaEventTrigger"]

# librdkafka properties that are fields of acklane's Kafka settings.
_PROPERTY_FIELDS = {
    "bootstrap.servers": "bootstrap_servers",
    "group.id": "group_id",
    "auto.offset.reset": "auto_offset_reset",
}
_FIELD_PREFIXES = ("security.", "sasl.", "ssl.")


class KafkaEventTrigger(AcklaneEventTrigger):
    """Kafka topics through one consumer group, shared by every trigger of the same group.

    Settings: those of acklane's Kafka stream block (``topics``, ``group_id``,
    ``dead_letter``, ``poll_timeout``, ``client``...). ``conn_id`` names an Airflow
    Kafka connection whose extra holds librdkafka properties, as the Kafka
    provider's do (``bootstrap.servers``, ``group.id``, ``security.protocol``,
    ``sasl.username``, ``sasl.password``...); the connection's login and password
    are the SASL credentials when set. acklane always commits by itself:
    ``enable.auto.commit`` may be absent or false, never true.
    """

    connector_class = KafkaConnector
    upstream_settings: ClassVar[tuple[str, ...]] = ("bootstrap_servers", "topics", "group_id")

    @classmethod
    def connection_fields(cls, conn: Connection, extra: Mapping[str, Any]) -> dict[str, Any]:
        fields = KafkaConfig.model_fields
        out: dict[str, Any] = {}
        client: dict[str, Any] = {}
        for key, value in extra.items():
            if key in fields:
                out[key] = value
            elif key in _PROPERTY_FIELDS:
                out[_PROPERTY_FIELDS[key]] = value
            elif key.startswith(_FIELD_PREFIXES) and key.replace(".", "_") in fields:
                out[key.replace(".", "_")] = value
            elif "." in key:
                client[key] = value
        if client:
            out["client"] = {**client, **out.get("client", {})}
        if "bootstrap_servers" not in out and conn.host:
            out["bootstrap_servers"] = f"{conn.host}:{conn.port}" if conn.port else conn.host
        if conn.login and "sasl_username" not in out:
            out["sasl_username"] = conn.login
        if conn.password and "sasl_password" not in out:
            out["sasl_password"] = conn.password
        return out
