"""OpenTelemetry traces of each message, from its receipt to its advance and its sinks.

Optional (``pip install "acklane[tracing]"``) and free when off: nothing here imports
OpenTelemetry until :func:`start_tracing` finds tracing configured, and the engine
only tests ``tracer is not None`` at its hook points. See ``docs/tracing.md``.

One span per message (``process <streams>``, kind CONSUMER), child of the W3C
``traceparent`` found in the message's headers or attributes (``RawMessage.attributes``
on every connector): it starts when the engine broadcasts the message and ends
when the broker is advanced past it, with the outcome. On it, an event per
watcher that finished with it (``acklane.fired``, ``acklane.acked``,
``acklane.rejected``, ``acklane.failed``) and one per trigger event stored
(``acklane.stored``). Each sink delivery is a span of its own,
child of the message's, whose context the sink passes on (the webhook's
``traceparent`` header, the broker sink's attribute, the Airflow asset event's
``extra.acklane.traceparent``).

:class:`MessageTracer` is one of the engine's :class:`~acklane.core.manager.Hooks`,
called with plain values (raw messages, payloads, bound events), never the engine's
books:

- ``received(key, messages)``: the poll took these messages (a span each);
- ``filtered(key, message, verdict)``: a watcher is done with a message (an event
  named by its verdict on the message's span);
- ``stored(key, watcher, bound)``: the event store queued a trigger event bound to
  the message;
- ``committed(seqs)``: the event store committed those bound events (before the
  engine hears it);
- ``advanced(key, batch)``: the producer advanced past a batch (the spans end);
- ``abandoned(key, why)``: the key's group is gone; what it never advanced ends so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from ..errors import AcklaneError
from ..manager import FIRED, REJECTED, Hooks, Received, Verdict
from ..sinks._spans import SinkSpans
from .redact import redact, redact_url, remember

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, SpanContext, Tracer

    from ..manager import BoundEvent
    from ..producer import AdvanceItem
    from ..sinks import Delivery, Sink
    from ._tracing_settings import TracingSettings

__all__ = [
    "EXPORTERS",
    "MessageTracer",
    "SinkSpans",
    "TracingUnavailable",
    "active",
    "enabled_by",
    "install",
    "sink_spans",
    "start_tracing",
]

log = logging.getLogger("acklane.core.observe.tracing")

#: What ``tracing.exporter`` (or ``OTEL_TRACES_EXPORTER``) may name.
EXPORTERS: Final = ("otlp", "console")

#: The W3C trace-context fields a carrier holds.
TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"

#: Our connector names as OpenTelemetry's ``messaging.system`` values.
_MESSAGING_SYSTEM: Final = {
    "kafka": "kafka",
    "sqs": "aws_sqs",
    "pubsub": "gcp_pubsub",
    "servicebus": "servicebus",
}

#: Span contexts of stored events kept for the sinks of this process, at most.
STORED_CONTEXTS_MAX: Final = 100_000

_EMPTY: Mapping[str, str] = {}


class TracingUnavailable(AcklaneError, RuntimeError):
    """Tracing is configured, but OpenTelemetry is not installed (the ``tracing`` extra)."""


def enabled_by(settings: TracingSettings | None, env: Mapping[str, str]) -> str | None:
    """The exporter tracing runs with (``otlp``, ``console``), or None when it is off.

    ``tracing.enabled: false`` and ``OTEL_SDK_DISABLED=true`` turn it off; ``true``
    turns it on (with ``tracing.exporter``, else ``OTEL_TRACES_EXPORTER``, else OTLP);
    unset, it is on when ``OTEL_TRACES_EXPORTER`` names otlp or console.
    """
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    enabled = None if settings is None else settings.enabled
    if enabled is False:
        return None
    chosen = None if settings is None else settings.exporter
    from_env = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    from_env = from_env.split(",")[0].strip()
    if enabled is None:
        if chosen is not None:
            return chosen
        return from_env if from_env in EXPORTERS else None
    if chosen is not None:
        return chosen
    return from_env if from_env in EXPORTERS else "otlp"


def start_tracing(
    settings: TracingSettings | None,
    env: Mapping[str, str] | None = None,
    *,
    exporter: Any = None,
) -> MessageTracer | None:
    """The process's tracer when tracing is configured, else None (and no import).

    ``exporter`` (a ``SpanExporter``, for tests: the SDK's in-memory one) replaces the
    configured one, behind a processor that exports each span as it ends.
    Raises :class:`TracingUnavailable` naming the extra when OpenTelemetry is not installed.
    """
    env = os.environ if env is None else env
    exporter_name = enabled_by(settings, env)
    if exporter_name is None:
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SimpleSpanProcessor,
            SpanExporter,
        )
        from opentelemetry.sdk.trace.sampling import ParentBased
    except ImportError as exc:
        raise TracingUnavailable(
            f"tracing is configured but OpenTelemetry is not installed ({exc.name} is "
            'missing): pip install "acklane[tracing]"'
        ) from None
    _remember_env_headers(env)
    service = (settings.service_name if settings else None) or env.get("OTEL_SERVICE_NAME")
    resource = Resource.create({"service.name": service or "acklane"})
    ratio = None if settings is None else settings.sample_ratio
    sampler = None if ratio is None else ParentBased(sampled_roots(ratio))
    provider = TracerProvider(resource=resource, sampler=sampler)
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        return MessageTracer(provider, ratio)
    chosen: SpanExporter
    where: str
    if exporter_name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        chosen = ConsoleSpanExporter(service_name=service or "acklane")
        where = "the console"
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = _traces_url(settings.endpoint) if settings and settings.endpoint else None
        headers = (
            {k: v.get_secret_value() for k, v in settings.headers.items()}
            if settings and settings.headers
            else None
        )
        chosen = OTLPSpanExporter(endpoint=endpoint, headers=headers)
        where = redact_url(str(getattr(chosen, "_endpoint", endpoint) or "the OTLP default"))
    provider.add_span_processor(BatchSpanProcessor(chosen))
    sampling = "from OTEL_TRACES_SAMPLER" if ratio is None else f"{ratio:g}"
    log.info(
        "%s",
        redact(
            f"Tracing on: spans go to {where} over {exporter_name} (service "
            f"{service or 'acklane'}, sample ratio {sampling})"
        ),
    )
    return MessageTracer(provider, ratio)


def sampled_roots(ratio: float) -> Any:
    """The root sampler with ``tracing.sample_ratio``: a message's span (kind CONSUMER)
    is made only once :meth:`MessageTracer.received` drew it at that ratio, so it is
    recorded; any other root (a delivery whose message's context this process does not
    have) is drawn by its trace id at the same ratio."""
    from opentelemetry.sdk.trace.sampling import (
        Decision,
        Sampler,
        SamplingResult,
        TraceIdRatioBased,
    )
    from opentelemetry.trace import SpanKind

    by_trace_id = TraceIdRatioBased(ratio)

    class DrawnOrRatio(Sampler):
        def should_sample(
            self,
            parent_context: Any,
            trace_id: int,
            name: str,
            kind: Any = None,
            attributes: Any = None,
            links: Any = None,
            trace_state: Any = None,
        ) -> SamplingResult:
            if kind is SpanKind.CONSUMER:
                return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)
            return by_trace_id.should_sample(
                parent_context, trace_id, name, kind, attributes, links, trace_state
            )

        def get_description(self) -> str:
            return f"AcklaneDrawnOrRatio{{{ratio}}}"

    return DrawnOrRatio()


def _traces_url(endpoint: str) -> str:
    """A YAML endpoint without a path gets OTLP/HTTP's ``/v1/traces``."""
    from urllib.parse import urlsplit

    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


def _remember_env_headers(env: Mapping[str, str]) -> None:
    """The values of ``OTEL_EXPORTER_OTLP_*HEADERS`` are credentials: masked in output."""
    from urllib.parse import unquote

    values = []
    for name in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"):
        for pair in env.get(name, "").split(","):
            _, sep, value = pair.partition("=")
            if sep and value.strip():
                values += [value.strip(), unquote(value.strip())]
    if values:
        remember(values)


# -- deprecated: sinks no longer look a process-wide tracer up

_INSTALLED: list[MessageTracer | None] = [None]


def active() -> MessageTracer | None:
    """Deprecated: what :func:`install` was last given (acklane reads it nowhere)."""
    return _INSTALLED[0]


def install(tracer: MessageTracer | None) -> None:
    """Deprecated, kept for old callers: sinks no longer read a process-wide tracer.
    Hand it to each sink instead (``sink.spans_from = tracer``), as the runner and
    ``acklane sinks run`` do."""
    _INSTALLED[0] = tracer


def _reason(text: object) -> str:
    """A watcher's reason as a span attribute: free text from user code, redacted as a
    log line is (it is exported to a collector, as a dead-letter copy's reason leaves
    to a broker) and bounded as that reason is."""
    from ..connectors.deadletter import bounded_text

    return bounded_text(redact(str(text)))


class _Getter:
    """Reads W3C fields from a message's attributes, whatever the case of their names."""

    def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
        value = carrier.get(key)
        if value is None:
            for name, item in carrier.items():
                if name.lower() == key:
                    value = item
                    break
        return None if value is None else [str(value)]

    def keys(self, carrier: Mapping[str, str]) -> list[str]:
        return list(carrier)


class _Open:
    """A message's span while the engine holds the message."""

    __slots__ = ("key", "message_id", "payload", "raw", "span")

    def __init__(self, message: Received, key: Hashable, span: Span) -> None:
        self.raw = message.raw
        self.payload = message.payload
        self.message_id = message.message_id
        self.key = key
        self.span = span


class MessageTracer(Hooks):
    """The engine's, the runner's and the sinks' hooks, on one TracerProvider."""

    def __init__(self, provider: TracerProvider, ratio: float | None = None) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        #: ``tracing.sample_ratio`` when set: a message without a parent is dropped at
        #: that rate before the SDK makes a span of it (the sampler would drop it too,
        #: the same way: ParentBased(TraceIdRatioBased)); None: the SDK decides alone
        self.ratio = ratio
        self._random = random.random
        self._get_span = trace.get_current_span
        self.tracer: Tracer = provider.get_tracer("acklane")
        self._trace = trace
        self._propagator = TraceContextTextMapPropagator()
        self._getter: Any = _Getter()  # duck-typed as a TextMap Getter
        self._kind_consumer = trace.SpanKind.CONSUMER
        self._kind_producer = trace.SpanKind.PRODUCER
        self._streams: dict[Hashable, tuple[dict[str, Any], str]] = {}
        self._key_texts: dict[Hashable, str] = {}  # the stream key as stored events name it
        # id(payload) -> the spans of entries with that payload (one, but for a
        # producer whose payloads are shared values such as small ints)
        self._open: dict[int, list[_Open]] = {}
        self._by_mid: dict[tuple[Hashable, str], _Open] = {}
        self._seqs: dict[int, tuple[_Open, str, str | None, int, str]] = {}
        self._stored: OrderedDict[tuple[str, str, str | None, int], SpanContext] = OrderedDict()

    # -- set-up

    def describe(
        self, key: Hashable, broker: str, streams: Sequence[str], key_text: str | None = None
    ) -> None:
        """What every span of ``key`` says of its stream, and the text the event store
        names ``key`` by (the runner, per cohort)."""
        if key_text is not None:
            self._key_texts[key] = key_text
        names = ",".join(streams)
        attributes: dict[str, Any] = {
            "messaging.system": _MESSAGING_SYSTEM.get(broker, broker),
            "acklane.broker": broker,
            "acklane.stream": names,
        }
        self._streams[key] = (attributes, f"process {names}")

    def shutdown(self) -> None:
        """Export what is left and stop (spans still open are ended as abandoned)."""
        for key in {o.key for opens in self._open.values() for o in opens}:
            self.abandoned(key, "the pipeline stopped")
        self.provider.shutdown()

    # -- engine hooks

    def received(self, key: Hashable, messages: Sequence[Received]) -> None:
        """The poll took ``messages``: one span each, child of its traceparent.

        A span the sampler drops is not kept: nothing more is recorded of its message.
        """
        attributes, name = self._streams.get(key) or ({"acklane.stream_key": str(key)}, "process")
        start = self.tracer.start_span
        extract = self._propagator.extract
        getter = self._getter
        kind = self._kind_consumer
        opens = self._open
        by_mid = self._by_mid
        ratio = self.ratio
        draw = self._random
        get_span = self._get_span
        for message in messages:
            raw = message.raw
            carrier = getattr(raw, "attributes", None)
            parent = extract(carrier, getter=getter) if carrier else None
            # what the parent-based sampler would drop, dropped before any span is made
            if parent is not None:
                upstream = get_span(parent).get_span_context()
                if upstream.is_valid and not upstream.trace_flags.sampled:
                    continue
                if not upstream.is_valid:
                    parent = None
            if parent is None and ratio is not None and draw() >= ratio:
                continue
            mid = message.message_id
            attrs = attributes.copy()
            if mid is not None:
                attrs["acklane.message_id"] = mid
            source = getattr(raw, "source", None)
            if type(source) is str:
                attrs["messaging.destination.name"] = source
            span = start(name, context=parent, kind=kind, attributes=attrs)
            if not span.is_recording():
                continue
            opened = _Open(message, key, span)
            ident = id(message.payload)
            same = opens.get(ident)
            if same is None:
                opens[ident] = [opened]
            else:
                same.append(opened)
            if mid is not None:
                by_mid[(key, mid)] = opened

    def _find(self, message: Received) -> _Open | None:
        raw = message.raw
        for opened in self._open.get(id(message.payload), ()):
            if opened.raw is raw:
                return opened
        return None

    def filtered(self, key: Hashable, message: Received, verdict: Verdict) -> None:
        """A watcher is done with ``message``: an event named by its verdict on the
        message's span (``acklane.fired``, ``acklane.acked``, ...)."""
        opened = self._find(message)
        if opened is None:
            return
        attrs: dict[str, Any] = {"acklane.watcher": verdict.watcher}
        outcome = verdict.outcome
        if outcome == FIRED:
            attrs["acklane.events"] = verdict.events
        elif outcome == REJECTED and verdict.reason:
            attrs["acklane.reason"] = _reason(verdict.reason)
        opened.span.add_event(f"acklane.{outcome}", attrs)

    # -- runner hooks

    def stored(self, key: Hashable, watcher: str, bound: BoundEvent | None) -> None:
        """The event store queued a trigger event of ``watcher`` bound to its message."""
        if bound is None or bound.message_id is None:
            return
        opened = self._by_mid.get((key, bound.message_id))
        if opened is None:
            return
        key_text = self._key_texts.get(key, str(key))
        self._seqs[bound.seq] = (opened, watcher, bound.message_id, bound.position, key_text)

    def committed(self, seqs: Iterable[int]) -> None:
        """The event store committed these bound events: an event on their message's span,
        and their context kept for this process's sinks."""
        from ..events._model import storable_message_id, storable_stream_key

        stored = self._stored
        for seq in seqs:
            found = self._seqs.pop(seq, None)
            if found is None:
                continue
            opened, watcher, mid, position, key_text = found
            opened.span.add_event(
                "acklane.stored", {"acklane.watcher": watcher, "acklane.position": position}
            )
            ident = (
                watcher,
                storable_stream_key(key_text),
                None if mid is None else storable_message_id(mid),
                position,
            )
            stored[ident] = opened.span.get_span_context()
            if len(stored) > STORED_CONTEXTS_MAX:
                stored.popitem(last=False)

    def advanced(self, key: Hashable, batch: Sequence[AdvanceItem]) -> None:
        """The broker was advanced past ``batch``: each message's span ends, with its outcome."""
        for payload, outcome in batch:
            opens = self._open.get(id(payload))
            if not opens:
                continue
            opened = next((o for o in opens if o.payload is payload), None)
            if opened is None:
                continue
            self._forget(opened)
            span = opened.span
            if outcome.failed:
                what = "failed"
            elif outcome.rejected:
                what = "rejected"
            elif outcome.acked:
                what = "acked"
            else:
                what = "unclaimed"
            attrs: dict[str, Any] = {"acklane.outcome": what}
            if what != "acked":
                attrs["acklane.acked"] = outcome.acked
                attrs["acklane.rejected"] = outcome.rejected
                attrs["acklane.failed"] = outcome.failed
                reasons = getattr(outcome, "reject_reasons", ())
                if reasons:
                    attrs["acklane.reason"] = _reason(reasons[0])
            span.set_attributes(attrs)
            if what == "failed":
                from opentelemetry.trace import Status, StatusCode

                span.set_status(Status(StatusCode.ERROR, "failed: the broker redelivers it"))
            span.end()

    def abandoned(self, key: Hashable, why: str) -> None:
        """The key's group is gone: what it never advanced ends as abandoned (the broker
        delivers it again)."""
        from opentelemetry.trace import Status, StatusCode

        for opens in list(self._open.values()):
            for opened in list(opens):
                if opened.key != key:
                    continue
                self._forget(opened)
                opened.span.set_attribute("acklane.outcome", "abandoned")
                opened.span.set_status(Status(StatusCode.ERROR, redact(why)))
                opened.span.end()
        for seq in [s for s, found in self._seqs.items() if found[0].key == key]:
            del self._seqs[seq]

    def _forget(self, opened: _Open) -> None:
        ident = id(opened.payload)
        opens = self._open.get(ident)
        if opens is not None:
            if len(opens) == 1 and opens[0] is opened:
                del self._open[ident]
            else:
                opens[:] = [o for o in opens if o is not opened]
                if not opens:
                    del self._open[ident]
        mid = opened.message_id
        if mid is not None and self._by_mid.get((opened.key, mid)) is opened:
            del self._by_mid[(opened.key, mid)]

    # -- sinks

    def stored_context(self, delivery: Delivery) -> SpanContext | None:
        """The span context of the message ``delivery``'s event came from, when this
        process stored it (else None: another process, or before a restart)."""
        return self._stored.get(
            (delivery.watcher, delivery.stream, delivery.message_id, delivery.position)
        )

    def sink_spans(self, sink: Sink, batch: Sequence[Delivery]) -> SinkSpans:
        return _LiveSinkSpans(self, sink, batch)


def sink_spans(sink: Sink, batch: Sequence[Delivery]) -> SinkSpans:
    """The delivery spans of ``batch`` for ``sink``: its own tracer's (``sink.spans_from``),
    free when it has none. Kept for old callers: a sink calls ``delivery_spans``."""
    return sink.delivery_spans(batch)


class _LiveSinkSpans(SinkSpans):
    def __init__(self, tracer: MessageTracer, sink: Sink, batch: Sequence[Delivery]) -> None:
        self.tracer = tracer
        self.sink = sink
        self.batch = batch
        self.spans: list[Span] = []
        self.carriers: list[dict[str, str]] = []
        self.ended = False

    def __enter__(self) -> SinkSpans:
        tracer = self.tracer
        trace = tracer._trace
        for delivery in self.batch:
            parent = tracer.stored_context(delivery)
            context = None
            if parent is not None:
                context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
            span = tracer.tracer.start_span(
                f"deliver {self.sink.name}",
                context=context,
                kind=tracer._kind_producer,
                attributes={
                    "acklane.sink": self.sink.name,
                    "acklane.sink_kind": self.sink.kind,
                    "acklane.event_id": delivery.event_id,
                    "acklane.watcher": delivery.watcher,
                    "acklane.stream_key": delivery.stream,
                    "acklane.message_id": delivery.message_id or "",
                    "acklane.attempt": delivery.attempt,
                    "acklane.batch": len(self.batch),
                },
            )
            carrier: dict[str, str] = {}
            tracer._propagator.inject(carrier, context=trace.set_span_in_context(span))
            self.spans.append(span)
            self.carriers.append(carrier)
        return self

    def carrier(self, index: int = 0) -> Mapping[str, str]:
        return self.carriers[index] if index < len(self.carriers) else _EMPTY

    def current(self, index: int = 0) -> contextlib.AbstractContextManager[object]:
        if index >= len(self.spans):
            return contextlib.nullcontext()
        from opentelemetry.trace import use_span

        return use_span(self.spans[index], end_on_exit=False, record_exception=False)

    def results(self, results: Sequence[BaseException | None]) -> None:
        from opentelemetry.trace import Status, StatusCode

        for span, result in zip(self.spans, results, strict=False):
            if result is None:
                span.set_attribute("acklane.outcome", "delivered")
            else:
                reason = getattr(result, "reason", None) or str(result) or type(result).__name__
                span.set_attribute("acklane.outcome", type(result).__name__)
                span.set_status(Status(StatusCode.ERROR, redact(reason)))
            span.end()
        self.ended = True

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.ended:
            self.results([exc if exc is not None else None] * len(self.spans))
