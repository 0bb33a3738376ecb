"""``kind: function``: each stored event handed to a Python callable, ``fn(event)``.

``function: mypipeline.sinks:notify`` is found as function filters are: imported
from the configuration file's folder first, then the working directory. It is
called once per event with the :class:`~acklane.core.sinks.Delivery` (``event_id``,
``payload``, ``watcher``, ``stream``, ``message_id``, ``position``, ``created_at``,
``attempt``); its return value is ignored. An ``async def`` function is awaited on
the event loop; a plain one runs in a worker thread (:func:`asyncio.to_thread`), so
that a blocking call cannot stall the engine.

Returning is "delivered". Raising :class:`~acklane.core.sinks.RefusedDelivery`
parks the event for this sink; :class:`~acklane.core.sinks.RetryableDelivery`
retries it (``retry_after=`` seconds, when longer than the backoff); any other
exception retries it too, with its type and message as the reason. See
docs/sinks/function.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Self

from pydantic import Field, model_validator

from ..durations import Duration
from ..pipeline.filters import import_object
from ..redact import redact
from ._base import (
    Delivery,
    DeliveryError,
    RetryableDelivery,
    Sink,
    SinkContext,
    SinkError,
    field_problem,
)
from ._settings import SinkSettings

__all__ = ["FunctionSink", "FunctionSinkSettings"]

log = logging.getLogger("acklane.core.sinks.function")

#: The longest reason kept of an exception's message.
_MAX_REASON: Final = 1000

#: What the function is: plain (called in a thread) or async (awaited).
SinkFunction = Callable[[Delivery], object]


class FunctionSinkSettings(SinkSettings):
    """``kind: function``: the callable, and how long one call may take."""

    kind: Literal["function"]
    #: ``package.module:callable``, called as ``fn(event)`` with a Delivery.
    function: Annotated[str, Field(min_length=1)]
    #: How long one call may take before it counts as failed (retried); none by
    #: default. A plain function's thread cannot be stopped: it runs on, and a retry
    #: may overlap it.
    timeout: Annotated[Duration, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _one_event_per_call(self) -> Self:
        if self.batch_size != 1:
            raise ValueError(
                f"batch_size: a function sink calls its function with one event at a time "
                f"(fn(event)); batch_size must be 1, got {self.batch_size}"
            )
        return self


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _MAX_REASON else line[: _MAX_REASON - 3] + "..."


def _is_async(fn: Callable[..., Any]) -> bool:
    """``async def`` functions, partials of them and objects with an ``async __call__``."""
    call = getattr(fn, "__call__", None)  # noqa: B004 - the method itself is inspected
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def _resolve(path: str, config_dir: Path | None) -> tuple[SinkFunction | None, str | None]:
    """The callable at ``path``, or why not (one line naming ``function``)."""
    if config_dir is not None and str(config_dir) not in sys.path:
        from .._imports import add_import_roots

        add_import_roots(config_dir)
    try:
        fn = import_object(path)
    except ValueError as exc:
        return None, f"function: {exc}"
    if not callable(fn):
        return None, f"function: {path} is a {type(fn).__name__}, not a function"
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        return None, (
            f"function: {path} is a generator; a sink function is called once per event "
            "and returns (fn(event))"
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: trust them
        pass
    else:
        try:
            signature.bind(None)
        except TypeError as exc:
            return None, f"function: {path} cannot be called as fn(event): {exc}"
    function: SinkFunction = fn
    return function, None


class FunctionSink(Sink):
    """Calls the configured function with each event (see the module)."""

    kind = "function"
    settings_model = FunctionSinkSettings

    settings: FunctionSinkSettings

    def __init__(self, settings: SinkSettings, context: SinkContext | None = None) -> None:
        if not isinstance(settings, FunctionSinkSettings):
            raise TypeError(
                f"a function sink takes FunctionSinkSettings, got {type(settings).__name__}"
            )
        super().__init__(settings, context)
        self._function: SinkFunction | None = None
        self._async = False

    @classmethod
    def config_problems(cls, settings: SinkSettings, context: SinkContext) -> list[tuple[str, str]]:
        assert isinstance(settings, FunctionSinkSettings)
        return [field_problem(p) for p in cls.check_config(settings, context.config_dir)]

    @classmethod
    def check_config(cls, settings: FunctionSinkSettings, config_dir: Path | None) -> list[str]:
        """What is wrong with ``function`` (it does not import, it is not a callable that
        takes one event); each problem one line starting with ``function:``.

        Importing runs the module, as loading a function filter does."""
        _, problem = _resolve(settings.function, config_dir)
        return [] if problem is None else [problem]

    @property
    def destination(self) -> str:
        return f"function {self.settings.function}"

    async def open(self) -> None:
        if self._function is not None:
            return
        fn, problem = _resolve(self.settings.function, self.context.config_dir)
        if fn is None:
            raise SinkError(redact(f"sink {self.name!r}: {problem}"))
        self._function = fn
        self._async = _is_async(fn)

    async def check(self) -> None:
        """The function imports and takes one event; it is not called."""
        await self.open()

    async def deliver_one(self, delivery: Delivery) -> None:
        # the function runs in its delivery span's context (a thread copies it): spans
        # it starts with OpenTelemetry are children of it
        with self.delivery_spans((delivery,)) as spans, spans.current(0):
            await self._call(delivery)
            spans.results((None,))

    async def _call(self, delivery: Delivery) -> None:
        await self.open()
        fn = self._function
        assert fn is not None
        timeout = self.settings.timeout
        bound = asyncio.timeout(timeout) if timeout is not None else contextlib.nullcontext()
        try:
            async with bound:
                if self._async:
                    result = fn(delivery)
                else:
                    result = await asyncio.to_thread(fn, delivery)
                if inspect.isawaitable(result):  # a plain callable that returned a coroutine
                    awaitable: Awaitable[object] = result
                    await awaitable
        except DeliveryError:
            raise
        except TimeoutError as exc:
            if isinstance(bound, asyncio.Timeout) and bound.expired():
                raise RetryableDelivery(
                    f"{self.settings.function} did not return within {timeout:g}s (timeout)"
                ) from None
            raise self._retryable(delivery, exc) from None
        except Exception as exc:
            raise self._retryable(delivery, exc) from None

    def _retryable(self, delivery: Delivery, exc: Exception) -> RetryableDelivery:
        log.debug(
            "sink %s: %s raised on event %s",
            self.name,
            self.settings.function,
            delivery.event_id,
            exc_info=exc,
        )
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return RetryableDelivery(redact(_one_line(text)))
