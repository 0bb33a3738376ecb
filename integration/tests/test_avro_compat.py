"""Avro's reader/writer rules (acklane.integration._avro_compat), apart from any server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acklane.integration._avro_compat import (
    AvroSchemaError,
    Incompatibility,
    incompatibilities,
    parse,
)


def _record(*fields: dict[str, Any], name: str = "R", **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": list(fields), **extra}


def _field(name: str, type_: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, **extra}


def _enum(*symbols: str, name: str = "E", **extra: Any) -> dict[str, Any]:
    return {"type": "enum", "name": name, "symbols": list(symbols), **extra}


def _found(reader: Any, writer: Any) -> list[tuple[str, str]]:
    return [(i.kind, i.path) for i in incompatibilities(parse(reader), parse(writer))]


# (reader, writer, what is wrong: (error type, where in the reader) pairs, none if it reads)
CASES: list[tuple[str, Any, Any, list[tuple[str, str]]]] = [
    ("the same primitive", "string", "string", []),
    ("int read as long", "long", "int", []),
    ("int read as float", "float", "int", []),
    ("int read as double", "double", "int", []),
    ("long read as float", "float", "long", []),
    ("long read as double", "double", "long", []),
    ("float read as double", "double", "float", []),
    ("string read as bytes", "bytes", "string", []),
    ("bytes read as string", "string", "bytes", []),
    ("long is not read as int", "int", "long", [("TYPE_MISMATCH", "/")]),
    ("double is not read as float", "float", "double", [("TYPE_MISMATCH", "/")]),
    ("int is not read as string", "string", "int", [("TYPE_MISMATCH", "/")]),
    ("null is not read as boolean", "boolean", "null", [("TYPE_MISMATCH", "/")]),
    (
        "a logical type reads as its type",
        {"type": "long", "logicalType": "timestamp-millis"},
        "long",
        [],
    ),
    (
        "arrays by their items",
        {"type": "array", "items": "long"},
        {"type": "array", "items": "int"},
        [],
    ),
    (
        "array items that do not read",
        {"type": "array", "items": "int"},
        {"type": "array", "items": "long"},
        [("TYPE_MISMATCH", "/items")],
    ),
    (
        "maps by their values",
        {"type": "map", "values": "string"},
        {"type": "map", "values": "int"},
        [("TYPE_MISMATCH", "/values")],
    ),
    (
        "an array is not a map",
        {"type": "map", "values": "int"},
        {"type": "array", "items": "int"},
        [("TYPE_MISMATCH", "/")],
    ),
    (
        "a new field with a default",
        _record(_field("a", "int"), _field("b", "string", default="")),
        _record(_field("a", "int")),
        [],
    ),
    (
        "a new field with a null default",
        _record(_field("b", ["null", "string"], default=None)),
        _record(),
        [],
    ),
    (
        "a new field without a default",
        _record(_field("a", "int"), _field("b", "string")),
        _record(_field("a", "int")),
        [("READER_FIELD_MISSING_DEFAULT_VALUE", "/fields/1")],
    ),
    (
        "a writer field the reader dropped",
        _record(_field("a", "int")),
        _record(_field("a", "int"), _field("b", "string")),
        [],
    ),
    (
        "a field's type changed",
        _record(_field("a", "string")),
        _record(_field("a", "int")),
        [("TYPE_MISMATCH", "/fields/0/type")],
    ),
    ("a field's type promoted", _record(_field("a", "double")), _record(_field("a", "int")), []),
    (
        "a field renamed, with the old name as alias",
        _record(_field("amount", "int", aliases=["total"])),
        _record(_field("total", "int")),
        [],
    ),
    (
        "a field renamed without an alias",
        _record(_field("amount", "int")),
        _record(_field("total", "int")),
        [("READER_FIELD_MISSING_DEFAULT_VALUE", "/fields/0")],
    ),
    (
        "fields in another order",
        _record(_field("b", "int"), _field("a", "string")),
        _record(_field("a", "string"), _field("b", "int")),
        [],
    ),
    ("a record renamed", _record(name="Order"), _record(name="Sale"), [("NAME_MISMATCH", "/name")]),
    (
        "a record renamed with an alias",
        _record(name="Order", aliases=["Sale"]),
        _record(name="Sale"),
        [],
    ),
    (
        "a record's alias in its namespace",
        _record(name="Order", namespace="shop", aliases=["Sale"]),
        _record(name="Sale", namespace="shop"),
        [],
    ),
    (
        "only the unqualified name counts",
        _record(name="Order", namespace="a"),
        _record(name="Order", namespace="b"),
        [],
    ),
    ("a record is not an enum", _record(name="E"), _enum("A"), [("TYPE_MISMATCH", "/")]),
    ("an enum with more symbols", _enum("A", "B", "C"), _enum("A", "B"), []),
    (
        "an enum lost symbols",
        _enum("A"),
        _enum("A", "C", "B"),
        [("MISSING_ENUM_SYMBOLS", "/symbols")],
    ),
    (
        "an enum lost symbols but has a default",
        _enum("A", "UNKNOWN", default="UNKNOWN"),
        _enum("A", "B"),
        [],
    ),
    ("an enum renamed", _enum("A", name="F"), _enum("A"), [("NAME_MISMATCH", "/name")]),
    (
        "fixed of the same size",
        {"type": "fixed", "name": "F", "size": 16},
        {"type": "fixed", "name": "F", "size": 16},
        [],
    ),
    (
        "fixed of another size",
        {"type": "fixed", "name": "F", "size": 8},
        {"type": "fixed", "name": "F", "size": 16},
        [("FIXED_SIZE_MISMATCH", "/size")],
    ),
    (
        "fixed renamed",
        {"type": "fixed", "name": "G", "size": 8},
        {"type": "fixed", "name": "F", "size": 8},
        [("NAME_MISMATCH", "/name")],
    ),
    ("a union reads one of its branches", ["null", "string"], "string", []),
    ("a union reads a promotable type", ["null", "long"], "int", []),
    (
        "a union lacking the writer's type",
        ["null", "string"],
        "int",
        [("MISSING_UNION_BRANCH", "/")],
    ),
    ("a type reads a union of it", "string", ["string"], []),
    ("a type cannot read every branch", "string", ["null", "string"], [("TYPE_MISMATCH", "/0")]),
    ("a union with more branches", ["null", "string", "int"], ["null", "string"], []),
    (
        "a union lost a branch",
        ["null", "string"],
        ["null", "string", "int"],
        [("MISSING_UNION_BRANCH", "/2")],
    ),
    (
        "an optional field became required",
        _record(_field("a", "string")),
        _record(_field("a", ["null", "string"], default=None)),
        [("TYPE_MISMATCH", "/fields/0/type/0")],
    ),
    (
        "a required field became optional",
        _record(_field("a", ["null", "string"], default=None)),
        _record(_field("a", "string")),
        [],
    ),
    (
        "a nested record gained a field without a default",
        _record(_field("inner", _record(_field("x", "int"), _field("y", "int"), name="In"))),
        _record(_field("inner", _record(_field("x", "int"), name="In"))),
        [("READER_FIELD_MISSING_DEFAULT_VALUE", "/fields/0/type/fields/1")],
    ),
]


@pytest.mark.parametrize(
    ("reader", "writer", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_reader_against_writer(reader: Any, writer: Any, expected: list[tuple[str, str]]) -> None:
    assert _found(reader, writer) == expected


def test_named_types_are_used_by_name_and_may_recurse() -> None:
    def node(value: str) -> dict[str, Any]:
        return _record(
            _field("value", value), _field("next", ["null", "Node"], default=None), name="Node"
        )

    assert _found(node("long"), node("int")) == []
    assert _found(node("int"), node("long")) == [("TYPE_MISMATCH", "/fields/0/type")]
    money = {
        "type": "record",
        "name": "Money",
        "namespace": "shop",
        "fields": [_field("cents", "long")],
    }
    twice = _record(
        _field("price", money), _field("cost", "shop.Money"), name="Priced", namespace="shop"
    )
    assert _found(twice, twice) == []
    # the second use of Money is compared as the first is
    cheap = _record(
        _field("price", money), _field("cost", "Money"), name="Priced", namespace="shop"
    )
    assert _found(cheap, twice) == []


def test_names_defined_by_another_schema() -> None:
    money = parse(
        {
            "type": "record",
            "name": "Money",
            "namespace": "shop",
            "fields": [_field("cents", "long")],
        }
    )
    priced = parse(_record(_field("price", "shop.Money"), name="Priced"), money.names)
    assert incompatibilities(priced, priced) == []
    with pytest.raises(AvroSchemaError, match="undefined name"):
        parse(_record(_field("price", "shop.Money"), name="Priced"))


def test_confluents_wording() -> None:
    backward = incompatibilities(
        parse(_record(_field("a", "int"), _field("b", "string"))),
        parse(_record(_field("a", "int"))),
    )
    assert [i.message("new", "old") for i in backward] == [
        "{errorType:'READER_FIELD_MISSING_DEFAULT_VALUE', description:'The field 'b' at path "
        "'/fields/1' in the new schema has no default value and is missing in the old schema', "
        "additionalInfo:'b'}"
    ]
    mismatch = Incompatibility(
        "TYPE_MISMATCH",
        "/fields/0/type",
        "reader type: STRING not compatible with writer type: INT",
    )
    assert mismatch.describe("old", "new") == (
        "The type (path '/fields/0/type') of a field in the old schema does not match with the "
        "new schema"
    )


# -- properties -------------------------------------------------------------------------------

_PRIMITIVE = st.sampled_from(
    ["null", "boolean", "int", "long", "float", "double", "bytes", "string"]
)
_NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)


@st.composite
def _schemas(draw: st.DrawFn, depth: int = 3, taken: set[str] | None = None) -> Any:
    """A valid Avro schema; named types get names no other type of the schema has."""
    taken = set() if taken is None else taken
    kinds = (
        ["primitive"]
        if depth == 0
        else ["primitive", "array", "map", "union", "record", "enum", "fixed"]
    )
    kind = draw(st.sampled_from(kinds))
    if kind == "primitive":
        return draw(_PRIMITIVE)
    if kind == "array":
        return {"type": "array", "items": draw(_schemas(depth - 1, taken))}
    if kind == "map":
        return {"type": "map", "values": draw(_schemas(depth - 1, taken))}
    if kind == "union":  # distinct primitives and named types, no nested union
        branches = draw(st.lists(_PRIMITIVE, min_size=1, max_size=4, unique=True))
        return [*branches, *draw(st.lists(_named(depth - 1, taken), max_size=2))]
    return draw(_named(depth, taken, kind))


@st.composite
def _named(draw: st.DrawFn, depth: int, taken: set[str], kind: str | None = None) -> Any:
    kind = kind or draw(st.sampled_from(["record", "enum", "fixed"]))
    name = draw(_NAME.filter(lambda n: n not in taken))
    taken.add(name)
    named: dict[str, Any] = {"name": name}
    namespace = draw(st.sampled_from([None, "shop", "shop.orders"]))
    if namespace is not None:
        named["namespace"] = namespace
    if kind == "enum":
        symbols = draw(st.lists(_NAME, min_size=1, max_size=4, unique=True))
        return {"type": "enum", **named, "symbols": symbols}
    if kind == "fixed":
        return {"type": "fixed", **named, "size": draw(st.integers(0, 32))}
    names = draw(st.lists(_NAME, max_size=4, unique=True))
    fields = [{"name": n, "type": draw(_schemas(max(depth - 1, 0), taken))} for n in names]
    return {"type": "record", **named, "fields": fields}


@settings(max_examples=200, deadline=None)
@given(_schemas())
def test_every_schema_reads_itself(schema: Any) -> None:
    """FULL against itself (both ways are then the same question)."""
    parsed = parse(schema)
    assert incompatibilities(parsed, parsed) == []


@settings(max_examples=200, deadline=None)
@given(_schemas())
def test_a_schema_and_its_canonical_form_read_each_other(schema: Any) -> None:
    """fastavro's Parsing Canonical Form of a schema (full names everywhere, no
    namespaces, defaults, aliases or docs) is the same schema to a reader, both ways."""
    fastavro = pytest.importorskip("fastavro")
    canonical = json.loads(fastavro.schema.to_parsing_canonical_form(schema))
    assert incompatibilities(parse(schema), parse(canonical)) == []
    assert incompatibilities(parse(canonical), parse(schema)) == []


@settings(max_examples=100, deadline=None)
@given(_schemas(), st.sampled_from(["string", "int", ["null", "long"]]))
def test_a_field_with_a_default_added_is_backward_and_forward(schema: Any, new: Any) -> None:
    old = {"type": "record", "name": "the_wrapper", "fields": [{"name": "value", "type": schema}]}
    default: Any = None if isinstance(new, list) else ("" if new == "string" else 0)
    added = {
        **old,
        "fields": [*old["fields"], {"name": "added_field", "type": new, "default": default}],
    }
    assert incompatibilities(parse(added), parse(old)) == []  # new reads old
    assert incompatibilities(parse(old), parse(added)) == []  # old reads new
