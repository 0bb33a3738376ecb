"""SIGINT/SIGTERM while ``acklane run`` starts, before the runner's own handlers.

Importing the CLI's dependencies, loading the configuration (which imports the
connectors and the filter modules) and building the runner take seconds, in which
the default dispositions would kill the process (exit 143) or raise
KeyboardInterrupt. :func:`trap_startup` is the entry point's first act when its
command is ``run``: a signal from then on is remembered and handed to the runner,
which then stops before it starts anything (exit 0); a second one exits at once, with
128 + the signal's number (nothing is in flight yet: nothing is lost).

Importing this module installs nothing; only :meth:`StartupSignals.install` does.
It imports nothing of acklane's and nothing slow: the entry point uses it before
anything else is imported.
"""

from __future__ import annotations

import logging
import signal
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

__all__ = ["StartupSignals", "command_of", "trap_startup"]

if TYPE_CHECKING:
    from collections.abc import Sequence

log = logging.getLogger("acklane.core.cli.app")

#: Options of the top-level app that take a value (skipped to find the command).
_GLOBAL_VALUE_OPTIONS = ("--log-level", "--log-format", "--log-third-party")


class Stoppable(Protocol):
    """What a signal stops: the runner, once it exists."""

    @property
    def stopping(self) -> bool: ...

    def request_stop(self) -> None: ...


class StartupSignals:
    """The start-up handlers of one ``acklane run``: install, hand over, restore."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self.runner: Stoppable | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def install(self) -> None:
        if self._previous:
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        """Put back the handlers that were there before :meth:`install`."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        runner = self.runner
        if runner is not None and not runner.stopping:
            # the runner exists, but its event loop has not taken the signals over yet
            self.received = signal.Signals(signum)
            runner.request_stop()
            return
        if self.received is not None:
            # a second signal during start-up: leave now (nothing is in flight yet)
            log.warning("Second signal during start-up: exiting now")
            raise SystemExit(128 + signum)
        self.received = signal.Signals(signum)

    def hand_over(self, runner: Stoppable) -> None:
        """From now on a signal stops ``runner``; one received already stops it now."""
        self.runner = runner
        if self.received is not None:
            log.info("%s during start-up: stopping before the pipeline starts", self.received.name)
            runner.request_stop()


def command_of(argv: Sequence[str]) -> str | None:
    """The command word of ``acklane [GLOBAL OPTIONS] COMMAND ...``."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _GLOBAL_VALUE_OPTIONS:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def trap_startup(argv: Sequence[str]) -> StartupSignals | None:
    """The installed start-up handlers when ``argv`` runs the pipeline, else None."""
    if command_of(argv) != "run":
        return None
    startup = StartupSignals()
    startup.install()
    return startup
