"""A sink's delivery spans: what a sink asks for around each call, free when tracing is off.

The sink layer knows only this shape; the spans themselves come from whoever runs the
sink (the runner, ``acklane sinks run``), which hands each sink its tracer
(:attr:`~acklane.core.sinks.Sink.spans_from`: a ``SpanSource``, such as
``observe.tracing.MessageTracer``).
No process global: a sink without one records nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Final

_EMPTY: Mapping[str, str] = {}


class SinkSpans:
    """The delivery spans of one sink call (this base: tracing off, nothing at all)."""

    def __enter__(self) -> SinkSpans:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def carrier(self, index: int = 0) -> Mapping[str, str]:
        """The W3C fields to send with event ``index`` of the batch (empty when off)."""
        return _EMPTY

    def current(self, index: int = 0) -> contextlib.AbstractContextManager[object]:
        """Event ``index``'s delivery span as the current OpenTelemetry context (what
        the function sink calls the function in); nothing when off."""
        return contextlib.nullcontext()

    def results(self, results: Sequence[BaseException | None]) -> None:
        """Each event's outcome (None: delivered)."""


#: The spans of a sink without a tracer: nothing.
NO_SPANS: Final = SinkSpans()
