"""The built-in, in-process ``memory`` connector: a small Kafka look-alike.

:class:`MemoryBroker` keeps named topics of N partitions in memory (one
process-global broker per name), consumer groups with committed offsets, and
per-offset delivery counts. :class:`MemoryStreamProducer` consumes it with Kafka's
semantics as acklane maps them (the same :class:`~acklane.core.connectors.CommitLedger`
as the Kafka connector):

- lane = ``(topic, partition)``; ``advance`` commits offset+1 of the last
  committable item of each partition (cumulative commit);
- a failed item, or one nobody received (``acked = failed = rejected = 0``),
  holds its partition: nothing at or after it is committed, across batches,
  and the consumer is sought back to it so it comes again;
- a rejected item is copied to ``dead_letter`` (original key, value and headers
  plus the ``acklane.origin.*`` and ``acklane.reject.reason`` headers of
  :mod:`acklane.core.connectors.deadletter`) before the commit passes it; with no DLQ it
  is committed past and counted as dropped.

A new consumer starts at its group's committed offset, or at the beginning of
the partition (``earliest``): messages published before the pipeline starts are
consumed. Publishing is thread-safe; waiting consumers are woken on their own
event loop.
"""

from acklane.core.deprecation import old_names

from ._broker import (
    MemoryBroker,
    MemoryCommitRefused,
    MemoryConsumer,
    MemoryGroupStats,
    MemoryRecord,
)
from ._config import MemoryConfig
from ._connector import MemoryConnector
from ._producer import MemoryDelivery, MemoryStreamProducer

__all__ = [
    "MemoryBroker",
    "MemoryCommitRefused",
    "MemoryConfig",
    "MemoryConnector",
    "MemoryConsumer",
    "MemoryDelivery",
    "MemoryGroupStats",
    "MemoryRecord",
    "MemoryStreamProducer",
]

#: Names of earlier releases: still importable, with a DeprecationWarning.
__getattr__ = old_names(
    __name__, {"MemoryProducer": MemoryStreamProducer, "MemoryPayload": MemoryDelivery}
)
