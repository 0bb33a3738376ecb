"""Does a reader JSON Schema accept what a writer JSON Schema accepted? Two of the rules.

Confluent's registry compares JSON Schemas with a long list of rules (open and
closed content models, combined schemas, string and number bounds, ...). This
module checks two of them, the commonest breaking changes, and only where the
two schemas say it plainly; everything else passes unchecked:

- a type narrowed or changed (``TYPE_NARROWED``, ``TYPE_CHANGED``): where both
  schemas give ``type`` (a name or a list of names) and no ``$ref``, ``allOf``,
  ``anyOf``, ``oneOf`` or ``not`` beside it, every type the writer allows must
  be one the reader allows (``integer`` is within ``number``);
- a required property added (``REQUIRED_ATTRIBUTE_ADDED``): where both are
  ``"type": "object"``, a name in the reader's ``required`` that is not in the
  writer's, unless the reader's property schema has a ``default`` (Confluent
  lets that one through).

Both are applied to the root and, recursively, to each property both object
schemas declare under ``properties`` and to the ``items`` of two array schemas
(one schema for every item). A schema without a plain ``type`` (``{}``, ``true``,
a ``$ref``, an ``enum`` alone, ...) is not looked into. A finding names where it
is, as a JSON pointer in the reader's schema (``#/properties/amount``); its words
are acklane's, not Confluent's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["JsonIncompatibility", "incompatibilities"]

_COMBINED = ("$ref", "allOf", "anyOf", "oneOf", "not")


@dataclass(frozen=True)
class JsonIncompatibility:
    """Why data valid under the writer's schema may be invalid under the reader's."""

    kind: str  # TYPE_NARROWED, TYPE_CHANGED or REQUIRED_ATTRIBUTE_ADDED
    path: str  # where in the reader's schema: "#/properties/amount"
    info: str

    def message(self, reader: str = "reader", writer: str = "writer") -> str:
        if self.kind == "REQUIRED_ATTRIBUTE_ADDED":
            text = (
                f"The {reader} schema requires the property '{self.info}' at path "
                f"'{self.path}', which the {writer} schema does not require"
            )
        else:
            text = (
                f"The type at path '{self.path}' in the {reader} schema does not accept "
                f"every type of the {writer} schema ({self.info})"
            )
        return f"{{errorType:'{self.kind}', description:'{text}'}}"


def incompatibilities(reader: Any, writer: Any) -> list[JsonIncompatibility]:
    """What of the two rules ``reader`` breaks against ``writer`` (parsed JSON)."""
    return _check(reader, writer, "#")


def _types(schema: dict[str, Any]) -> set[str] | None:
    given = schema.get("type")
    if any(key in schema for key in _COMBINED):
        return None
    if isinstance(given, str):
        return {given}
    if isinstance(given, list) and given and all(isinstance(t, str) for t in given):
        return set(given)
    return None


def _check(reader: Any, writer: Any, path: str) -> list[JsonIncompatibility]:
    if not isinstance(reader, dict) or not isinstance(writer, dict):
        return []
    r_types, w_types = _types(reader), _types(writer)
    if r_types is None or w_types is None:
        return []  # no plain type on one side: nothing this module says anything about
    r_cover = r_types | ({"integer"} if "number" in r_types else set())
    if not w_types <= r_cover:
        w_cover = w_types | ({"integer"} if "number" in w_types else set())
        kind = "TYPE_NARROWED" if r_types <= w_cover else "TYPE_CHANGED"
        info = f"{', '.join(sorted(r_types))} against {', '.join(sorted(w_types))}"
        return [JsonIncompatibility(kind, path, info)]
    found: list[JsonIncompatibility] = []
    if r_types == w_types == {"object"}:
        r_props, w_props = _mapping(reader, "properties"), _mapping(writer, "properties")
        before = writer.get("required")
        before = set(before) if isinstance(before, list) else set()
        required = reader.get("required")
        for name in required if isinstance(required, list) else ():
            prop = r_props.get(name)
            if name not in before and not (isinstance(prop, dict) and "default" in prop):
                found.append(JsonIncompatibility("REQUIRED_ATTRIBUTE_ADDED", path, str(name)))
        for name, prop in r_props.items():
            if name in w_props:
                found += _check(prop, w_props[name], f"{path}/properties/{name}")
    elif r_types == w_types == {"array"}:
        found += _check(reader.get("items"), writer.get("items"), f"{path}/items")
    return found


def _mapping(schema: dict[str, Any], key: str) -> dict[str, Any]:
    value = schema.get(key)
    return value if isinstance(value, dict) else {}
