"""Loading a configuration file: read it safely, then parse it.

A path is read only if it is a regular file of at most the size limit (a FIFO or
``/dev/zero`` would never end); :func:`load_config` parses all of it,
:func:`load_store_config` only what the commands that open the database need.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from ._errors import ConfigError, ConfigProblem
from ._parse import parse_config, parse_store_config
from ._result import AcklaneConfig, StoreConfig
from ._yaml import MAX_BYTES


def _read_file(path: str | os.PathLike[str]) -> tuple[str, str]:
    """The file's text, read only if it is a regular file of at most :data:`MAX_BYTES`.

    A FIFO would block the reader until someone writes, ``/dev/zero`` never ends:
    the file is opened without blocking and looked at before a byte is read.
    """
    source = os.fspath(path)

    def refused(message: str) -> ConfigError:
        return ConfigError([ConfigProblem(source, None, "", message)])

    try:
        fd = os.open(source, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise refused(f"cannot read the configuration: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as file:
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise refused(
                    "the configuration is not a regular file (a directory, a FIFO or a "
                    "device); give the path of a YAML file"
                )
            data = file.read(MAX_BYTES + 1)
        except OSError as exc:
            raise refused(f"cannot read the configuration: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise refused(f"the configuration is larger than {MAX_BYTES} bytes (the limit)")
    try:
        return source, data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise refused(f"the configuration is not UTF-8 text: {exc}") from None


def load_config(
    path: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    offline_checks: bool = False,
) -> AcklaneConfig:
    """Read and validate a YAML configuration file; raises :class:`ConfigError`.

    Function filters (``function: mypipeline.filters:big_orders``) are imported from
    the configuration file's directory, then the working directory, after the
    standard library and the installed packages (see ``acklane.core._imports``); only once the
    rest of the file is valid. ``offline_checks`` (``acklane validate``): see
    :func:`parse_config`.
    """
    source, text = _read_file(path)
    return parse_config(
        text,
        source=source,
        env=env,
        offline_checks=offline_checks,
        import_roots=(Path(source).resolve().parent, Path.cwd()),
    )


def load_store_config(
    path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None
) -> StoreConfig:
    """Read only the ``store`` and ``state`` sections of a configuration file.

    For the commands that only open the database (``acklane events``, ``acklane
    store``): the streams' variables (a broker's credentials) need not be set, and
    problems elsewhere in the file are not reported. Raises :class:`ConfigError`.
    """
    source, text = _read_file(path)
    return parse_store_config(text, source=source, env=env)
