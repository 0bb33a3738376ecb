"""One argument style: the configuration is every command's first argument.

``acklane run CONFIG``, ``acklane sinks status CONFIG``, ``acklane events list CONFIG``,
``acklane store get CONFIG KEY``: the file comes first, as a plain argument. Commands
that can name their target otherwise (``--url``) take it as an optional one. The old
``--config FILE`` of ``acklane events`` and ``acklane store`` still works, hidden from
--help, with a one-line deprecation note on stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ._exit import USAGE, error, fail

__all__ = [
    "ConfigArg",
    "OldConfigOption",
    "OptionalConfigArg",
    "config_given",
    "split_config",
]

ConfigArg = Annotated[Path, typer.Argument(help="The pipeline's YAML configuration.")]
OptionalConfigArg = Annotated[
    Path | None,
    typer.Argument(
        help="The pipeline's YAML configuration (its store.url), instead of --url.",
        show_default=False,
    ),
]
OldConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", hidden=True, help="Deprecated: give CONFIG as an argument."),
]


def _deprecated_option(config: Path) -> None:
    error(f"--config is deprecated: give {config} as the command's first argument", title="note")


def config_given(argument: Path | None, old_option: Path | None) -> Path | None:
    """The configuration named by the argument, or by the deprecated ``--config``."""
    if old_option is None:
        return argument
    if argument is not None:
        fail("give CONFIG once: as the first argument, not also as --config", USAGE)
    _deprecated_option(old_option)
    return old_option


def split_config(
    words: list[str] | None, names: tuple[str, ...], old_option: Path | None
) -> tuple[Path | None, list[str]]:
    """``[CONFIG] NAMES...``: the configuration (when one more word than ``names`` is
    given, the first; else the deprecated ``--config``) and the words for ``names``."""
    given = list(words or ())
    argument: Path | None = None
    if len(given) == len(names) + 1:
        argument = Path(given.pop(0))
    elif len(given) != len(names):
        fail(f"expected [CONFIG] {' '.join(names)}, got {len(given)} argument(s)", USAGE)
    return config_given(argument, old_option), given
