"""acklane's Pub/Sub connector as an Airflow event trigger."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from acklane.connectors.pubsub import PubSubConfig, PubSubConnector

from ._errors import AirflowTriggerError
from ._trigger import AcklaneEventTrigger

if TYPE_CHECKING:
    from airflow.sdk.definitions.connection import Connection

__all__ = ["PubSubEventTrigger"]

_GCP_PREFIX = "extra__google_cloud_platform__"


class PubSubEventTrigger(AcklaneEventTrigger):
    """One Pub/Sub subscription, pulled once for every trigger of the same subscription.

    Settings: those of acklane's Pub/Sub stream block (``subscription``,
    ``project``, ``dead_letter``, ``ack_deadline``...). ``conn_id`` names an
    Airflow Google Cloud connection: its extra's ``project`` and ``key_path`` (a
    service-account key file) are read as the Google provider reads them, and any
    of acklane's settings by name (``emulator_host``). An inline key
    (``keyfile_dict``) is not supported: acklane reads the key from a file.
    """

    connector_class = PubSubConnector
    upstream_settings: ClassVar[tuple[str, ...]] = (
        "project",
        "subscription",
        "emulator_host",
        "endpoint",
        "client_options",
    )

    @classmethod
    def connection_fields(cls, conn: Connection, extra: Mapping[str, Any]) -> dict[str, Any]:
        fields = PubSubConfig.model_fields
        plain = {k.removeprefix(_GCP_PREFIX): v for k, v in extra.items()}
        out: dict[str, Any] = {k: v for k, v in plain.items() if k in fields}
        if plain.get("keyfile_dict"):
            raise AirflowTriggerError(
                f"{cls.__name__}: connection {conn.conn_id!r} holds an inline key "
                "(keyfile_dict); acklane reads a key file: set key_path instead"
            )
        if plain.get("key_path") and "credentials_file" not in out:
            out["credentials_file"] = plain["key_path"]
        return out
