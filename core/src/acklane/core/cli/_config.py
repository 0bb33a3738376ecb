"""The configuration a command runs on: loaded, or exit 2 with its problems.

Beside the commands that need it (``run``, ``config show``, ``top``), below the
``acklane`` app that gathers them, so that no command module imports the app.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ._console import error

if TYPE_CHECKING:
    from ..config import AcklaneConfig

__all__ = ["load"]

#: The name the command line's own logs have always had (``acklane run``'s lines).
log = logging.getLogger("acklane.core.cli.app")


def load(path: Path) -> AcklaneConfig:
    """The configuration, or exit 2 with its problems; old names of settings are logged
    (WARNING, in the log's format) rather than left to Python's warnings."""
    from ..config import ConfigError, load_config

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            cfg = load_config(path)
    except ConfigError as exc:
        error(str(exc), title="invalid configuration")
        raise typer.Exit(2) from None
    for deprecation in cfg.deprecations:
        log.warning("%s", deprecation)
    for warning in cfg.warnings:  # once, as the file is loaded
        log.warning("%s", warning)
    return cfg
