"""``kind: function``: the callable gets each event (sync in a thread, async on the loop),
its exceptions are retryable with their reason, RefusedDelivery parks, and a path that
does not lead to a one-argument callable is a clear configuration problem."""

from __future__ import annotations

import importlib
import sys
import textwrap
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from acklane.core.observe.redact import forget_all, remember
from acklane.core.sinks import (
    Delivery,
    RefusedDelivery,
    RetryableDelivery,
    SinkContext,
    SinkError,
    sink_class,
)
from acklane.core.sinks.function import FunctionSink, FunctionSinkSettings

SINKS = textwrap.dedent(
    """
    import asyncio
    import threading

    from acklane.core.sinks import RefusedDelivery, RetryableDelivery

    GOT = []

    def record(event):
        GOT.append((event.event_id, event.payload, threading.current_thread().name))

    async def record_async(event):
        await asyncio.sleep(0)
        GOT.append((event.event_id, event.payload, threading.current_thread().name))

    def broken(event):
        raise KeyError("customer " + str(event.payload["id"]) + " unknown")

    def refuse(event):
        raise RefusedDelivery("order " + str(event.payload["id"]) + " was cancelled")

    async def later(event):
        raise RetryableDelivery("the service is in maintenance", retry_after=120)

    async def slow(event):
        await asyncio.sleep(30)

    def leak(event):
        raise RuntimeError("login refused for token planted-secret-42")

    def two_args(event, extra):
        return None

    async def stream(events):
        yield None

    NOT_CALLABLE = 3
    """
)


@pytest.fixture
def sinks_module(write_module: Callable[..., str]) -> str:
    """A module of sink functions in the configuration's folder (not on sys.path: the sink
    adds the folder)."""
    return write_module("sinks", SINKS, importable=False)


def _delivery(payload: Any, event_id: str = "ev_0123456789abcdef0123456789abcdef") -> Delivery:
    return Delivery(
        event_id=event_id,
        store_id=7,
        watcher="orders",
        stream="acklane memory orders",
        message_id="memory:1/orders/0/7",
        position=0,
        payload=payload,
        created_at=datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
    )


def _sink(function: str, config_dir: Path, **fields: Any) -> FunctionSink:
    settings = FunctionSinkSettings.model_validate(
        {"name": "notify", "kind": "function", "function": function, **fields}
    )
    return FunctionSink(settings, SinkContext(config_dir=config_dir))


def _got(module: str) -> list[tuple[str, Any, str]]:
    got: list[tuple[str, Any, str]] = importlib.import_module(module).GOT
    return got


def test_the_registry_names_the_function_sink() -> None:
    assert sink_class("function") is FunctionSink


async def test_a_sync_function_gets_each_event_in_a_worker_thread(
    sinks_module: str, tmp_path: Path
) -> None:
    async with _sink(f"{sinks_module}:record", tmp_path) as sink:
        results = await sink.deliver([_delivery({"id": 1})])
        assert results == [None]
        await sink.deliver_one(_delivery({"id": 2}, event_id="ev_" + "2" * 32))
    got = _got(sinks_module)
    assert [(e, p) for e, p, _ in got] == [
        ("ev_0123456789abcdef0123456789abcdef", {"id": 1}),
        ("ev_" + "2" * 32, {"id": 2}),
    ]
    assert all(thread != threading.current_thread().name for _, _, thread in got)


async def test_an_async_function_is_awaited_on_the_event_loop(
    sinks_module: str, tmp_path: Path
) -> None:
    async with _sink(f"{sinks_module}:record_async", tmp_path) as sink:
        assert await sink.deliver([_delivery({"id": 3})]) == [None]
    [(event_id, payload, thread)] = _got(sinks_module)
    assert (event_id, payload) == ("ev_0123456789abcdef0123456789abcdef", {"id": 3})
    assert thread == threading.current_thread().name


async def test_an_exception_is_retryable_with_its_type_and_message(
    sinks_module: str, tmp_path: Path
) -> None:
    async with _sink(f"{sinks_module}:broken", tmp_path) as sink:
        [result] = await sink.deliver([_delivery({"id": 9})])
    assert isinstance(result, RetryableDelivery)
    assert result.reason == "KeyError: 'customer 9 unknown'"


async def test_refused_delivery_raised_by_the_function_parks_the_event(
    sinks_module: str, tmp_path: Path
) -> None:
    async with _sink(f"{sinks_module}:refuse", tmp_path) as sink:
        [result] = await sink.deliver([_delivery({"id": 4})])
    assert isinstance(result, RefusedDelivery)
    assert result.reason == "order 4 was cancelled"


async def test_retryable_delivery_raised_by_the_function_keeps_its_retry_after(
    sinks_module: str, tmp_path: Path
) -> None:
    async with _sink(f"{sinks_module}:later", tmp_path) as sink:
        [result] = await sink.deliver([_delivery({"id": 5})])
    assert isinstance(result, RetryableDelivery)
    assert (result.reason, result.retry_after) == ("the service is in maintenance", 120)


async def test_a_call_longer_than_the_timeout_is_retryable(
    sinks_module: str, tmp_path: Path
) -> None:
    async with _sink(f"{sinks_module}:slow", tmp_path, timeout=0.05) as sink:
        [result] = await sink.deliver([_delivery({"id": 6})])
    assert isinstance(result, RetryableDelivery)
    assert result.reason == f"{sinks_module}:slow did not return within 0.05s (timeout)"


async def test_a_known_secret_in_an_exception_never_reaches_the_reason(
    sinks_module: str, tmp_path: Path
) -> None:
    remember(["planted-secret-42"])
    try:
        async with _sink(f"{sinks_module}:leak", tmp_path) as sink:
            [result] = await sink.deliver([_delivery({"id": 7})])
    finally:
        forget_all()
    assert isinstance(result, RetryableDelivery)
    assert "planted-secret-42" not in result.reason
    assert result.reason.startswith("RuntimeError: login refused for token ")


def test_the_function_is_found_in_the_configurations_folder(
    sinks_module: str, tmp_path: Path
) -> None:
    settings = FunctionSinkSettings.model_validate(
        {"name": "notify", "kind": "function", "function": f"{sinks_module}:record"}
    )
    assert str(tmp_path) not in sys.path
    assert FunctionSink.check_config(settings, tmp_path) == []
    assert sys.path[-1] == str(tmp_path)  # after the standard library and installed packages


@pytest.mark.parametrize(
    ("function", "problem"),
    [
        ("no_such_module_xyz:fn", "function: cannot import module 'no_such_module_xyz'"),
        ("{module}:missing", "function: module '{module}' has no attribute 'missing'"),
        ("{module}:NOT_CALLABLE", "function: {module}:NOT_CALLABLE is a int, not a function"),
        ("{module}:two_args", "function: {module}:two_args cannot be called as fn(event)"),
        ("{module}:stream", "function: {module}:stream is a generator"),
        ("no-colon", "function: 'no-colon' is not an import path"),
    ],
)
def test_a_bad_function_path_is_a_clear_configuration_problem(
    sinks_module: str, tmp_path: Path, function: str, problem: str
) -> None:
    settings = FunctionSinkSettings.model_validate(
        {"name": "notify", "kind": "function", "function": function.format(module=sinks_module)}
    )
    [found] = FunctionSink.check_config(settings, tmp_path)
    assert found.startswith(problem.format(module=sinks_module)), found


async def test_opening_a_sink_whose_function_does_not_import_names_it(tmp_path: Path) -> None:
    sink = _sink("no_such_module_xyz:fn", tmp_path)
    with pytest.raises(SinkError, match="sink 'notify': function: cannot import module"):
        await sink.check()


def test_batch_size_above_one_is_refused_with_the_reason() -> None:
    with pytest.raises(ValidationError, match="calls its function with one event at a time"):
        FunctionSinkSettings.model_validate(
            {"name": "notify", "kind": "function", "function": "m:f", "batch_size": 10}
        )
