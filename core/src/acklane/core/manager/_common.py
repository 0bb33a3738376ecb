"""What every engine module shares: the one logger and closing an upstream iterator.

Every log line of the engine goes to ``acklane.core.manager`` (operators and tests
filter on that name), whichever private module writes it.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("acklane.core.manager")


async def aclose_iter(stream: Any) -> None:
    """Close an async iterator if it can be closed (a generator can; a plain iterator not)."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()
