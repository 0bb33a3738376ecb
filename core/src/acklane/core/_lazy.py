"""Names of a package imported from their module when first asked for (PEP 562).

For packages whose light parts the configuration's validation needs (``acklane
validate`` must start at once) beside heavy ones that import SQLAlchemy.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, modules: Mapping[str, Iterable[str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports each name of ``modules``
    (submodule -> names) on first use, and keeps it in the package's namespace."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(importlib.import_module(package), name, value)
        return value

    return __getattr__
