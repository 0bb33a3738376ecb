"""``python -m acklane.core.cli``: the `acklane` command."""

from .app import main

main()
