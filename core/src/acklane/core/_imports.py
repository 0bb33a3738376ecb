"""The user's modules: function filters and sinks, state backends, Protobuf classes.

They live beside the configuration (or in the working directory), which the
``acklane`` script's ``sys.path`` does not hold. Those folders are added at the *end*
of ``sys.path``: a ``colorsys.py`` or ``json.py`` beside a pipeline can never replace a
module of the standard library or of an installed package for anyone else's import.
A user's module with such a name would then silently be the other one; it is refused
instead, with an error saying to rename it. The folders stay on the path because a
filter may import its own helpers later, while it runs.

While a configuration is checked for everything else (:func:`held_imports`), importing
a user's module is refused with :data:`HELD`: a file with problems runs none of its code.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from types import ModuleType
from typing import Final

__all__ = ["HELD", "add_import_roots", "held_imports", "import_user_module"]

#: The reason an import was refused while the rest of the file is checked; problems
#: holding it are dropped when the file has other problems, and disappear on the
#: second pass, which imports.
HELD: Final = "(not imported while the rest of the configuration is checked)"

_roots: list[Path] = []
_held: ContextVar[list[str] | None] = ContextVar("acklane_held_imports", default=None)


def add_import_roots(*directories: Path) -> None:
    """Append the directories to ``sys.path``, once each (see the module)."""
    for directory in directories:
        if directory not in _roots:
            _roots.append(directory)
        if str(directory) not in sys.path:
            sys.path.append(str(directory))


@contextmanager
def held_imports() -> Iterator[list[str]]:
    """Within: :func:`import_user_module` refuses; yields the names it refused."""
    refused: list[str] = []
    token = _held.set(refused)
    try:
        yield refused
    finally:
        _held.reset(token)


def import_user_module(name: str) -> ModuleType:
    """``importlib.import_module(name)`` for a module the configuration names.

    Raises ImportError for a module of the user's that another module's name hides
    (and, within :func:`held_imports`, for any module).
    """
    refused = _held.get()
    if refused is not None:
        refused.append(name)
        raise ImportError(f"{name} {HELD}")
    _refuse_hidden(name.partition(".")[0])
    return importlib.import_module(name)


def _refuse_hidden(top: str) -> None:
    """ImportError when a root holds ``top`` but ``top`` is found elsewhere first."""
    mine = [p for root in _roots for p in (root / f"{top}.py", root / top / "__init__.py")]
    mine = [p for p in mine if p.is_file()]
    if not mine:
        return
    spec = importlib.util.find_spec(top)  # a top-level name: nothing is run
    origin = None if spec is None else spec.origin
    if origin is not None and Path(origin).resolve() in {p.resolve() for p in mine}:
        return
    owner = "the standard library's" if top in sys.stdlib_module_names else "an installed"
    where = f" ({origin})" if origin and origin not in ("built-in", "frozen") else ""
    raise ImportError(
        f"{mine[0]} has the name of {owner} module {top!r}{where}, which Python imports "
        f"instead; rename your module (acklane does not let a module beside the "
        "configuration shadow another)"
    )
