"""``acklane config show``: the configuration as acklane reads it."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated

import typer

from ..observe.redact import redact
from ._args import ConfigArg
from ._load import load

__all__ = ["ShowFormat", "config_app"]


class ShowFormat(StrEnum):
    YAML = "yaml"
    JSON = "json"


config_app = typer.Typer(
    name="config",
    help="Look at a configuration as acklane reads it.",
    no_args_is_help=True,
)


@config_app.command("show")
def config_show(
    config: ConfigArg,
    output: Annotated[
        ShowFormat, typer.Option("--format", case_sensitive=False, help="yaml or json.")
    ] = ShowFormat.YAML,
) -> None:
    """Print the resolved configuration: defaults filled in, ${VAR}s substituted, secrets
    masked as ***."""
    from ..config import config_document

    document = config_document(load(config))
    if output is ShowFormat.JSON:
        text = json.dumps(document, indent=2, ensure_ascii=False)
    else:
        import yaml

        text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True).rstrip("\n")
    typer.echo(redact(text))
