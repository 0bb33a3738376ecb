"""Can a reader schema read what a writer schema wrote? Avro's schema resolution, as rules.

The Schema Registry emulator's compatibility levels come down to one question asked
one way or both: BACKWARD asks whether the new schema (the reader) reads data the
old one (the writer) wrote, FORWARD the reverse, FULL both. This module answers it
for Avro, following the specification's "Schema Resolution" section and the
checker Confluent's registry runs (Apache Avro's ``SchemaCompatibility``):

- the same primitive type, or a promotion: ``int`` is read as ``long``, ``float``
  or ``double``; ``long`` as ``float`` or ``double``; ``float`` as ``double``;
  ``string`` and ``bytes`` as each other;
- arrays by their items, maps by their values;
- records, enums and fixed need the same unqualified name, or a reader alias
  that is the writer's full name; a fixed also needs the same size;
- a record's reader field is matched to the writer's field of the same name, else
  of one of the reader field's aliases; a reader field with no match needs a
  default (writer fields the reader lacks are skipped);
- every writer enum symbol must be a reader symbol, unless the reader has a
  default symbol;
- a writer union: each of its branches must be readable by the reader; a reader
  union (writer not a union): some branch must read the writer's type.

Logical types are not looked at (they resolve as their underlying type, as in
Avro's checker), nor are field orders, docs and other attributes. Recursive
types are checked once per (reader name, writer name) pair.

Each finding is an :class:`Incompatibility` with Confluent's error type and a
location in the reader's schema, worded as Confluent words it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from acklane.core.errors import AcklaneError

__all__ = ["AvroSchema", "AvroSchemaError", "Incompatibility", "incompatibilities", "parse"]

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
#: reader type -> the writer types it reads besides its own (the specification's promotions)
PROMOTIONS: Mapping[str, frozenset[str]] = {
    "long": frozenset({"int"}),
    "float": frozenset({"int", "long"}),
    "double": frozenset({"int", "long", "float"}),
    "bytes": frozenset({"string"}),
    "string": frozenset({"bytes"}),
}
_NAMED = ("record", "error", "enum", "fixed")


class AvroSchemaError(AcklaneError, ValueError):
    """A schema this module cannot read (no name, a name never defined, ...)."""


# -- parsing: named types by full name, references as names -------------------------------


@dataclass
class AvroSchema:
    """A schema in a normal form: ``root`` with each named type replaced by its full
    name, and ``names``, those types' definitions by full name.

    A node is a primitive's name (``"int"``), a named type's full name, a list (a
    union), or a dict: ``array`` (``items``), ``map`` (``values``), ``record``
    (``name``, ``aliases``, ``fields``: ``name``, ``aliases``, ``type``, ``default``
    when given), ``enum`` (``name``, ``aliases``, ``symbols``, ``default`` when
    given) or ``fixed`` (``name``, ``aliases``, ``size``).
    """

    root: Any
    names: dict[str, dict[str, Any]]

    def resolve(self, node: Any) -> Any:
        """The definition behind a named type's full name, else ``node`` itself."""
        if isinstance(node, str) and node not in PRIMITIVES:
            return self.names[node]
        return node


def _full_name(name: str, namespace: str) -> str:
    if "." in name or not namespace:
        return name.lstrip(".")
    return f"{namespace}.{name}"


def parse(schema: Any, names: Mapping[str, dict[str, Any]] | None = None) -> AvroSchema:
    """``schema`` (parsed JSON) in normal form. ``names``: named types defined elsewhere
    (by referenced schemas) that it may use; they are copied, not changed."""
    known = dict(names or {})
    root = _parse(schema, "", known)
    return AvroSchema(root, known)


def _parse(node: Any, namespace: str, names: dict[str, dict[str, Any]]) -> Any:
    if isinstance(node, list):
        return [_parse(branch, namespace, names) for branch in node]
    if isinstance(node, str):
        if node in PRIMITIVES:
            return node
        for candidate in (_full_name(node, namespace), node):
            if candidate in names:
                return candidate
        raise AvroSchemaError(f"undefined name: {node!r}")
    if not isinstance(node, dict):
        raise AvroSchemaError(f"not a schema: {node!r}")
    kind = node.get("type")
    if isinstance(kind, list | dict):  # {"type": {...}}: the schema inside
        return _parse(kind, namespace, names)
    if not isinstance(kind, str):
        raise AvroSchemaError(f"a schema without a type: {node!r}")
    if kind in PRIMITIVES:  # a logical type resolves as its underlying type
        return kind
    if kind == "array":
        return {"type": "array", "items": _parse(node.get("items"), namespace, names)}
    if kind == "map":
        return {"type": "map", "values": _parse(node.get("values"), namespace, names)}
    if kind not in _NAMED:
        return _parse(kind, namespace, names)  # {"type": "shop.Money"}: a reference
    name = node.get("name")
    if not isinstance(name, str) or not name:
        raise AvroSchemaError(f"a {kind} without a name")
    given = node.get("namespace")
    full = _full_name(name, given if isinstance(given, str) else namespace)
    if full in names:
        raise AvroSchemaError(f"{full!r} is defined twice")
    own = full.rpartition(".")[0]
    aliases = [_full_name(a, own) for a in node.get("aliases") or () if isinstance(a, str)]
    definition: dict[str, Any] = {"type": kind, "name": full, "aliases": aliases}
    names[full] = definition  # before the fields: a record may contain itself
    if kind in ("record", "error"):
        definition["type"] = "record"
        fields = []
        for field in node.get("fields") or ():
            if not isinstance(field, dict) or not isinstance(field.get("name"), str):
                raise AvroSchemaError(f"a field of {full!r} without a name")
            parsed: dict[str, Any] = {
                "name": field["name"],
                "aliases": [a for a in field.get("aliases") or () if isinstance(a, str)],
                "type": _parse(field.get("type"), own, names),
            }
            if "default" in field:
                parsed["default"] = field["default"]
            fields.append(parsed)
        definition["fields"] = fields
    elif kind == "enum":
        definition["symbols"] = [s for s in node.get("symbols") or () if isinstance(s, str)]
        if isinstance(node.get("default"), str):
            definition["default"] = node["default"]
    else:
        definition["size"] = node.get("size")
    return full


# -- checking ---------------------------------------------------------------------------------

_DESCRIPTIONS = {
    "TYPE_MISMATCH": "The type (path '{path}') of a field in the {reader} schema does not "
    "match with the {writer} schema",
    "NAME_MISMATCH": "The name of the schema has changed (path '{path}')",
    "FIXED_SIZE_MISMATCH": "The size of FIXED type field at path '{path}' in the {reader} "
    "schema does not match with the {writer} schema",
    "MISSING_ENUM_SYMBOLS": "The {reader} schema is missing enum symbols '{info}' at path "
    "'{path}' in the {writer} schema",
    "MISSING_UNION_BRANCH": "The {reader} schema is missing a type inside a union field at "
    "path '{path}' in the {writer} schema",
    "READER_FIELD_MISSING_DEFAULT_VALUE": "The field '{info}' at path '{path}' in the {reader} "
    "schema has no default value and is missing in the {writer} schema",
}


@dataclass(frozen=True)
class Incompatibility:
    """Why a reader cannot read a writer's data, at one place of the reader's schema."""

    #: Confluent's (Avro's) error type: one of ``_DESCRIPTIONS``' keys
    kind: str
    #: where in the reader's schema, as a JSON pointer (``/fields/1/type``, ``/`` the root)
    path: str
    #: the detail Confluent calls ``additionalInfo``
    info: str

    def describe(self, reader: str = "reader", writer: str = "writer") -> str:
        """The sentence, with the two schemas called ``reader`` and ``writer``."""
        return _DESCRIPTIONS[self.kind].format(
            path=self.path, info=self.info, reader=reader, writer=writer
        )

    def message(self, reader: str = "reader", writer: str = "writer") -> str:
        """As Confluent's registry lists it (``{errorType:'...', ...}``)."""
        return (
            f"{{errorType:'{self.kind}', description:'{self.describe(reader, writer)}', "
            f"additionalInfo:'{self.info}'}}"
        )


def incompatibilities(reader: AvroSchema, writer: AvroSchema) -> list[Incompatibility]:
    """Every reason ``reader`` cannot read data written with ``writer`` (none: it can)."""
    return _Checker(reader, writer).check(reader.root, writer.root, ())


def _kind(node: Any) -> str:
    if isinstance(node, list):
        return "union"
    if isinstance(node, str):
        return node
    return str(node["type"])


def _is_name(node: Any) -> bool:
    return isinstance(node, str) and node not in PRIMITIVES


def _pointer(path: tuple[str, ...]) -> str:
    return "/" + "/".join(path)


class _Checker:
    def __init__(self, reader: AvroSchema, writer: AvroSchema) -> None:
        self.reader, self.writer = reader, writer
        # (reader name, writer name) -> findings relative to the pair; None while being
        # checked (a recursive type meeting itself is taken as compatible, as Avro does)
        self._pairs: dict[tuple[str, str], list[Incompatibility] | None] = {}

    def check(self, r: Any, w: Any, path: tuple[str, ...]) -> list[Incompatibility]:
        """Reader node ``r`` against writer node ``w`` (nodes as in :class:`AvroSchema`)."""
        if _is_name(r) and _is_name(w):
            key = (r, w)
            if key not in self._pairs:
                self._pairs[key] = None
                self._pairs[key] = self._check(r, w, ())
            found = self._pairs[key]
            return [] if found is None else _moved(found, path)
        return self._check(r, w, path)

    def _check(self, r: Any, w: Any, path: tuple[str, ...]) -> list[Incompatibility]:
        rd, wd = self.reader.resolve(r), self.writer.resolve(w)
        rk, wk = _kind(rd), _kind(wd)
        found: list[Incompatibility] = []
        if wk == "union":  # whichever branch the writer took, the reader must read it
            for index, branch in enumerate(wd):
                found += self.check(r, branch, (*path, str(index)))
            return found
        if rk == wk:
            if rk in PRIMITIVES:
                return []
            if rk == "array":
                return self.check(rd["items"], wd["items"], (*path, "items"))
            if rk == "map":
                return self.check(rd["values"], wd["values"], (*path, "values"))
            found = self._names(rd, wd, path)
            if rk == "fixed" and rd["size"] != wd["size"]:
                info = f"expected: {wd['size']}, found: {rd['size']}"
                found.append(
                    Incompatibility("FIXED_SIZE_MISMATCH", _pointer((*path, "size")), info)
                )
            elif rk == "enum":
                found += self._symbols(rd, wd, path)
            elif rk == "record":
                found += self._fields(rd, wd, path)
            return found
        if rk == "union":  # a writer's single type: some reader branch must read it
            if any(not self.check(branch, w, path) for branch in rd):
                return []
            info = f"reader union lacking writer type: {wk.upper()}"
            return [Incompatibility("MISSING_UNION_BRANCH", _pointer(path), info)]
        if wk in PROMOTIONS.get(rk, ()):
            return []
        info = f"reader type: {rk.upper()} not compatible with writer type: {wk.upper()}"
        return [Incompatibility("TYPE_MISMATCH", _pointer(path), info)]

    def _names(
        self, r: dict[str, Any], w: dict[str, Any], path: tuple[str, ...]
    ) -> list[Incompatibility]:
        if (
            r["name"].rpartition(".")[2] == w["name"].rpartition(".")[2]
            or w["name"] in r["aliases"]
        ):
            return []
        return [
            Incompatibility("NAME_MISMATCH", _pointer((*path, "name")), f"expected: {w['name']}")
        ]

    def _symbols(
        self, r: dict[str, Any], w: dict[str, Any], path: tuple[str, ...]
    ) -> list[Incompatibility]:
        missing = sorted(set(w["symbols"]) - set(r["symbols"]))
        if not missing or r.get("default") in r["symbols"]:
            return []
        info = "[" + ", ".join(missing) + "]"
        return [Incompatibility("MISSING_ENUM_SYMBOLS", _pointer((*path, "symbols")), info)]

    def _fields(
        self, r: dict[str, Any], w: dict[str, Any], path: tuple[str, ...]
    ) -> list[Incompatibility]:
        by_name = {f["name"]: f for f in w["fields"]}
        found: list[Incompatibility] = []
        for index, field in enumerate(r["fields"]):
            at = (*path, "fields", str(index))
            match = by_name.get(field["name"]) or next(
                (by_name[a] for a in field["aliases"] if a in by_name), None
            )
            if match is not None:
                found += self.check(field["type"], match["type"], (*at, "type"))
            elif "default" not in field:
                found.append(
                    Incompatibility(
                        "READER_FIELD_MISSING_DEFAULT_VALUE", _pointer(at), field["name"]
                    )
                )
        return found


def _moved(found: list[Incompatibility], path: tuple[str, ...]) -> list[Incompatibility]:
    """Findings relative to a pair's own root, placed at ``path``."""
    if not path:
        return list(found)
    prefix = _pointer(path)
    return [
        Incompatibility(i.kind, prefix + ("" if i.path == "/" else i.path), i.info) for i in found
    ]
