"""``acklane run``: the pipeline, until SIGINT/SIGTERM, then a graceful stop.

Exit 0 when stopped by a signal (also during start-up), 1 when it could not start or
gave up (one ERROR record says why), 2 when the configuration is invalid, 128 + N
when a second signal N cut the start-up or the stop short. The start-up handlers of
:mod:`._signals` come from the entry point (``ctx.obj``), installed before anything
slow was imported; a caller that invokes the app itself gets them installed here.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Annotated

import typer

from ..observe.logs import LogLevel
from ._args import ConfigArg
from ._exit import FAILED
from ._load import load
from ._logging import LogLevelOption, setup_logging
from ._signals import StartupSignals

if TYPE_CHECKING:
    from ..pipeline.runner import Runner

__all__ = ["run"]

log = logging.getLogger("acklane.core.cli.app")


def run(
    ctx: typer.Context,
    config: ConfigArg,
    log_level: LogLevelOption = None,
    no_sinks: Annotated[
        bool,
        typer.Option(
            "--no-sinks",
            help="Store the events but deliver none: `acklane sinks run` does, in its own process.",
        ),
    ] = False,
) -> None:
    """Run the pipeline until SIGINT/SIGTERM, then shut down gracefully."""
    startup = ctx.find_object(StartupSignals) or StartupSignals()
    startup.install()  # first (a no-op when the entry point did it)
    try:
        setup_logging(log_level, LogLevel.INFO)
        log.info("Starting the pipeline of %s", config)
        cfg = load(config)
        import asyncio

        from ..errors import AcklaneError
        from ..observe.metrics import start_metrics_server
        from ..pipeline.runner import Runner

        runner: Runner | None = None
        try:
            runner = Runner(cfg, deliver_sinks=not no_sinks)
            startup.hand_over(runner)
            if cfg.metrics.port is not None and not runner.stopping:
                start_metrics_server(cfg.metrics.port, runner, addr=cfg.metrics.host)
            asyncio.run(runner.run())
        except (asyncio.CancelledError, KeyboardInterrupt):
            if runner is None or runner.forced_by is None:
                raise
            # a second signal cut the graceful stop short: told below
        except Exception as exc:
            # one record (and the traceback at DEBUG), not a screenful on stderr; an
            # error of acklane's own says what is wrong in its message
            why = str(exc) if isinstance(exc, AcklaneError) else f"{type(exc).__name__}: {exc}"
            log.error("acklane run failed: %s", why)
            log.debug("acklane run failed", exc_info=True)
            raise typer.Exit(FAILED) from None
        if runner is not None and runner.forced_by is not None:
            # one line and the conventional code, however the cut-short stop ended
            log.warning("Stopped at once by a second %s", runner.forced_by.name)
            raise typer.Exit(128 + runner.forced_by)
        if runner is not None and runner.failure is not None:
            # the runner gave up (it logged why): exit 1, as for a failure to start
            raise typer.Exit(FAILED)
    finally:
        startup.restore()
