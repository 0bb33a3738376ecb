"""Function sinks of the sinks tests, found by name (``sink_functions:record``) both by
the tests and by the pipeline they run (not a test module)."""

from __future__ import annotations

from acklane.core.sinks import Delivery

#: What :func:`record` got, in order.
RECEIVED: list[Delivery] = []


def record(event: Delivery) -> None:
    RECEIVED.append(event)


#: The OpenTelemetry span context each call of :func:`record_trace` ran in.
TRACED: list[object] = []


def record_trace(event: Delivery) -> None:
    from opentelemetry import trace

    TRACED.append(trace.get_current_span().get_span_context())


#: What :func:`record_other` got: a second pipeline's sink of the same name.
RECEIVED_OTHER: list[Delivery] = []


def record_other(event: Delivery) -> None:
    RECEIVED_OTHER.append(event)
