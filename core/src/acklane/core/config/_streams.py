"""``streams:``: each block checked against its connector's settings model.

The connector is found by name (with an install hint for acklane's own extras), old
names of settings are read under their new ones with a warning, and two blocks that
read one upstream must be identical (they share one poll).
"""

from __future__ import annotations

import difflib
from collections.abc import Hashable, Mapping
from typing import Any, Final

from pydantic import BaseModel, ValidationError

from ..connectors import (
    UnknownConnector,
    available_connectors,
    deprecated_names,
    load_connector,
    rename_fields,
)
from ._errors import Loc
from ._messages import _got
from ._models import _NAME_RE, _NAME_RULE
from ._report import _split_mapping_errors
from ._result import StreamConfig
from ._secrets import _secret_fields
from ._sections import _mapping
from ._yaml import _Reader

#: Connectors acklane ships as extras, for the install hint.
_KNOWN_EXTRAS: Final = ("kafka", "sqs", "pubsub", "servicebus")


def _stream_blocks(reader: _Reader, data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    raw = _mapping(reader, data, "streams", required=True)
    if raw is None:
        return {}
    if not raw:
        reader.problem(("streams",), "expected at least one stream (name: {connector: ..., ...})")
    blocks: dict[str, dict[str, Any]] = {}
    for name, block in raw.items():
        if not isinstance(name, str):
            reader.problem(("streams", name), f"stream names are strings, got {_got(name)}")
        elif not isinstance(block, dict):
            reader.problem(
                ("streams", name),
                f"expected a mapping (connector: ..., and its fields), got {_got(block)}",
            )
        else:
            blocks[name] = block
    return blocks


def _streams(reader: _Reader, blocks: Mapping[str, dict[str, Any]]) -> dict[str, StreamConfig]:
    streams: dict[str, StreamConfig] = {}
    by_key: dict[tuple[Hashable, ...], StreamConfig] = {}
    for name, block in blocks.items():
        loc: Loc = ("streams", name)
        if not _NAME_RE.match(name):
            reader.problem(loc, f"stream names are made of {_NAME_RULE}; got {name!r}")
        connector_name = block.get("connector")
        if connector_name is None:
            installed = sorted(available_connectors())
            reader.problem(
                (*loc, "connector"),
                f"required field is missing: the connector that reads stream {name!r} "
                f"(installed: {', '.join(installed) or 'none'})",
            )
            continue
        if not isinstance(connector_name, str):
            reader.problem(
                (*loc, "connector"), f"expected a connector name, got {_got(connector_name)}"
            )
            continue
        try:
            connector = load_connector(connector_name)
        except UnknownConnector:
            installed = sorted(available_connectors())
            hint = difflib.get_close_matches(connector_name, installed, n=1)
            text = f"stream {name!r} uses connector {connector_name!r}, which is not installed"
            text += f"; did you mean {hint[0]!r}?" if hint else ""
            text += f" (installed: {', '.join(installed) or 'none'})"
            if connector_name in _KNOWN_EXTRAS:
                text += f'; install it with: pip install "acklane[{connector_name}]"'
            reader.problem((*loc, "connector"), text)
            continue
        except Exception as exc:
            reader.problem(
                (*loc, "connector"),
                f"stream {name!r}: connector {connector_name!r} could not be loaded: "
                f"{type(exc).__name__}: {exc}",
            )
            continue
        model = connector.config_model
        named = _new_names(reader, model, {k: v for k, v in block.items() if k != "connector"}, loc)
        if named is None:
            continue
        options = named
        reader.secrets.update(
            str(options[field]) for field in _secret_fields(model) if options.get(field)
        )
        try:
            config = model.model_validate(options)
        except ValidationError as exc:
            _split_mapping_errors(reader, exc, model, options, loc, ("connector",))
            continue
        stream = StreamConfig(name, connector_name, connector, config, options, reader.line_of(loc))
        try:
            key = stream.key
            hash(key)
        except Exception as exc:
            reader.problem(
                loc, f"connector {connector_name!r} could not derive a stream key: {exc}"
            )
            continue
        twin = by_key.get(key)
        if twin is not None and twin.config != config:
            reader.problem(
                loc,
                f"reads the same upstream as stream {twin.name!r} (line {twin.line}) with "
                "different settings; they would share one poll with the settings of whichever "
                "starts first: make the two blocks identical or use one stream",
            )
        by_key.setdefault(key, stream)
        streams[name] = stream
    return streams


def _new_names(
    reader: _Reader, model: type[BaseModel], options: dict[str, Any], loc: Loc
) -> dict[str, Any] | None:
    """A stream block with the old names of its settings replaced by the new ones.

    Each old name is warned at its line (it still works); a problem about the new name
    is reported at the old one's line. None after a problem (an old name given with
    its new one).
    """
    if not any(old in options for old in deprecated_names(model)):
        return options
    current: list[str] = []

    def found(old: str, new: str) -> None:
        current[:] = [old]
        reader.deprecated((*loc, old), new)
        line = reader.line_of((*loc, old))
        if line is not None:
            reader.lines.setdefault((*loc, *new.split(".")), line)

    try:
        return rename_fields(model, options, found)
    except ValueError as exc:
        reader.problem((*loc, *current), str(exc))
        return None
