"""JSON Schema in a declarative filter: ``schema:`` checks the decoded body before the rules.

``schema:`` is a file (a path, relative to the configuration's directory; JSON, or
YAML for ``.yaml``/``.yml``) or an inline mapping, draft 2020-12 unless the schema's
own ``$schema`` names another draft. It is compiled once, when the configuration is
loaded (a schema that is not valid JSON Schema is a configuration error at its
line); per message one validation runs on the body the rules see, whatever decoded
it. A body that fails is rejected with the failing path and the validator's
message as the reason (``schema: body.amount: "x" is not of type "number"``), or,
with ``on_schema_error: skip``, nothing fires for it and it is not dead-lettered.

The validator is jsonschema-rs (docs/configuration.md says why). ``$ref`` to other
local files is resolved relative to the schema file (or the configuration, for an
inline schema); a ``$ref`` to the network is refused: a running filter never
fetches anything.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = ["ON_SCHEMA_ERROR", "SchemaCheck", "compile_schema"]

#: What a watcher does with a body its schema refuses.
ON_SCHEMA_ERROR: Final = ("reject", "skip")

ProblemPath = tuple[str | int, ...]


def body_path(parts: Sequence[str | int]) -> str:
    """A JSON instance path in the filters' path syntax: ``body.items.0.sku``."""
    return ".".join(["body", *(str(p) for p in parts)])


@dataclass(frozen=True, slots=True)
class SchemaCheck:
    """A compiled schema: :meth:`failure` is None for a body it accepts."""

    validator: Any
    #: True: a refused body fires nothing (``on_schema_error: skip``); else it is rejected.
    skip: bool
    #: Where the schema came from, for messages: a file path, or "inline".
    origin: str

    def failure(self, body: Any) -> str | None:
        """Why ``body`` fails the schema (the first error, its path and message), or None."""
        validator = self.validator
        if validator.is_valid(body):  # the common case: one call, no error objects
            return None
        errors = list(validator.iter_errors(body))
        if not errors:  # pragma: no cover - is_valid and iter_errors agree
            return None
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return f"schema: {body_path(first.instance_path)}: {first.message}{more}"


def _load_document(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        return yaml.safe_load(text)
    return json.loads(text)


def _retrieve(uri: str) -> Any:
    """jsonschema-rs's retriever: local files only; a running filter fetches nothing."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme != "file":
        raise ValueError(
            f"$ref {uri!r}: only local files are read (a schema's $ref to the network is "
            "refused); save the referenced schema beside this one and $ref it by path"
        )
    return _load_document(Path(urllib.request.url2pathname(parts.path)))


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def compile_schema(
    schema: Any,
    on_error: str | None,
    base_dir: Path | None,
    problems: list[tuple[ProblemPath, str]],
) -> SchemaCheck | None:
    """The filter's ``schema:`` compiled, or None (no schema, or problems appended)."""
    if on_error is not None and on_error not in ON_SCHEMA_ERROR:  # pragma: no cover - typed
        problems.append((("on_schema_error",), f"expected one of {', '.join(ON_SCHEMA_ERROR)}"))
        return None
    if schema is None:
        if on_error is not None:
            problems.append((("on_schema_error",), "applies only with a schema: give schema too"))
        return None
    folder = (base_dir or Path.cwd()).resolve()
    if isinstance(schema, str):
        if not schema.strip():
            problems.append((("schema",), "expected a file path or an inline schema mapping"))
            return None
        path = Path(schema).expanduser()
        if not path.is_absolute():
            path = folder / path
        origin = str(path)
        try:
            document = _load_document(path)
        except OSError as exc:
            problems.append((("schema",), f"cannot read {path}: {exc.strerror or exc}"))
            return None
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            problems.append((("schema",), f"{path} is not a JSON document: {exc}"))
            return None
        except Exception as exc:  # yaml.YAMLError
            problems.append((("schema",), f"{path} is not a YAML document: {_first_line(exc)}"))
            return None
        base_uri = path.as_uri()
        at: ProblemPath = ("schema",)
    elif isinstance(schema, Mapping | bool):
        document = dict(schema) if isinstance(schema, Mapping) else schema
        origin = "inline"
        base_uri = (folder / "inline-schema.json").as_uri()
        at = ("schema",)
    else:
        problems.append(
            (("schema",), "expected a file path or an inline schema mapping (JSON Schema)")
        )
        return None
    if not isinstance(document, Mapping | bool):
        problems.append((at, f"{origin}: a JSON Schema is an object (or true/false)"))
        return None
    import jsonschema_rs

    try:
        validator = jsonschema_rs.validator_for(
            document if isinstance(document, bool) else dict(document),
            base_uri=base_uri,
            retriever=_retrieve,
            validate_formats=False,
        )
    except jsonschema_rs.ValidationError as exc:
        # the schema itself breaks the meta-schema: point at the offending field
        where = tuple(exc.instance_path)
        loc: ProblemPath = (*at, *where) if origin == "inline" else at
        inside = "" if origin == "inline" or not where else f" at {'/'.join(map(str, where))}"
        problems.append((loc, f"not a valid JSON Schema{inside}: {exc.message}"))
        return None
    except Exception as exc:  # an unresolvable $ref, a bad regex pattern...
        shown = origin if origin != "inline" else "the schema"
        problems.append((at, f"{shown} cannot be compiled: {_first_line(exc)}"))
        return None
    return SchemaCheck(validator, on_error == "skip", origin)
