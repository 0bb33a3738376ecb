"""``acklane top [CONFIG | --url URL]``: a running pipeline's live view, from its metrics.

Every ``--interval`` seconds (default 1) it reads the pipeline's ``/metrics`` and
``/readyz`` (the port of the configuration's ``metrics.port`` on this host, or
``--url``) and redraws, with rich's Live display:

- per stream: its state, messages received per second (over the last interval),
  received, acked, rejected, failed, dead-lettered, its lag (what waits on the
  broker, when its connector can tell) and restarts;
- per watcher: the trigger events it stored, and per second;
- totals: events stored and duplicates dropped, dead letters, and the sinks' lag.

Nothing is written anywhere: it reads what Prometheus would scrape. An endpoint that
does not answer is shown as such and tried again on the next refresh (the pipeline may
be restarting). ``--once`` prints one frame without the live display and exits (1 when
the endpoint did not answer). Ctrl-C leaves.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..observe.redact import redact, redact_url
from ._exit import FAILED, USAGE, fail

if TYPE_CHECKING:  # rich's tables are imported when the command runs, not by `acklane`
    from rich.console import RenderableType

__all__ = ["Sample", "read_sample", "render", "top"]

#: Seconds one read of the endpoint may take.
READ_TIMEOUT = 3.0


@dataclass(slots=True)
class Sample:
    """What one read of the endpoint found."""

    at: float
    ready: bool | None = None
    problems: list[str] = field(default_factory=list)
    #: stream -> its state, from /readyz (or the metrics).
    states: dict[str, str] = field(default_factory=dict)
    #: stream -> outcome (received, acked, rejected, failed) -> count.
    messages: dict[str, dict[str, float]] = field(default_factory=dict)
    restarts: dict[str, float] = field(default_factory=dict)
    lag: dict[str, float] = field(default_factory=dict)
    dead_lettered: dict[str, float] = field(default_factory=dict)
    #: (stream, watcher) -> events stored.
    watcher_events: dict[tuple[str, str], float] = field(default_factory=dict)
    persisted: dict[str, float] = field(default_factory=dict)
    sink_lag: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def _fetch(url: str) -> tuple[int, str]:
    import urllib.error  # here: `acklane`'s start-up does not pay for http.client
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=READ_TIMEOUT) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:  # /readyz answers 503 when not ready
        return int(exc.code), exc.read().decode()


def read_sample(base: str) -> Sample:
    """Read ``/metrics`` and ``/readyz`` of the endpoint at ``base``."""
    from prometheus_client.parser import text_string_to_metric_families

    sample = Sample(at=time.monotonic())
    try:
        _, text = _fetch(f"{base}/metrics")
        status, body = _fetch(f"{base}/readyz")
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        sample.error = f"no answer from {redact_url(base)}: {reason}"
        return sample
    key_streams: dict[str, str] = {}
    try:
        ready = json.loads(body)
    except ValueError:
        ready = {}
    if isinstance(ready, dict):
        sample.ready = status == 200
        sample.problems = [str(p) for p in ready.get("problems", [])]
        for name, entry in (ready.get("streams") or {}).items():
            sample.states[name] = str(entry.get("state", "?"))
            key_streams[str(entry.get("key"))] = name
    dead: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels, value = s.labels, s.value
            name = s.name
            if name == "acklane_stream_messages_total":
                sample.messages.setdefault(labels["stream"], {})[labels["outcome"]] = value
            elif name == "acklane_stream_restarts_total":
                sample.restarts[labels["stream"]] = value
            elif name == "acklane_stream_lag":
                stream = labels["stream"]
                sample.lag[stream] = sample.lag.get(stream, 0.0) + value
            elif name == "acklane_stream_state" and value == 1:
                sample.states.setdefault(labels["stream"], labels["state"])
            elif name == "acklane_watcher_events_total":
                sample.watcher_events[(labels["stream"], labels["watcher"])] = value
            elif name == "acklane_connector_actions_total" and labels["action"] == "dead_lettered":
                dead[key_streams.get(labels["key"], labels["key"])] += value
            elif name == "acklane_events_persisted_total":
                sample.persisted[labels["kind"]] = value
            elif name == "acklane_sink_lag_events":
                sample.sink_lag[labels["sink"]] = value
    sample.dead_lettered = dict(dead)
    return sample


def _rate(now: float, before: float | None, seconds: float) -> str:
    if before is None or seconds <= 0:
        return "-"
    return f"{max(0.0, now - before) / seconds:,.1f}"


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


_STATE_STYLE = {"polling": "green", "restarting": "red", "starting": "yellow", "stopped": "dim"}


def render(url: str, sample: Sample, previous: Sample | None) -> RenderableType:
    """One frame: the header, the streams, the watchers and the totals."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from ._text import cell

    where = redact_url(url)
    if sample.error is not None:
        return Group(
            Text(f"acklane top  {where}", style="bold"),
            cell(redact(sample.error), style="red"),
            Text("(trying again every refresh; Ctrl-C leaves)", style="dim"),
        )
    seconds = 0.0 if previous is None else sample.at - previous.at
    status = (
        Text("ready", style="green")
        if sample.ready
        else Text("not ready", style="red")
        if sample.ready is False
        else Text("?")
    )
    header = Text.assemble(("acklane top  ", "bold"), where, "  ", status)
    streams = Table(title="streams", title_justify="left", expand=False)
    for column in ("stream", "state", "msg/s", "received", "acked", "rejected", "failed"):
        left = column in ("stream", "state")
        streams.add_column(column, justify="left" if left else "right", no_wrap=left)
    for column in ("dead letters", "lag", "restarts"):
        streams.add_column(column, justify="right")
    names = sorted({*sample.messages, *sample.states})
    for name in names:
        counts = sample.messages.get(name, {})
        before = None if previous is None else previous.messages.get(name, {}).get("received")
        state = sample.states.get(name, "?")
        streams.add_row(  # names and states as the service answered them: anyone's text
            cell(name),
            cell(state, style=_STATE_STYLE.get(state, "")),
            _rate(counts.get("received", 0.0), before, seconds),
            _n(counts.get("received")),
            _n(counts.get("acked")),
            _n(counts.get("rejected")),
            _n(counts.get("failed")),
            _n(sample.dead_lettered.get(name)),
            _n(sample.lag.get(name)),
            _n(sample.restarts.get(name)),
        )
    watchers = Table(title="watchers", title_justify="left")
    for column in ("watcher", "stream", "events", "events/s"):
        left = column in ("watcher", "stream")
        watchers.add_column(column, justify="left" if left else "right", no_wrap=left)
    for (stream, watcher), value in sorted(sample.watcher_events.items(), key=lambda i: i[0][::-1]):
        before = None if previous is None else previous.watcher_events.get((stream, watcher))
        watchers.add_row(cell(watcher), cell(stream), _n(value), _rate(value, before, seconds))
    totals = Text.assemble(
        ("totals  ", "bold"),
        f"events stored {_n(sample.persisted.get('inserted', 0.0))}",
        f"  duplicates dropped {_n(sample.persisted.get('duplicate', 0.0))}",
        f"  dead letters {_n(sum(sample.dead_lettered.values()))}",
        f"  lag {_n(sum(sample.lag.values())) if sample.lag else '-'}",
    )
    if sample.sink_lag:
        totals.append(f"  sinks' lag {_n(sum(sample.sink_lag.values()))}")
    parts: list[RenderableType] = [header, streams, watchers, totals]
    for problem in sample.problems:
        parts.append(cell(f"! {redact(problem)}", style="red"))
    return Group(*parts)


def _base_url(config: Path | None, url: str | None) -> str:
    if url is not None:
        if config is not None:
            fail("give CONFIG or --url, not both", USAGE)
        if not url.startswith(("http://", "https://")):
            fail(f"{redact_url(url)}: expected http://host:port", USAGE)
        return url.rstrip("/")
    if config is None:
        fail("give the pipeline's CONFIG (its metrics.port) or --url", USAGE)
    from ._load import load

    port = load(config).metrics.port
    if port is None:
        fail(
            f"{config}: metrics.port is not set (the pipeline serves no metrics); "
            "set it, or give --url",
            USAGE,
        )
    return f"http://127.0.0.1:{port}"


def top(
    config: Annotated[
        Path | None,
        typer.Argument(help="The pipeline's YAML configuration: its metrics.port, on this host."),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option("--url", help="The metrics endpoint, http://host:port (instead of CONFIG)."),
    ] = None,
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between two refreshes.")] = 1.0,
    once: Annotated[
        bool, typer.Option("--once", help="Print one frame and exit (1: no answer).")
    ] = False,
) -> None:
    """Show a running pipeline's streams, watchers and totals, refreshed live."""
    from rich.console import Console

    base = _base_url(config, url)
    console = Console(highlight=False)
    if once:
        first = read_sample(base)
        if first.error is None:  # a rate needs two reads
            time.sleep(min(interval, 1.0))
            second = read_sample(base)
            console.print(render(base, second, first))
            raise typer.Exit(0 if second.error is None else FAILED)
        console.print(render(base, first, None))
        raise typer.Exit(FAILED)
    from rich.live import Live

    previous: Sample | None = None
    try:
        with Live(console=console, auto_refresh=False, screen=False) as live:
            while True:
                sample = read_sample(base)
                live.update(render(base, sample, previous), refresh=True)
                if sample.error is None:
                    previous = sample
                time.sleep(interval)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
