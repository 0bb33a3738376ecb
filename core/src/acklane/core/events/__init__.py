"""The event store: trigger events persisted (and deduplicated) before their raw event is acked.

```python
async with EventStore("sqlite:///acklane.db", on_confirmed=engine_callback) as store:
    await store.put(EventRecord(trigger_id, stream_key, payload, message_id, position), seq)
```

See docs/event-store.md.
"""

from __future__ import annotations

from ..sql import DEFAULT_URL
from ._model import EventRecord, StoredEvent, storable_stream_key
from ._reader import EventReader
from ._retention import (
    DEFAULT_PRUNE_BATCH,
    DEFAULT_RETENTION,
    count_older_than,
    cutoff_for,
    prune_older_than,
)
from ._schema import (
    SINK_DELIVERIES_TABLE,
    SINK_STATE_TABLE,
    TABLE_NAME,
    events_table,
    metadata,
    sink_deliveries_table,
    sink_state_table,
)
from ._store import (
    BeforeCommitHook,
    ConfirmCallback,
    EventStore,
    EventStoreStats,
    StoreUnavailable,
    display_url,
    why_unavailable,
)

__all__ = [
    "DEFAULT_PRUNE_BATCH",
    "DEFAULT_RETENTION",
    "DEFAULT_URL",
    "SINK_DELIVERIES_TABLE",
    "SINK_STATE_TABLE",
    "TABLE_NAME",
    "BeforeCommitHook",
    "ConfirmCallback",
    "EventReader",
    "EventRecord",
    "EventStore",
    "EventStoreStats",
    "StoreUnavailable",
    "StoredEvent",
    "count_older_than",
    "cutoff_for",
    "display_url",
    "events_table",
    "metadata",
    "prune_older_than",
    "sink_deliveries_table",
    "sink_state_table",
    "storable_stream_key",
    "why_unavailable",
]
