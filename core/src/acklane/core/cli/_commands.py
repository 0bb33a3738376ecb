"""The top-level group: every command, each module imported only when its command runs.

Start-up is part of every command (``acklane --version`` is one import of typer and
of the root module): the configuration (pydantic, SQLAlchemy, connectors), rich,
asyncio, importlib.metadata and each command group's module are imported when a
command needs them. :class:`LazyGroup` builds a command of :data:`LAZY` (or of
another distribution, :mod:`._plugins`) when it is first asked for by name: run,
completed, or listed by --help. tests/test_cli_startup.py holds start-up to that.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import typer
from typer.core import TyperGroup

from ._plugins import plugin_app, plugin_names

if TYPE_CHECKING:
    from typer import _click

__all__ = ["LAZY", "LazyGroup", "load_command"]


class LazyGroup(TyperGroup):
    """The commands defined eagerly, then those of :data:`LAZY` and of other
    distributions (entry points ``acklane.commands``), in --help's order."""

    def list_commands(self, ctx: _click.Context) -> list[str]:
        # as typer lists them: the commands, then the groups (each in its order), then
        # other distributions' commands
        here = super().list_commands(ctx)
        groups = [n for n in here if isinstance(self.commands[n], TyperGroup)]
        names = [n for n in here if n not in groups]
        names += [n for n, (group, _) in LAZY.items() if not group]
        names += groups
        names += [n for n, (group, _) in LAZY.items() if group]
        names += [n for n in plugin_names() if n not in names]
        return names

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None:
            command = load_command(cmd_name)
            if command is not None:
                self.add_command(command, cmd_name)
        return command


def _demo_app() -> typer.Typer:
    from ._demo_command import demo_app

    return demo_app()


def _events_app() -> typer.Typer:
    from .events import app as events_app
    from .sinks import replay

    events_app.command("replay")(replay)
    holder = typer.Typer()
    holder.add_typer(events_app, name="events", help="See the trigger events that fired.")
    return holder


def _sinks_app() -> typer.Typer:
    from .sinks import app as sinks_app

    holder = typer.Typer()
    holder.add_typer(sinks_app, name="sinks", help="See and steer the delivery to sinks.")
    return holder


def _store_app() -> typer.Typer:
    from .store import app as store_app

    holder = typer.Typer()
    holder.add_typer(store_app, name="store", help="Read and write the task and asset stores.")
    return holder


def _publish_app() -> typer.Typer:
    from .publish import publish as publish_command

    holder = typer.Typer()
    holder.command("publish")(publish_command)
    return holder


def _dlq_app() -> typer.Typer:
    from .dlq import app as dlq_app

    holder = typer.Typer()
    holder.add_typer(dlq_app, name="dlq")  # its help is the dlq app's own
    return holder


def _top_app() -> typer.Typer:
    from .top import top as top_command

    holder = typer.Typer()
    holder.command("top")(top_command)
    return holder


def _test_app() -> typer.Typer:
    from .pipeline_test import run_tests as test_command

    holder = typer.Typer()
    holder.command("test")(test_command)
    return holder


#: acklane's commands defined outside the root module (or costly to define), in
#: --help's order: name -> (whether it is a group, a function returning a Typer that
#: holds that one command or group under that name), called only when it is asked for.
LAZY: dict[str, tuple[bool, Callable[[], typer.Typer]]] = {
    "demo": (False, _demo_app),
    "top": (False, _top_app),
    "publish": (False, _publish_app),
    "test": (False, _test_app),
    "events": (True, _events_app),
    "sinks": (True, _sinks_app),
    "store": (True, _store_app),
    "dlq": (True, _dlq_app),
}


def load_command(name: str) -> _click.Command | None:
    """The click command ``acklane NAME`` runs, built now; None when there is none."""
    lazy = LAZY.get(name)
    if lazy is not None:
        holder = lazy[1]()
    elif name in plugin_names():
        holder = plugin_app(name)
    else:
        return None
    command: _click.Command = typer.main.get_group(holder).commands[name]
    return command
