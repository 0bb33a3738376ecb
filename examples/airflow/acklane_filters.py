"""Filter functions for the example DAGs (imported by the triggerer from the DAGs folder).

A function filter is named in a trigger's ``filter`` by its import path
(``"acklane_filters:audit"``), as in acklane's YAML.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any


async def audit(stream: AsyncIterator[Any], watcher: Any) -> AsyncIterator[dict[str, Any]]:
    """Fire for every message; count them in the asset's store (Airflow's asset state store).

    The count is read once when the filter starts and written through as it grows,
    so a store call never waits on every message twice.
    """
    store = watcher.asset_store  # Airflow's asset_state_store (None outside the triggerer)
    seen = int(await store.aget("seen", 0)) if store is not None else 0
    async for message in stream:
        seen += 1
        if store is not None:
            await store.aset("seen", seen)
        yield {"message_id": message.message_id, "seen": seen}
