"""The JSON Schema rules the registry emulator checks (acklane.integration._json_compat)."""

from __future__ import annotations

from typing import Any

import pytest

from acklane.integration._json_compat import incompatibilities


def _object(required: list[str] | None = None, **properties: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required is not None:
        schema["required"] = required
    return schema


INT, NUM, STR = {"type": "integer"}, {"type": "number"}, {"type": "string"}

# (reader, writer, findings: (error type, where in the reader))
CASES: list[tuple[str, Any, Any, list[tuple[str, str]]]] = [
    ("the same schema", _object(["id"], id=STR), _object(["id"], id=STR), []),
    ("integer read as number", NUM, INT, []),
    ("number narrowed to integer", INT, NUM, [("TYPE_NARROWED", "#")]),
    ("a type changed", STR, INT, [("TYPE_CHANGED", "#")]),
    ("a type list widened", {"type": ["string", "null"]}, STR, []),
    ("a type list narrowed", STR, {"type": ["string", "null"]}, [("TYPE_NARROWED", "#")]),
    (
        "a property's type changed",
        _object(id=STR),
        _object(id=INT),
        [("TYPE_CHANGED", "#/properties/id")],
    ),
    (
        "a property newly required",
        _object(["id", "note"], id=STR, note=STR),
        _object(["id"], id=STR, note=STR),
        [("REQUIRED_ATTRIBUTE_ADDED", "#")],
    ),
    (
        "a property newly required, with a default",
        _object(["id", "note"], id=STR, note={"type": "string", "default": ""}),
        _object(["id"], id=STR, note=STR),
        [],
    ),
    ("a property no longer required", _object([], id=STR), _object(["id"], id=STR), []),
    (
        "nested objects",
        _object(inner=_object(["x"], x=INT)),
        _object(inner=_object(x=INT)),
        [("REQUIRED_ATTRIBUTE_ADDED", "#/properties/inner")],
    ),
    (
        "array items",
        {"type": "array", "items": INT},
        {"type": "array", "items": NUM},
        [("TYPE_NARROWED", "#/items")],
    ),
    # what the module does not look into passes
    ("an empty schema reads anything", {}, STR, []),
    ("a reference is not followed", {"$ref": "#/definitions/x"}, STR, []),
    ("a combined schema is not looked into", {"type": "string", "anyOf": [STR]}, INT, []),
    ("required on a non-object is not read", {"type": "string", "required": ["x"]}, STR, []),
]


@pytest.mark.parametrize(
    ("reader", "writer", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_reader_against_writer(reader: Any, writer: Any, expected: list[tuple[str, str]]) -> None:
    assert [(i.kind, i.path) for i in incompatibilities(reader, writer)] == expected


def test_the_message_names_the_property() -> None:
    (found,) = incompatibilities(_object(["note"], note=STR), _object(note=STR))
    assert found.message("new", "old") == (
        "{errorType:'REQUIRED_ATTRIBUTE_ADDED', description:'The new schema requires the "
        "property 'note' at path '#', which the old schema does not require'}"
    )
