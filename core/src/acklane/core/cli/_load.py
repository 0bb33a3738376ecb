"""The one way a command reads its configuration.

A command that needs the whole file (run, sinks, dlq, publish, test, top, config
show) calls :func:`load`; one that needs only the store (events, store) calls
:func:`load_store`, so a broker's unset variables are not its problem. Either exits
with the command's code, naming the file, the line and the field, when the file is
invalid. Old names of settings and the file's warnings are logged once (WARNING, in
the log's format), not left to Python's warnings machinery.
"""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING

from ._exit import USAGE, fail

if TYPE_CHECKING:
    from pathlib import Path

    from ..config import AcklaneConfig, StoreConfig

__all__ = ["INVALID", "load", "load_store", "read"]

log = logging.getLogger("acklane.core.cli")

#: The title of the message that reports an invalid configuration.
INVALID = "invalid configuration"


def read(path: Path, *, offline_checks: bool = False) -> AcklaneConfig:
    """The configuration, or ConfigError; old names of settings are kept in its
    ``deprecations`` rather than raised as FutureWarning (the caller reports them)."""
    from ..config import load_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return load_config(path, offline_checks=offline_checks)


def load(path: Path, *, code: int = USAGE) -> AcklaneConfig:
    """The configuration, or exit ``code`` with its problems."""
    from ..config import ConfigError

    try:
        cfg = read(path)
    except ConfigError as exc:
        fail(str(exc), code, title=INVALID)
    for deprecation in cfg.deprecations:
        log.warning("%s", deprecation)
    for warning in cfg.warnings:
        log.warning("%s", warning)
    return cfg


def load_store(path: Path, *, code: int = USAGE) -> StoreConfig:
    """The ``store`` and ``state`` sections (and ``pipeline:``, the watchers' streams),
    or exit ``code`` with their problems."""
    from ..config import ConfigError, load_store_config

    try:
        return load_store_config(path)
    except ConfigError as exc:
        fail(str(exc), code, title=INVALID)
