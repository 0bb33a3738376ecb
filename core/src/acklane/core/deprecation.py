"""Old names of renamed public classes, still importable for a while, with a warning.

A package that renamed a class keeps its old name importable through a module
``__getattr__`` (PEP 562) made here: ``from acklane.connectors.servicebus import
ServiceBusTrigger`` still gives the class (the same object as its new name,
so ``isinstance`` and subclassing keep working) and warns, once per place, with a
:class:`DeprecationWarning` that names the new name.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["old_names"]


def old_names(module: str, renamed: Mapping[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module`` that answers each old name of
    ``renamed`` (old name -> the object now under its new name) with a warning."""

    def __getattr__(name: str) -> Any:
        try:
            new = renamed[name]
        except KeyError:
            raise AttributeError(f"module {module!r} has no attribute {name!r}") from None
        warnings.warn(
            f"{module}.{name} is deprecated, now called {new.__name__}; the old name still "
            "works for now",
            DeprecationWarning,
            stacklevel=2,
        )
        return new

    return __getattr__
