"""What a connector reads of its broker's backlog: :class:`Backlog` and :class:`BacklogProbe`.

A connector offers a probe (``Connector.backlog_probe(config)``) and the runner's
lag monitor (:mod:`acklane.core.observe.lag`) reads it. The probe is part of what a
connector writes to, so it is defined in the connector kit, below ``observe`` in
core's layers (docs/architecture.md); ``acklane.core.observe.lag`` names the same
classes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Backlog", "BacklogProbe"]


@dataclass(frozen=True, slots=True)
class Backlog:
    """What waits for a stream in one partition (or queue) of its broker.

    ``lag``: messages the stream has not advanced past yet and that it could receive
    now (Kafka: log end minus committed offset; SQS and Service Bus: the visible or
    active messages), the figure to scale on. ``states``: the broker's own counts
    by state when it has several (SQS: ``visible``, ``in_flight``, ``delayed``), else
    empty. ``partition``: the partition (``"orders/3"``) or queue name.
    """

    partition: str
    lag: float
    states: tuple[tuple[str, float], ...] = ()


class BacklogProbe(ABC):
    """Reads one stream's backlog from its broker, with a client of its own.

    :meth:`read` is called every ``engine.lag_interval`` seconds by one task the
    runner owns (never two at once), bounded by ``observe.lag.LAG_READ_TIMEOUT``; it must
    change nothing on the broker (no receive, no commit, no group join). Blocking
    SDK calls go to a thread. :meth:`aclose` is called once, at shutdown.
    """

    #: The broker's name, the ``broker`` label of the metrics.
    broker: str = ""

    @abstractmethod
    async def read(self) -> Sequence[Backlog]:
        """The stream's backlog now, one entry per partition or queue; raises on failure."""

    async def aclose(self) -> None:  # noqa: B027 - optional, like the producer's
        """Close the probe's clients; best-effort."""
