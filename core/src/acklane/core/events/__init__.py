"""The event store: trigger events persisted (and deduplicated) before their raw event is acked.

```python
async with EventStore("sqlite:///acklane.db", on_confirmed=engine_callback) as store:
    await store.put(EventRecord(trigger_id, stream_key, payload, message_id, position), seq)
```

See docs/event-store.md.
"""

from __future__ import annotations

from ..sql import DEFAULT_URL
from ._model import EventRecord, StoredEvent
from ._reader import EventReader
from ._schema import TABLE_NAME, events_table, metadata
from ._store import BeforeCommitHook, ConfirmCallback, EventStore, EventStoreStats

__all__ = [
    "DEFAULT_URL",
    "TABLE_NAME",
    "BeforeCommitHook",
    "ConfirmCallback",
    "EventReader",
    "EventRecord",
    "EventStore",
    "EventStoreStats",
    "StoredEvent",
    "events_table",
    "metadata",
]
