"""acklane's SQS connector as an Airflow event trigger."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from acklane.connectors.sqs import SqsConfig, SqsConnector

from ._trigger import AcklaneEventTrigger

if TYPE_CHECKING:
    from airflow.sdk.definitions.connection import Connection

__all__ = ["SqsEventTrigger"]


class SqsEventTrigger(AcklaneEventTrigger):
    """One SQS queue, polled once for every trigger of the same queue.

    Settings: those of acklane's SQS stream block (``queue_url`` or ``queue_name``,
    ``dead_letter``, ``visibility_timeout``, ``redelivery_backoff``...).
    ``conn_id`` names an Airflow AWS connection: its login and password are the
    access key id and secret, its extra's ``region_name``, ``endpoint_url`` (or
    ``service_config.sqs.endpoint_url``), ``aws_session_token`` and
    ``profile_name`` are read as the Amazon provider reads them. Without a
    connection (or with one that has no keys), boto's default chain applies.
    """

    connector_class = SqsConnector
    upstream_settings: ClassVar[tuple[str, ...]] = (
        "queue_url",
        "queue_name",
        "account_id",
        "region",
        "endpoint_url",
    )

    @classmethod
    def connection_fields(cls, conn: Connection, extra: Mapping[str, Any]) -> dict[str, Any]:
        fields = SqsConfig.model_fields
        out: dict[str, Any] = {k: v for k, v in extra.items() if k in fields}
        service = extra.get("service_config")
        sqs = service.get("sqs") if isinstance(service, Mapping) else None
        endpoint = sqs.get("endpoint_url") if isinstance(sqs, Mapping) else None
        for field, value in (
            ("region", extra.get("region_name")),
            ("endpoint_url", endpoint or extra.get("endpoint_url")),
            ("aws_session_token", extra.get("aws_session_token")),
            ("profile", extra.get("profile_name")),
            ("aws_access_key_id", conn.login),
            ("aws_secret_access_key", conn.password),
        ):
            if value and field not in out:
                out[field] = value
        return out
