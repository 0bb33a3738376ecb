"""The ``acklane`` command line's entry point: :func:`main`, and :data:`app`.

:func:`main` takes SIGINT/SIGTERM over for ``acklane run`` first (:mod:`._signals`),
before typer, the configuration or the engine is imported, then runs the
application, which :mod:`._root` defines. Importing this module installs no signal
handler and imports nothing slow; ``app`` (and the other names of ``_root``) are
read from there when first asked for.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ._signals import command_of, trap_startup

if TYPE_CHECKING:
    from ._root import app as app

__all__ = ["app", "command_of", "main"]


def main() -> None:
    startup = trap_startup(sys.argv[1:])
    from ._root import app

    app(obj=startup)


def __getattr__(name: str) -> Any:
    # the application and the names that lived here before it had a module of its own
    if name == "app":
        from ._root import app

        return app
    if name in ("DEMO_BROKERS_GROUP", "COMMANDS_GROUP"):
        from . import _plugins

        return getattr(_plugins, name)
    if name in ("console", "err_console"):
        from rich.console import Console

        return Console(stderr=name == "err_console")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
