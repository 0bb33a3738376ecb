"""Commands and demo brokers of other distributions, found through entry points.

``acklane NAME`` of another distribution (acklane-integration: ``acklane emulator``)
is a ``typer.Typer`` registered under :data:`COMMANDS_GROUP`; a demo broker is a
``DemoBroker`` subclass under :data:`DEMO_BROKERS_GROUP`. Neither is imported until
its command runs; a broken one never breaks ``acklane run``, and one of acklane's
own distributions that is not installed says what to install.
"""

from __future__ import annotations

import logging
from functools import cache
from typing import Any

import typer

from ._exit import USAGE, fail

__all__ = [
    "COMMANDS_GROUP",
    "DEMO_BROKERS_GROUP",
    "demo_broker_names",
    "plugin_app",
    "plugin_names",
]

log = logging.getLogger("acklane.core.cli.app")

#: Entry-point groups read here (``acklane.core.cli.demo.ENTRY_POINT_GROUP`` is the first).
DEMO_BROKERS_GROUP = "acklane.demos"  # name -> a DemoBroker subclass, for `acklane demo`
COMMANDS_GROUP = "acklane.commands"  # name -> a typer.Typer, added as `acklane NAME ...`


def _entry_points(group: str) -> Any:
    from importlib.metadata import entry_points

    return entry_points(group=group)


def demo_broker_names() -> list[str]:
    """``--broker`` values: auto, memory and the registered demo brokers (not imported)."""
    registered = {ep.name for ep in _entry_points(DEMO_BROKERS_GROUP)} - {"auto", "memory"}
    return ["auto", "memory", *sorted(registered)]


@cache
def plugin_names() -> tuple[str, ...]:
    """Names of the commands of other distributions (entry points), then of acklane's
    own distributions' commands whose distribution is not installed."""
    from .extras import SIBLING_COMMANDS

    names = [ep.name for ep in _entry_points(COMMANDS_GROUP)]
    return (*dict.fromkeys(names), *(n for n in SIBLING_COMMANDS if n not in names))


def plugin_app(name: str) -> typer.Typer:
    """A Typer holding ``acklane NAME`` of another distribution."""
    holder = typer.Typer()
    for ep in _entry_points(COMMANDS_GROUP):
        if ep.name != name:
            continue
        distribution = ep.dist.metadata["Name"] if ep.dist is not None else ep.value
        try:
            sub = ep.load()
        except Exception as exc:  # a broken plugin must not break `acklane run`
            log.debug("acklane %s (%s) is unavailable", ep.name, ep.value, exc_info=True)
            _add_unavailable(holder, name, distribution, f"{type(exc).__name__}: {exc}")
            return holder
        if isinstance(sub, typer.Typer):
            holder.add_typer(sub, name=name)
            return holder
        log.warning("entry point %s of %s is not a typer.Typer", ep.name, COMMANDS_GROUP)
    # acklane's own distributions' commands, when that distribution is not installed
    from .extras import SIBLING_COMMANDS

    _add_unavailable(holder, name, SIBLING_COMMANDS.get(name, "an acklane distribution"))
    return holder


def _add_unavailable(
    holder: typer.Typer, name: str, distribution: str, problem: str | None = None
) -> None:
    """``acklane NAME ...`` that says what to install (or what broke), not "No such command"."""
    from .extras import missing_command

    def unavailable(ctx: typer.Context) -> None:
        fail(missing_command(name, distribution, problem, ctx.args), USAGE)

    unavailable.__doc__ = f"(not available) {missing_command(name, distribution, problem)}"
    holder.command(
        name,
        add_help_option=False,  # --help too says what to install
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(unavailable)
