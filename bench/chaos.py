"""The chaos driver from the command line: ``uv run python bench/chaos.py --help``.

The driver itself is ``acklane.integration.chaos`` (the chaos tests import it).
"""

from __future__ import annotations

import sys

from acklane.integration.chaos import main

if __name__ == "__main__":
    sys.exit(main())
