"""The Pub/Sub schema service, and the validation of what is published to a topic with one.

Schemas are Avro (checked with fastavro) or Protocol Buffers (a ``.proto`` text with
one top-level message, compiled with protoc from grpcio-tools), each with revisions
(``CommitSchema``, ``RollbackSchema``, ``DeleteSchemaRevision``; ``name@revision``
reads one). A topic's ``schema_settings`` names a schema, an encoding (JSON or
BINARY) and optionally a range of revisions: a published message must be valid
against one revision of that range, or the publish fails with ``INVALID_ARGUMENT``;
a valid one gets the ``googclient_schema*`` attributes, as from the service.
"""

from __future__ import annotations

import io
import json
import re
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import empty_pb2
from google.pubsub_v1 import types as t

from acklane.core.errors import AcklaneError

from ._paging import paginate

__all__ = ["SchemaRegistry"]

_SCHEMA = re.compile(r"^projects/([^/]+)/schemas/([A-Za-z][A-Za-z0-9._~%+-]{2,254})(?:@(.+))?$")
DELETED_SCHEMA = "_deleted-schema_"
AVRO = 2
PROTOCOL_BUFFER = 1
JSON = 1
BINARY = 2
_ENCODINGS = {JSON: "JSON", BINARY: "BINARY"}

_pb = {
    name: getattr(t, name).pb()
    for name in (
        "Schema",
        "CreateSchemaRequest",
        "GetSchemaRequest",
        "ListSchemasRequest",
        "ListSchemasResponse",
        "ListSchemaRevisionsRequest",
        "ListSchemaRevisionsResponse",
        "CommitSchemaRequest",
        "RollbackSchemaRequest",
        "DeleteSchemaRevisionRequest",
        "DeleteSchemaRequest",
        "ValidateSchemaRequest",
        "ValidateSchemaResponse",
        "ValidateMessageRequest",
        "ValidateMessageResponse",
    )
}


class SchemaError(AcklaneError):
    """A gRPC error of the schema service: its code and message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _invalid(message: str) -> SchemaError:
    return SchemaError(grpc.StatusCode.INVALID_ARGUMENT, message)


@dataclass(eq=False)
class _Revision:
    config: Any  # Schema, with revision_id and revision_create_time
    validator: Callable[[bytes, int], None]


@dataclass(eq=False)
class _Schema:
    revisions: list[_Revision] = field(default_factory=list)  # oldest first

    @property
    def latest(self) -> _Revision:
        return self.revisions[-1]


def _avro_validator(definition: str) -> Callable[[bytes, int], None]:
    try:
        import fastavro
    except ImportError:  # pragma: no cover - the pubsub extra installs it
        raise SchemaError(
            grpc.StatusCode.UNIMPLEMENTED,
            "Avro schemas need fastavro in the emulator's environment "
            "(pip install 'acklane-integration[pubsub]')",
        ) from None
    try:
        parsed = fastavro.parse_schema(json.loads(definition))
    except Exception as exc:
        raise _invalid(f"Invalid Avro schema definition: {exc}") from None

    def validate(data: bytes, encoding: int) -> None:
        if encoding == JSON:
            records = list(fastavro.json_reader(io.StringIO(data.decode()), parsed))
            if len(records) != 1:
                raise ValueError(f"expected one record, got {len(records)}")
            return
        buffer = io.BytesIO(data)
        fastavro.schemaless_reader(buffer, parsed, None)
        if buffer.tell() != len(data):
            raise ValueError(f"{len(data) - buffer.tell()} bytes left after the record")

    return validate


def _protobuf_validator(definition: str) -> Callable[[bytes, int], None]:
    try:
        from grpc_tools import protoc
    except ImportError:  # pragma: no cover - the pubsub extra installs it
        raise SchemaError(
            grpc.StatusCode.UNIMPLEMENTED,
            "Protocol Buffer schemas need grpcio-tools in the emulator's environment "
            "(pip install 'acklane-integration[pubsub]')",
        ) from None
    from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

    with tempfile.TemporaryDirectory(prefix="acklane-pubsub-schema-") as tmp:
        source = Path(tmp, "schema.proto")
        source.write_text(definition)
        out = Path(tmp, "schema.desc")
        code = protoc.main(["protoc", f"-I{tmp}", f"--descriptor_set_out={out}", str(source)])
        if code != 0 or not out.exists():
            raise _invalid("Invalid Protocol Buffer schema definition: protoc refused it.")
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    proto = files.file[0]
    if proto.dependency:
        raise _invalid("Protocol Buffer schemas cannot import other files.")
    if len(proto.message_type) != 1:
        raise _invalid(
            "A Protocol Buffer schema must define exactly one top-level message type, "
            f"not {len(proto.message_type)}."
        )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    name = ".".join(p for p in (proto.package, proto.message_type[0].name) if p)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(name))

    def validate(data: bytes, encoding: int) -> None:
        if encoding == JSON:
            json_format.Parse(data.decode(), cls())
            return
        message = cls()
        message.ParseFromString(data)

    return validate


def _compile(schema: Any) -> Callable[[bytes, int], None]:
    if not schema.definition:
        raise _invalid("A schema needs a definition.")
    if schema.type_ == AVRO:
        return _avro_validator(schema.definition)
    if schema.type_ == PROTOCOL_BUFFER:
        return _protobuf_validator(schema.definition)
    raise _invalid("A schema's type must be AVRO or PROTOCOL_BUFFER.")


class SchemaRegistry:
    """The schemas of every project, with their revisions; methods run on one loop."""

    def __init__(self) -> None:
        self.schemas: dict[str, _Schema] = {}

    # ------------------------------------------------------------ lookups

    def _split(self, name: str) -> tuple[str, str | None]:
        match = _SCHEMA.match(name)
        if match is None:
            raise _invalid(f"Invalid [schemas] name: ({name})")
        base = name.split("@", 1)[0]
        return base, match.group(3)

    def _schema(self, name: str) -> _Schema:
        base, _ = self._split(name)
        try:
            return self.schemas[base]
        except KeyError:
            raise SchemaError(
                grpc.StatusCode.NOT_FOUND, f"Resource not found (schema={base})."
            ) from None

    def revision(self, name: str) -> _Revision:
        schema = self._schema(name)
        _, rev = self._split(name)
        if rev is None:
            return schema.latest
        for revision in schema.revisions:
            if revision.config.revision_id == rev:
                return revision
        raise SchemaError(grpc.StatusCode.NOT_FOUND, f"Resource not found (schema={name}).")

    # ------------------------------------------------------------ the service

    def _new_revision(self, name: str, source: Any) -> _Revision:
        validator = _compile(source)
        config = _pb["Schema"](
            name=name,
            type_=source.type_,
            definition=source.definition,
            revision_id=secrets.token_hex(4),
        )
        config.revision_create_time.FromNanoseconds(time.time_ns())
        return _Revision(config, validator)

    def create(self, parent: str, schema_id: str, schema: Any) -> Any:
        name = f"{parent}/schemas/{schema_id}" if schema_id else schema.name
        base, rev = self._split(name)
        if rev is not None:
            raise _invalid(f"Invalid [schemas] name: ({name})")
        if base in self.schemas:
            raise SchemaError(grpc.StatusCode.ALREADY_EXISTS, "Schema already exists")
        revision = self._new_revision(base, schema)
        self.schemas[base] = _Schema([revision])
        return revision.config

    def commit(self, name: str, schema: Any) -> Any:
        current = self._schema(name)
        if schema.type_ and schema.type_ != current.latest.config.type_:
            raise _invalid("A new revision must keep the schema's type.")
        source = _pb["Schema"](type_=current.latest.config.type_, definition=schema.definition)
        revision = self._new_revision(current.latest.config.name, source)
        current.revisions.append(revision)
        return revision.config

    def rollback(self, name: str, revision_id: str) -> Any:
        base, _ = self._split(name)
        old = self.revision(f"{base}@{revision_id}")
        return self.commit(base, old.config)

    def delete_revision(self, name: str, revision_id: str) -> Any:
        base, rev = self._split(name)
        revision_id = revision_id or (rev or "")
        current = self._schema(base)
        if len(current.revisions) == 1:
            raise SchemaError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "The last revision of a schema cannot be deleted; delete the schema.",
            )
        victim = self.revision(f"{base}@{revision_id}")
        current.revisions.remove(victim)
        return victim.config

    def delete(self, name: str) -> None:
        base, _ = self._split(name)
        self._schema(base)
        del self.schemas[base]

    def listed(self, parent: str, full: bool) -> list[Any]:
        prefix = f"{parent}/schemas/"
        return [
            self._view(s.latest.config, full)
            for n, s in sorted(self.schemas.items())
            if n.startswith(prefix)
        ]

    def revisions(self, name: str, full: bool) -> list[Any]:
        current = self._schema(name)
        return [self._view(r.config, full) for r in reversed(current.revisions)]

    @staticmethod
    def _view(config: Any, full: bool) -> Any:
        if full:
            return config
        basic = _pb["Schema"]()
        basic.CopyFrom(config)
        basic.ClearField("definition")
        return basic

    # ------------------------------------------------------------ topics

    def check_settings(self, settings: Any) -> None:
        if settings.schema == DELETED_SCHEMA:
            return
        if settings.encoding not in _ENCODINGS:
            raise _invalid("A topic's schema_settings need an encoding: JSON or BINARY.")
        schema = self._schema(settings.schema)
        ids = [r.config.revision_id for r in schema.revisions]
        for bound in (settings.first_revision_id, settings.last_revision_id):
            if bound and bound not in ids:
                raise _invalid(f"Invalid revision id {bound} for schema {settings.schema}.")

    def _candidates(self, settings: Any) -> list[_Revision]:
        schema = self.schemas.get(settings.schema.split("@", 1)[0])
        if schema is None:
            raise SchemaError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"The topic's schema {settings.schema} was deleted: nothing can be published.",
            )
        ids = [r.config.revision_id for r in schema.revisions]
        first = ids.index(settings.first_revision_id) if settings.first_revision_id in ids else 0
        last = (
            ids.index(settings.last_revision_id)
            if settings.last_revision_id in ids
            else len(ids) - 1
        )
        return list(reversed(schema.revisions[first : last + 1]))

    def _valid_revision(self, settings: Any, data: bytes) -> _Revision:
        problems = []
        for revision in self._candidates(settings):
            try:
                revision.validator(data, settings.encoding)
            except Exception as exc:
                problems.append(str(exc))
                continue
            return revision
        raise _invalid(
            "Invalid data in message: Message failed schema validation"
            + (f" ({problems[0]})" if problems else "")
        )

    def validate_published(self, settings: Any, message: Any) -> Any:
        """The revision a published message is valid against; ``INVALID_ARGUMENT`` if none."""
        return self._valid_revision(settings, bytes(message.data))

    @staticmethod
    def stamp(settings: Any, message: Any, revision: Any) -> None:
        """The attributes the service adds to a message published with a schema."""
        message.attributes["googclient_schemaname"] = revision.config.name
        message.attributes["googclient_schemaencoding"] = _ENCODINGS[settings.encoding]
        message.attributes["googclient_schemarevisionid"] = revision.config.revision_id

    # ------------------------------------------------------------ gRPC

    def handler(self, guard: Callable[[Any], Any]) -> grpc.GenericRpcHandler:
        def unary(fn: Any, request: str, response: str | None) -> grpc.RpcMethodHandler:
            out = _pb[response] if response else empty_pb2.Empty
            return grpc.unary_unary_rpc_method_handler(
                guard(fn),
                request_deserializer=_pb[request].FromString,
                response_serializer=out.SerializeToString,
            )

        methods = {
            "CreateSchema": unary(self._create, "CreateSchemaRequest", "Schema"),
            "GetSchema": unary(self._get, "GetSchemaRequest", "Schema"),
            "ListSchemas": unary(self._list, "ListSchemasRequest", "ListSchemasResponse"),
            "ListSchemaRevisions": unary(
                self._list_revisions, "ListSchemaRevisionsRequest", "ListSchemaRevisionsResponse"
            ),
            "CommitSchema": unary(self._commit, "CommitSchemaRequest", "Schema"),
            "RollbackSchema": unary(self._rollback, "RollbackSchemaRequest", "Schema"),
            "DeleteSchemaRevision": unary(
                self._delete_revision, "DeleteSchemaRevisionRequest", "Schema"
            ),
            "DeleteSchema": unary(self._delete, "DeleteSchemaRequest", None),
            "ValidateSchema": unary(
                self._validate_schema, "ValidateSchemaRequest", "ValidateSchemaResponse"
            ),
            "ValidateMessage": unary(
                self._validate_message, "ValidateMessageRequest", "ValidateMessageResponse"
            ),
        }
        return grpc.method_handlers_generic_handler("google.pubsub.v1.SchemaService", methods)

    async def _create(self, request: Any) -> Any:
        return self.create(request.parent, request.schema_id, request.schema)

    async def _get(self, request: Any) -> Any:
        return self._view(self.revision(request.name).config, request.view != 1)

    async def _list(self, request: Any) -> Any:
        schemas = self.listed(request.parent, request.view == 2)
        page, token = paginate(schemas, request.page_size, request.page_token)
        return _pb["ListSchemasResponse"](schemas=page, next_page_token=token)

    async def _list_revisions(self, request: Any) -> Any:
        schemas = self.revisions(request.name, request.view == 2)
        page, token = paginate(schemas, request.page_size, request.page_token)
        return _pb["ListSchemaRevisionsResponse"](schemas=page, next_page_token=token)

    async def _commit(self, request: Any) -> Any:
        return self.commit(request.name, request.schema)

    async def _rollback(self, request: Any) -> Any:
        return self.rollback(request.name, request.revision_id)

    async def _delete_revision(self, request: Any) -> Any:
        return self.delete_revision(request.name, request.revision_id)

    async def _delete(self, request: Any) -> Any:
        self.delete(request.name)
        return empty_pb2.Empty()

    async def _validate_schema(self, request: Any) -> Any:
        _compile(request.schema)
        return _pb["ValidateSchemaResponse"]()

    async def _validate_message(self, request: Any) -> Any:
        if request.name:
            validator = self.revision(request.name).validator
        else:
            validator = _compile(request.schema)
        try:
            validator(bytes(request.message), request.encoding or JSON)
        except Exception as exc:
            raise _invalid(
                f"Invalid data in message: Message failed schema validation ({exc})"
            ) from None
        return _pb["ValidateMessageResponse"]()
