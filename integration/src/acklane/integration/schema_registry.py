"""A Schema Registry emulator: the part of Confluent's REST API that clients use.

``LOCAL`` runs this module's aiohttp server (``python -m
acklane.integration.schema_registry --port P [--user NAME:PASSWORD]``) in a process
of its own; ``DOCKER`` runs Confluent's image ``confluentinc/cp-schema-registry``
beside an ``apache/kafka`` container (the registry keeps its schemas in a Kafka
topic). confluent-kafka's ``SchemaRegistryClient``, serializers and deserializers
use the local one unchanged.

What the server answers (state in memory, lost when it stops):

- ``GET /subjects``, ``GET /subjects/{s}/versions``, ``GET
  /subjects/{s}/versions/{v}`` (``v``: a number, ``latest`` or ``-1``), ``GET
  /subjects/{s}/versions/{v}/schema``, ``GET /subjects/{s}/versions/{v}/referencedby``;
- ``POST /subjects/{s}/versions`` (register: the same schema under a subject gets
  its id and version back, the same schema under another subject the same id),
  ``POST /subjects/{s}`` (look a schema up);
- ``DELETE /subjects/{s}`` and ``DELETE /subjects/{s}/versions/{v}`` (soft, then
  ``?permanent=true``);
- ``GET /schemas/ids/{id}`` (with ``/subjects``, ``/versions``, ``/schema``), ``GET
  /schemas/types``;
- ``GET|PUT|DELETE /config`` and ``/config/{s}`` (the compatibility level, global and
  per subject; enforced, see below), ``GET /mode``;
- ``POST /compatibility/subjects/{s}/versions/{v}`` (``v``: a number or ``latest``)
  and ``POST /compatibility/subjects/{s}/versions``: ``{"is_compatible": ...}``, with
  ``messages`` when ``?verbose=true``;
- HTTP basic authentication when started with ``--user``.

Schemas are checked when registered: Avro by fastavro (when installed, references
resolved), JSON Schema as JSON, Protobuf as given. Two schemas are the same when
their JSON is equal (Avro, JSON Schema) or their text is (Protobuf). Protobuf
schemas are returned as they were registered: confluent-kafka's serializer registers
the base64 ``FileDescriptorProto`` its deserializer asks for (``format=serialized``);
``.proto`` text registered by another tool is returned as text.

Compatibility: a new schema under a subject is held to the subject's level (its own,
else the global one, ``BACKWARD`` by default) against the subject's versions not
deleted: the latest one, or with a ``*_TRANSITIVE`` level every one, latest first.
``BACKWARD``: the new schema reads what the old one wrote; ``FORWARD``: the old reads
the new's; ``FULL``: both; ``NONE``: nothing is checked. A schema breaking it is
refused with HTTP 409 and error code 409, in Confluent's words (``Schema being
registered is incompatible with an earlier schema for subject "s", details: [...]``:
the findings, then the version, its schema and the level). The
``/compatibility`` endpoints ask the same question without registering (the one
with a version compares with that version only). What is compared:

- a schema of another type than the old version's is incompatible;
- Avro: the specification's schema resolution, as Confluent's checker applies it
  (:mod:`._avro_compat`: promotions, records and field defaults and aliases, enums,
  fixed, unions, named types, references resolved);
- JSON Schema: two of Confluent's rules only (:mod:`._json_compat`: a type narrowed
  or changed, a property newly required without a default); its other rules (open
  and closed content models, bounds, combined schemas, ``$ref``) are not applied;
- Protobuf: three of Confluent's rules (:mod:`._protobuf_compat`: a field number
  whose kind, scalar encoding group or message type changed), on schemas given as a
  serialized descriptor (what confluent-kafka registers) with ``protobuf``
  installed; ``.proto`` text is not checked, nor are the other rules.

Not emulated: modes other than READWRITE, contexts, schema GUIDs, metadata and rule
sets (accepted and dropped), ``normalize`` (accepted and ignored).
"""

from __future__ import annotations

import argparse
import base64
import hmac
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from aiohttp import web

from acklane.core.errors import AcklaneError

from ._avro_compat import AvroSchema, AvroSchemaError
from ._avro_compat import incompatibilities as avro_incompatibilities
from ._avro_compat import parse as parse_avro
from ._container import ContainerEmulator, ContainerSpec
from ._json_compat import incompatibilities as json_incompatibilities
from ._protobuf_compat import incompatibilities as protobuf_incompatibilities
from ._protobuf_compat import parse as parse_protobuf
from .emulator import (
    EmulatorError,
    LocalProcessEmulator,
    free_port,
    require_free_port,
    wait_for_port,
)

__all__ = [
    "DOCKER",
    "LOCAL",
    "ConfluentSchemaRegistry",
    "LocalSchemaRegistry",
    "Registry",
    "RegistryError",
    "main",
    "make_app",
]

REGISTRY_IMAGE = "confluentinc/cp-schema-registry:7.9.1"
KAFKA_IMAGE = "apache/kafka:3.9.1"
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
TYPES = ("AVRO", "JSON", "PROTOBUF")
LEVELS = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)
DEFAULT_LEVEL = "BACKWARD"


class RegistryError(AcklaneError):
    """An error answer: HTTP status, Confluent's error code and message."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _subject_not_found(subject: str) -> RegistryError:
    return RegistryError(404, 40401, f"Subject '{subject}' not found.")


@dataclass
class _Schema:
    id: int
    type: str
    text: str
    references: list[dict[str, Any]]
    #: What two registrations are compared by.
    identity: tuple[str, str, str]


@dataclass
class _Version:
    version: int
    schema: _Schema
    deleted: bool = False


@dataclass
class Registry:
    """The registry's state and rules, apart from HTTP."""

    schemas: dict[int, _Schema] = field(default_factory=dict)
    subjects: dict[str, list[_Version]] = field(default_factory=dict)
    levels: dict[str, str] = field(default_factory=dict)
    level: str = DEFAULT_LEVEL

    # -- reading

    def _versions(self, subject: str, deleted: bool = False) -> list[_Version]:
        versions = [v for v in self.subjects.get(subject, ()) if deleted or not v.deleted]
        if not versions:
            raise _subject_not_found(subject)
        return versions

    def version(self, subject: str, version: str, deleted: bool = False) -> _Version:
        versions = self._versions(subject, deleted)
        if version in ("latest", "-1"):
            return versions[-1]
        number = self.version_number(version)
        for v in versions:
            if v.version == number:
                return v
        raise RegistryError(404, 40402, f"Version {number} not found.")

    @staticmethod
    def version_number(version: str) -> int:
        """A version id given as text (not ``latest``): 42202 unless a number from 1."""
        try:
            number = int(version)
        except ValueError:
            number = 0
        if number < 1:
            raise RegistryError(
                422, 42202, f"The specified version '{version}' is not a valid version id."
            )
        return number

    def schema(self, schema_id: int) -> _Schema:
        found = self.schemas.get(schema_id)
        if found is None:
            raise RegistryError(404, 40403, f"Schema {schema_id} not found")
        return found

    def subject_names(self, deleted: bool = False, prefix: str = "") -> list[str]:
        return sorted(
            s
            for s, versions in self.subjects.items()
            if s.startswith(prefix) and any(deleted or not v.deleted for v in versions)
        )

    def uses(self, schema_id: int, deleted: bool = False) -> list[tuple[str, int]]:
        return [
            (subject, v.version)
            for subject, versions in sorted(self.subjects.items())
            for v in versions
            if v.schema.id == schema_id and (deleted or not v.deleted)
        ]

    def referenced_by(self, subject: str, version: int) -> list[int]:
        return sorted(
            s.id
            for s in self.schemas.values()
            if any(
                r.get("subject") == subject and r.get("version") == version for r in s.references
            )
            and self.uses(s.id)
        )

    # -- writing

    def _parse(self, body: Any) -> tuple[str, str, list[dict[str, Any]]]:
        if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
            raise RegistryError(422, 42201, "Invalid schema: expected an object with a 'schema'")
        kind = str(body.get("schemaType") or "AVRO").upper()
        if kind not in TYPES:
            raise RegistryError(422, 42201, f"Invalid schema type {kind!r}")
        references = body.get("references") or []
        if not isinstance(references, list) or not all(
            isinstance(r, dict) and {"name", "subject", "version"} <= r.keys() for r in references
        ):
            raise RegistryError(
                422, 42201, "Invalid schema: references need a name, a subject and a version"
            )
        refs: list[dict[str, Any]] = [
            {"name": str(r["name"]), "subject": str(r["subject"]), "version": int(r["version"])}
            for r in references
        ]
        for ref in refs:
            self.version(ref["subject"], str(ref["version"]))  # 404 if it names nothing
        return kind, body["schema"], refs

    def _identity(self, kind: str, text: str, refs: list[dict[str, Any]]) -> tuple[str, str, str]:
        if kind == "PROTOBUF":
            canonical = " ".join(text.split())
        else:
            try:
                canonical = json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
            except ValueError as exc:
                raise RegistryError(422, 42201, f"Invalid schema: not JSON: {exc}") from None
        return kind, canonical, json.dumps(refs, sort_keys=True)

    def _check(self, kind: str, text: str, refs: list[dict[str, Any]]) -> None:
        if kind == "PROTOBUF":
            if not text.strip():
                raise RegistryError(422, 42201, "Invalid schema: empty")
            return
        parsed = json.loads(text)  # _identity parsed it already
        if kind == "JSON":
            if not isinstance(parsed, dict | bool):
                raise RegistryError(422, 42201, "Invalid schema: a JSON Schema is an object")
            return
        try:
            import fastavro
        except ImportError:
            return
        named: dict[str, Any] = {}
        try:
            for ref in refs:
                referenced = self.version(ref["subject"], str(ref["version"])).schema
                fastavro.parse_schema(json.loads(referenced.text), named_schemas=named)
            fastavro.parse_schema(parsed, named_schemas=named)
        except Exception as exc:
            raise RegistryError(422, 42201, f"Invalid schema: {exc}") from None

    def register(self, subject: str, body: Any) -> _Schema:
        kind, text, refs = self._parse(body)
        identity = self._identity(kind, text, refs)
        versions = self.subjects.setdefault(subject, [])
        for v in versions:
            if not v.deleted and v.schema.identity == identity:
                return v.schema
        self._check(kind, text, refs)
        live = [v for v in versions if not v.deleted]
        messages = self.incompatibilities(kind, text, refs, live, self.level_of(subject))
        if messages:
            raise RegistryError(
                409,
                409,
                "Schema being registered is incompatible with an earlier schema for subject "
                f'"{subject}", details: [{", ".join(messages)}]',
            )
        schema = next((s for s in self.schemas.values() if s.identity == identity), None)
        if schema is None:
            schema = _Schema(max(self.schemas, default=0) + 1, kind, text, refs, identity)
            self.schemas[schema.id] = schema
        number = max((v.version for v in versions), default=0) + 1
        versions.append(_Version(number, schema))
        return schema

    # -- compatibility

    def level_of(self, subject: str) -> str:
        """The level a subject's registrations are held to: its own, else the global one."""
        return self.levels.get(subject, self.level)

    def incompatibilities(
        self,
        kind: str,
        text: str,
        refs: list[dict[str, Any]],
        against: Sequence[_Version],
        level: str,
    ) -> list[str]:
        """Why the schema breaks ``level`` against the versions ``against`` (oldest
        first), in Confluent's words; empty when it does not.

        A transitive level compares with every one of ``against``, latest first, the
        others with the latest only; the first version it breaks with is reported
        (its findings, then its version, its text and the level, as Confluent does).
        """
        if level == "NONE" or not against:
            return []
        candidates = against if level.endswith("_TRANSITIVE") else against[-1:]
        for old in reversed(candidates):
            found = self._compare(kind, text, refs, old.schema, level.removesuffix("_TRANSITIVE"))
            if found:
                return [
                    *found,
                    f"{{oldSchemaVersion: {old.version}}}",
                    f"{{oldSchema: '{old.schema.text}'}}",
                    f"{{validateFields: 'false', compatibility: '{level}'}}",
                ]
        return []

    def _compare(
        self, kind: str, text: str, refs: list[dict[str, Any]], old: _Schema, level: str
    ) -> list[str]:
        """``level`` (BACKWARD, FORWARD or FULL) between a new schema and an old one."""
        if kind != old.type:
            return ["Incompatible because of different schema type"]
        found: list[str] = []
        if kind == "AVRO":
            new, previous = self._avro(text, refs), self._avro(old.text, old.references)
            if level in ("FORWARD", "FULL"):  # the old schema reads the new one's data
                found += [i.message("old", "new") for i in avro_incompatibilities(previous, new)]
            if level in ("BACKWARD", "FULL"):  # the new schema reads the old one's data
                found += [i.message("new", "old") for i in avro_incompatibilities(new, previous)]
        elif kind == "JSON":  # two of Confluent's rules (_json_compat)
            now, then = json.loads(text), json.loads(old.text)
            if level in ("FORWARD", "FULL"):
                found += [i.message("old", "new") for i in json_incompatibilities(then, now)]
            if level in ("BACKWARD", "FULL"):
                found += [i.message("new", "old") for i in json_incompatibilities(now, then)]
        else:  # Protobuf: three rules (_protobuf_compat), on serialized descriptors only
            new_file, old_file = parse_protobuf(text), parse_protobuf(old.text)
            if new_file is None or old_file is None:
                return []
            if level in ("FORWARD", "FULL"):
                found += [
                    i.message("old", "new") for i in protobuf_incompatibilities(old_file, new_file)
                ]
            if level in ("BACKWARD", "FULL"):
                found += [
                    i.message("new", "old") for i in protobuf_incompatibilities(new_file, old_file)
                ]
        return found

    def _avro(self, text: str, refs: list[dict[str, Any]]) -> AvroSchema:
        """An Avro schema in normal form, with the named types of its references."""
        names: dict[str, dict[str, Any]] = {}
        loaded: set[tuple[str, int]] = set()

        def load(references: list[dict[str, Any]]) -> None:
            for ref in references:
                key = (ref["subject"], ref["version"])
                if key not in loaded:
                    loaded.add(key)
                    found = self.version(ref["subject"], str(ref["version"]), deleted=True)
                    load(found.schema.references)
                    names.update(parse_avro(json.loads(found.schema.text), names).names)

        try:
            load(refs)
            return parse_avro(json.loads(text), names)
        except AvroSchemaError as exc:
            raise RegistryError(422, 42201, f"Invalid schema: {exc}") from None

    def test_compatibility(self, subject: str, version: str | None, body: Any) -> list[str]:
        """``POST /compatibility/subjects/{s}/versions[/{v}]``: what the schema breaks,
        against version ``version`` (``latest`` or a number) or, with None, the
        versions the subject's level compares with."""
        kind, text, refs = self._parse(body)
        self._identity(kind, text, refs)  # 422 when it is not JSON
        self._check(kind, text, refs)
        live = [v for v in self.subjects.get(subject, ()) if not v.deleted]
        against = live
        if version is not None:
            if version in ("latest", "-1"):
                against = live[-1:]
            else:
                wanted = self.version_number(version)
                against = [v for v in live if v.version == wanted]
                if not against:
                    raise RegistryError(404, 40402, f"Version {wanted} not found.")
        return self.incompatibilities(kind, text, refs, against, self.level_of(subject))

    def lookup(self, subject: str, body: Any, deleted: bool = False) -> _Version:
        kind, text, refs = self._parse(body)
        identity = self._identity(kind, text, refs)
        for v in self._versions(subject, deleted):
            if v.schema.identity == identity:
                return v
        raise RegistryError(404, 40403, "Schema not found")

    def delete_subject(self, subject: str, permanent: bool) -> list[int]:
        versions = self.subjects.get(subject) or []
        if not versions:
            raise _subject_not_found(subject)
        if permanent:
            if any(not v.deleted for v in versions):
                raise RegistryError(
                    404,
                    40405,
                    f"Subject '{subject}' was not deleted first before being permanently deleted",
                )
            del self.subjects[subject]
            self.levels.pop(subject, None)
            return [v.version for v in versions]
        live = [v for v in versions if not v.deleted]
        if not live:
            raise RegistryError(404, 40404, f"Subject '{subject}' was soft deleted.")
        for v in live:
            v.deleted = True
        return [v.version for v in live]

    def delete_version(self, subject: str, version: str, permanent: bool) -> int:
        found = self.version(subject, version, deleted=permanent)
        if permanent:
            if not found.deleted:
                raise RegistryError(
                    404,
                    40407,
                    f"Subject '{subject}' Version {found.version} was not deleted first before "
                    "being permanently deleted",
                )
            self.subjects[subject].remove(found)
            if not self.subjects[subject]:
                del self.subjects[subject]
        else:
            found.deleted = True
        return found.version

    def set_level(self, subject: str | None, body: Any) -> str:
        level = (
            str((body or {}).get("compatibility") or "").upper() if isinstance(body, dict) else ""
        )
        if level not in LEVELS:
            raise RegistryError(
                422, 42203, f"Invalid compatibility level {level or None!r}: one of {LEVELS}"
            )
        if subject is None:
            self.level = level
        else:
            self.levels[subject] = level
        return level

    def get_level(self, subject: str | None, default_to_global: bool) -> str:
        if subject is None:
            return self.level
        level = self.levels.get(subject)
        if level is None:
            if not default_to_global:
                raise RegistryError(
                    404, 40408, f"Subject '{subject}' does not have subject-level compatibility"
                )
            return self.level
        return level


def _schema_doc(schema: _Schema) -> dict[str, Any]:
    doc: dict[str, Any] = {"schema": schema.text}
    if schema.type != "AVRO":
        doc["schemaType"] = schema.type
    if schema.references:
        doc["references"] = schema.references
    return doc


def _version_doc(subject: str, v: _Version) -> dict[str, Any]:
    return {"subject": subject, "version": v.version, "id": v.schema.id, **_schema_doc(v.schema)}


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "false").strip().lower() == "true"


def _reply(data: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(data), content_type=CONTENT_TYPE)


async def _body(request: web.Request) -> Any:
    try:
        return json.loads(await request.text())
    except ValueError as exc:
        raise RegistryError(400, 400, f"Unexpected request body: {exc}") from None


def make_app(
    registry: Registry | None = None, user: tuple[str, str] | None = None
) -> web.Application:
    """The registry's aiohttp application (on ``registry``, a new one by default)."""
    reg = registry if registry is not None else Registry()
    routes = web.RouteTableDef()
    expected = (
        "Basic " + base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode() if user else None
    )

    Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        if expected is not None and not hmac.compare_digest(
            request.headers.get("Authorization", ""), expected
        ):
            return web.Response(
                status=401,
                text=json.dumps({"error_code": 401, "message": "Unauthorized"}),
                content_type=CONTENT_TYPE,
                headers={"WWW-Authenticate": 'Basic realm="schema-registry"'},
            )
        try:
            return await handler(request)
        except RegistryError as exc:
            return _reply({"error_code": exc.code, "message": exc.message}, exc.status)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _reply({"error_code": exc.status, "message": exc.reason}, exc.status)

    def _id(request: web.Request) -> int:
        try:
            return int(request.match_info["id"])
        except ValueError:
            raise RegistryError(404, 40403, "Schema not found") from None

    @routes.get("/")
    async def root(_request: web.Request) -> web.Response:
        return _reply({})

    @routes.get("/schemas/types")
    async def types(_request: web.Request) -> web.Response:
        return _reply(sorted(TYPES))

    @routes.get("/schemas/ids/{id}")
    async def schema_by_id(request: web.Request) -> web.Response:
        return _reply(_schema_doc(reg.schema(_id(request))))

    @routes.get("/schemas/ids/{id}/schema")
    async def raw_schema_by_id(request: web.Request) -> web.Response:
        return web.Response(text=reg.schema(_id(request)).text, content_type=CONTENT_TYPE)

    @routes.get("/schemas/ids/{id}/subjects")
    async def subjects_of_id(request: web.Request) -> web.Response:
        schema_id = _id(request)
        reg.schema(schema_id)
        uses = reg.uses(schema_id, _flag(request, "deleted"))
        return _reply(sorted({s for s, _ in uses}))

    @routes.get("/schemas/ids/{id}/versions")
    async def versions_of_id(request: web.Request) -> web.Response:
        schema_id = _id(request)
        reg.schema(schema_id)
        uses = reg.uses(schema_id, _flag(request, "deleted"))
        return _reply([{"subject": s, "version": v} for s, v in uses])

    @routes.get("/subjects")
    async def subjects(request: web.Request) -> web.Response:
        prefix = request.query.get("subjectPrefix", "")
        return _reply(reg.subject_names(_flag(request, "deleted"), prefix))

    @routes.get("/subjects/{subject}/versions")
    async def versions(request: web.Request) -> web.Response:
        found = reg._versions(request.match_info["subject"], _flag(request, "deleted"))
        return _reply([v.version for v in found])

    @routes.get("/subjects/{subject}/versions/{version}")
    async def version(request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        v = reg.version(subject, request.match_info["version"], _flag(request, "deleted"))
        return _reply(_version_doc(subject, v))

    @routes.get("/subjects/{subject}/versions/{version}/schema")
    async def version_schema(request: web.Request) -> web.Response:
        v = reg.version(request.match_info["subject"], request.match_info["version"])
        return web.Response(text=v.schema.text, content_type=CONTENT_TYPE)

    @routes.get("/subjects/{subject}/versions/{version}/referencedby")
    async def referenced_by(request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        v = reg.version(subject, request.match_info["version"])
        return _reply(reg.referenced_by(subject, v.version))

    @routes.post("/subjects/{subject}/versions")
    async def register(request: web.Request) -> web.Response:
        schema = reg.register(request.match_info["subject"], await _body(request))
        return _reply({"id": schema.id})

    async def _compatibility(request: web.Request, version: str | None) -> web.Response:
        subject = request.match_info["subject"]
        messages = reg.test_compatibility(subject, version, await _body(request))
        answer: dict[str, Any] = {"is_compatible": not messages}
        if _flag(request, "verbose"):
            answer["messages"] = messages
        return _reply(answer)

    @routes.post("/compatibility/subjects/{subject}/versions/{version}")
    async def compatibility_with_version(request: web.Request) -> web.Response:
        return await _compatibility(request, request.match_info["version"])

    @routes.post("/compatibility/subjects/{subject}/versions")
    async def compatibility_with_versions(request: web.Request) -> web.Response:
        return await _compatibility(request, None)

    @routes.post("/subjects/{subject}")
    async def lookup(request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        v = reg.lookup(subject, await _body(request), _flag(request, "deleted"))
        return _reply(_version_doc(subject, v))

    @routes.delete("/subjects/{subject}")
    async def delete_subject(request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        return _reply(reg.delete_subject(subject, _flag(request, "permanent")))

    @routes.delete("/subjects/{subject}/versions/{version}")
    async def delete_version(request: web.Request) -> web.Response:
        subject, number = request.match_info["subject"], request.match_info["version"]
        return _reply(reg.delete_version(subject, number, _flag(request, "permanent")))

    @routes.get("/config")
    async def get_config(_request: web.Request) -> web.Response:
        return _reply({"compatibilityLevel": reg.level})

    @routes.put("/config")
    async def put_config(request: web.Request) -> web.Response:
        return _reply({"compatibility": reg.set_level(None, await _body(request))})

    @routes.delete("/config")
    async def delete_config(_request: web.Request) -> web.Response:
        old, reg.level = reg.level, DEFAULT_LEVEL
        return _reply({"compatibilityLevel": old})

    @routes.get("/config/{subject}")
    async def get_subject_config(request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        level = reg.get_level(subject, _flag(request, "defaultToGlobal"))
        return _reply({"compatibilityLevel": level})

    @routes.put("/config/{subject}")
    async def put_subject_config(request: web.Request) -> web.Response:
        level = reg.set_level(request.match_info["subject"], await _body(request))
        return _reply({"compatibility": level})

    @routes.delete("/config/{subject}")
    async def delete_subject_config(request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        old = reg.get_level(subject, default_to_global=False)
        del reg.levels[subject]
        return _reply({"compatibilityLevel": old})

    @routes.get("/mode")
    async def mode(_request: web.Request) -> web.Response:
        return _reply({"mode": "READWRITE"})

    app = web.Application(middlewares=[errors])
    app.add_routes(routes)
    return app


# -- LOCAL: this module's server in a process of its own -----------------------------------


def _answers(
    url: str, auth: tuple[str, str] | None, timeout: float, alive: Callable[[], bool]
) -> None:
    """Block until ``GET {url}/subjects`` answers 200 (or the server died)."""
    request = urllib.request.Request(f"{url}/subjects")
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.URLError) as exc:
            if not alive():
                raise EmulatorError(f"the schema registry at {url} exited while starting") from exc
            if time.monotonic() > deadline:
                raise EmulatorError(f"the schema registry at {url} does not answer: {exc}") from exc
        time.sleep(0.05)


class LocalSchemaRegistry(LocalProcessEmulator):
    """acklane's registry server (this module) in a subprocess on a free port.

    ``user=("name", "password")`` makes it ask for HTTP basic authentication.
    """

    broker: ClassVar[str] = "schema-registry"
    backend: ClassVar[str] = "local"

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        user: tuple[str, str] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.user = user
        self._process: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def endpoint(self) -> str:
        if self.port is None:
            raise EmulatorError("the schema registry emulator is not started")
        return f"http://{self.host}:{self.port}"

    def client_settings(self) -> dict[str, Any]:
        """The ``schema_registry:`` block of a Kafka stream that reaches it."""
        settings: dict[str, Any] = {"url": self.endpoint}
        if self.user is not None:
            settings["username"], settings["password"] = self.user
        return settings

    def client_conf(self) -> dict[str, Any]:
        """confluent-kafka ``SchemaRegistryClient`` configuration that reaches it."""
        conf: dict[str, Any] = {"url": self.endpoint}
        if self.user is not None:
            conf["basic.auth.user.info"] = f"{self.user[0]}:{self.user[1]}"
        return conf

    def start(self) -> None:
        if self._process is not None:
            return
        if self.port is not None:
            require_free_port(self.host, self.port)
        self.port = self.port or free_port()
        command = [sys.executable, "-m", "acklane.integration.schema_registry"]
        command += ["--host", self.host, "--port", str(self.port)]
        if self.user is not None:
            command += ["--user", f"{self.user[0]}:{self.user[1]}"]
        self._launch(
            command,
            "acklane-schema-registry-",
            f"the schema registry emulator on port {self.port} did not start",
        )

    def wait_healthy(self, timeout: float = 30.0) -> None:
        self._wait_answering(
            "the schema registry emulator",
            self.host,
            self.port or 0,
            timeout,
            lambda left, alive: _answers(self.endpoint, self.user, left, alive),
        )


# -- DOCKER: Confluent's image beside a Kafka broker ------------------------------------------


def confluent_specs(
    image: str, kafka_image: str, cluster_id: str, port: int
) -> tuple[ContainerSpec, ContainerSpec]:
    """The Kafka broker (``kafka`` on their network), then the registry on host ``port``."""
    from .kafka import kraft_env

    kafka = ContainerSpec(kafka_image, env=kraft_env(cluster_id, "kafka:9092"), aliases=("kafka",))
    registry = ContainerSpec(
        image,
        env={
            "SCHEMA_REGISTRY_HOST_NAME": "schema-registry",
            "SCHEMA_REGISTRY_LISTENERS": "http://0.0.0.0:8081",
            "SCHEMA_REGISTRY_KAFKASTORE_BOOTSTRAP_SERVERS": "PLAINTEXT://kafka:9092",
        },
        bind_ports={8081: port},
    )
    return kafka, registry


class ConfluentSchemaRegistry(ContainerEmulator):
    """``confluentinc/cp-schema-registry`` (with ``apache/kafka`` for its store) under Docker.

    Both containers share a Docker network of their own; the registry's port is
    published on a free host port. Basic authentication is not configured on it.
    """

    broker: ClassVar[str] = "schema-registry"
    title: ClassVar[str] = "the schema registry containers"

    def __init__(
        self,
        *,
        image: str = REGISTRY_IMAGE,
        kafka_image: str = KAFKA_IMAGE,
        startup_timeout: float = 180.0,
    ) -> None:
        super().__init__()
        self.image = image
        self.kafka_image = kafka_image
        self.startup_timeout = startup_timeout
        self._url: str | None = None

    @property
    def endpoint(self) -> str:
        if self._url is None:
            raise EmulatorError("the schema registry container is not started")
        return self._url

    def client_settings(self) -> dict[str, Any]:
        return {"url": self.endpoint}

    def client_conf(self) -> dict[str, Any]:
        return {"url": self.endpoint}

    def _run(self) -> None:
        from .kafka import new_cluster_id

        self._join_network()
        kafka, registry = confluent_specs(
            self.image, self.kafka_image, new_cluster_id(), free_port()
        )
        self._start(kafka)
        started = self._start(registry)
        self._url = f"http://{started.get_container_host_ip()}:{registry.bind_ports[8081]}"

    def wait_healthy(self, timeout: float = 120.0) -> None:
        url = self.endpoint
        host_port = url.split("//", 1)[1]
        host, _, port = host_port.rpartition(":")
        wait_for_port(host, int(port), timeout)
        _answers(url, None, timeout, lambda: True)

    def stop(self) -> None:
        super().stop()
        self._url = None


LOCAL = LocalSchemaRegistry
DOCKER = ConfluentSchemaRegistry


def _user(text: str) -> tuple[str, str]:
    name, sep, password = text.partition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError("expected NAME:PASSWORD")
    return name, password


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the registry until killed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--user", type=_user, help="NAME:PASSWORD: ask for basic authentication")
    args = parser.parse_args(argv)
    web.run_app(
        make_app(user=args.user),
        host=args.host,
        port=args.port,
        print=None,
        access_log=None,
        handle_signals=True,
    )


if __name__ == "__main__":
    main()
