"""The YAML block of a Kafka stream, validated before anything connects."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from acklane.core.connectors import StreamSettings

__all__ = ["ClientValue", "KafkaConfig", "SchemaRegistrySettings"]

ClientValue = bool | int | str

# Kafka's legal topic names; a subscription may also be a regex ("^orders-.*").
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
# librdkafka property names: lowercase words joined by dots.
_PROPERTY = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9_]+)*")

#: Client properties acklane owns: setting them on, or at all, would break its promise.
_AUTO_COMMIT = ("enable.auto.commit", "enable.auto.offset.store")
#: The DLQ producer's default ``message.max.bytes`` (librdkafka's own is 1,000,000).
DLQ_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: The consumer's default ``fetch.queue.backoff.ms`` (librdkafka's own is 1000).
FETCH_QUEUE_BACKOFF_MS = 50
_KEY_PROPERTIES = {"bootstrap.servers": "bootstrap_servers", "group.id": "group_id"}

#: Consumer-only properties from ``client`` that the DLQ producer does not get
#: (librdkafka warns about every property of the other kind).
_CONSUMER_ONLY_PREFIXES = (
    "group.",
    "auto.",
    "enable.auto.",
    "enable.partition.eof",
    "fetch.",
    "queued.",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "partition.assignment.strategy",
    "isolation.level",
    "check.crcs",
    "coordinator.query.interval.ms",
    "consume.callback.max.messages",
    "max.partition.fetch.bytes",
)

_FALSE_VALUES = {"false", "0", "f", "no", "off"}
#: librdkafka's ``auto.offset.reset`` values that start at the end of the log.
_RESET_TO_END = frozenset({"latest", "largest", "end"})


def _is_false(value: ClientValue) -> bool:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value == 0
    return value.strip().lower() in _FALSE_VALUES


_WHY_NO_AUTO_COMMIT = (
    "acklane commits an offset only once every watcher finished the message and its "
    "trigger events are stored; librdkafka's auto-commit would commit behind its back "
    "and lose messages on a crash"
)


#: ``value_format``: what a record's value is (``json``: the bytes as they come, as before).
ValueFormat = Literal["json", "avro", "protobuf", "json_schema"]
#: ``key_format``: what a record's key is (``string``: UTF-8 text, as before).
KeyFormat = Literal["string", "avro", "protobuf", "json_schema"]
#: The formats framed for a Schema Registry (magic byte 0, a 4-byte schema id).
REGISTRY_FORMATS = frozenset({"avro", "protobuf", "json_schema"})
_MESSAGE_CLASS = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


class SchemaRegistrySettings(BaseModel):
    """A Kafka stream's ``schema_registry:`` block: where the schemas of its records are.

    Maps onto confluent-kafka's ``SchemaRegistryClient`` configuration; ``client``
    passes any other of its properties through (``cache.capacity``, ``max.retries``...).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(description="the registry's URL (several: comma-separated)")
    username: str | None = Field(default=None, description="HTTP basic authentication user")
    password: SecretStr | None = Field(default=None, description="... and its password")
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: SecretStr | None = None
    timeout: float = Field(default=10.0, gt=0, description="seconds one request may take")
    client: dict[str, ClientValue] = Field(
        default_factory=dict, description="other SchemaRegistryClient properties"
    )

    @field_validator("url")
    @classmethod
    def _urls(cls, value: str) -> str:
        urls = [u.strip() for u in value.split(",") if u.strip()]
        if not urls or not all(u.startswith(("http://", "https://")) for u in urls):
            raise ValueError(f"{value!r}: expected http(s)://host:port (comma-separated)")
        return ",".join(urls)

    @model_validator(mode="after")
    def _credentials(self) -> Self:
        if (self.username is None) != (self.password is None):
            missing = "password" if self.password is None else "username"
            raise ValueError(f"schema_registry.{missing} is required with the other credential")
        if self.username is not None and any("@" in u.split("/")[2] for u in self.url.split(",")):
            raise ValueError("schema_registry: credentials in the url and username: choose one")
        if "basic.auth.user.info" in self.client or "url" in self.client:
            raise ValueError("set url, username and password as fields, not in client")
        return self

    def client_conf(self) -> dict[str, Any]:
        """confluent-kafka ``SchemaRegistryClient`` configuration (secrets included)."""
        conf: dict[str, Any] = {"url": self.url, "timeout": self.timeout}
        if self.username is not None and self.password is not None:
            conf["basic.auth.user.info"] = f"{self.username}:{self.password.get_secret_value()}"
        for name in ("ssl_ca_location", "ssl_certificate_location", "ssl_key_location"):
            if getattr(self, name) is not None:
                conf[name.replace("_", ".")] = getattr(self, name)
        if self.ssl_key_password is not None:
            conf["ssl.key.password"] = self.ssl_key_password.get_secret_value()
        return {**conf, **self.client}


class KafkaConfig(StreamSettings):
    """One Kafka stream: which cluster, topics and consumer group, and how to consume.

    ``bootstrap_servers``, ``topics`` and ``group_id`` pick the upstream and form the
    shared stream key; every other field is tuning or credentials. Security fields
    map one to one onto librdkafka properties (``sasl_mechanism`` ->
    ``sasl.mechanism``); ``client`` passes any other librdkafka property through.
    ``dead_letter`` is the topic rejected records are produced to before the commit
    passes them; ``max_attempts`` as on every broker.
    """

    renamed: ClassVar[Mapping[str, str]] = {
        "dlq_topic": "dead_letter",
        "dlq_flush_timeout": "dead_letter_flush_timeout",
        "dlq_client": "dead_letter_client",
    }

    bootstrap_servers: str = Field(
        description="host:port of one or more brokers (a comma-separated string or a list)"
    )
    topics: tuple[str, ...] = Field(description="topics to consume (a regex starts with ^)")
    group_id: str = Field(min_length=1, description="the Kafka consumer group")

    # -- tuning (not part of the key)
    poll_timeout: float = Field(
        default=0.1,
        gt=0,
        le=10,
        description="seconds one consume call waits for messages when none are buffered (in "
        "slices: an advance queued behind it waits one slice, not this long)",
    )
    batch_size: int = Field(default=500, ge=1, le=100_000, description="messages per consume")
    max_outstanding: int = Field(
        default=1000,
        ge=1,
        description="messages handed to the engine and not yet advanced before fetching pauses "
        "(keep it below the engine's subscriber queue size)",
    )
    auto_offset_reset: Literal["earliest", "latest", "error"] = Field(
        default="earliest", description="where a group with no committed offset starts"
    )
    dead_letter_flush_timeout: float = Field(
        default=30.0,
        gt=0,
        description="seconds to wait for the broker to confirm dead-letter copies",
    )
    lag_end_offsets: Literal["broker", "last_batch"] = Field(
        default="broker",
        description="how the lag figures find each partition's log end: the broker's "
        "high-water mark, or read from its last record batch (brokers whose high-water "
        "mark is the last batch's first offset + 1, such as the tansu emulator)",
    )

    # -- security (passed through to librdkafka)
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] | None = None
    sasl_mechanism: (
        Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI"] | None
    ) = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: str | None = None
    ssl_ca_pem: str | None = None
    ssl_certificate_location: str | None = None
    ssl_certificate_pem: str | None = None
    ssl_key_location: str | None = None
    ssl_key_pem: SecretStr | None = None
    ssl_key_password: SecretStr | None = None
    ssl_keystore_location: str | None = None
    ssl_keystore_password: SecretStr | None = None
    ssl_crl_location: str | None = None
    ssl_endpoint_identification_algorithm: Literal["none", "https"] | None = None
    ssl_cipher_suites: str | None = None

    # -- free-form librdkafka overrides
    client: dict[str, ClientValue] = Field(
        default_factory=dict,
        description="extra librdkafka properties for the consumer and the dead-letter producer",
    )
    dead_letter_client: dict[str, ClientValue] = Field(
        default_factory=dict,
        description="extra librdkafka properties for the dead-letter producer only",
    )

    # -- bodies framed for a Schema Registry (docs/schema-registry.md)
    value_format: ValueFormat = Field(
        default="json",
        description="what record values are: json (as they come), or avro, protobuf or "
        "json_schema framed for a Schema Registry (decoded into the body filters see)",
    )
    key_format: KeyFormat = Field(
        default="string", description="what record keys are: string (UTF-8), avro, protobuf..."
    )
    value_message_class: str | None = Field(
        default=None, description="value_format protobuf: the generated class, module:Class"
    )
    key_message_class: str | None = Field(
        default=None, description="key_format protobuf: the generated class, module:Class"
    )
    schema_registry: SchemaRegistrySettings | None = Field(
        default=None, description="the Schema Registry of value_format/key_format"
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_auto_commit_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in ("enable_auto_commit", "enable_auto_offset_store"):
                if name in data:
                    raise ValueError(
                        f"{name}: auto-commit cannot be turned on ({_WHY_NO_AUTO_COMMIT})"
                    )
        return data

    @field_validator("bootstrap_servers", mode="before")
    @classmethod
    def _join_servers(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            value = ",".join(str(v) for v in value)
        if isinstance(value, str):
            servers = [s.strip() for s in value.split(",") if s.strip()]
            if not servers:
                raise ValueError("expected at least one host:port")
            for server in servers:
                host, sep, port = server.rpartition(":")
                if not sep or not host or not port.isdigit():
                    raise ValueError(f"{server!r} is not host:port")
            return ",".join(servers)
        return value

    @field_validator("topics", mode="before")
    @classmethod
    def _topic_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return (value,)
        return value

    @field_validator("topics")
    @classmethod
    def _legal_topics(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("expected at least one topic")
        for topic in value:
            if not (topic.startswith("^") or _TOPIC.fullmatch(topic)):
                raise ValueError(
                    f"{topic!r} is not a Kafka topic name (1-249 of letters, digits, '.', '_', "
                    "'-') nor a regex subscription starting with '^'"
                )
        return tuple(dict.fromkeys(value))

    @field_validator("dead_letter")
    @classmethod
    def _legal_dead_letter_topic(cls, value: str | None) -> str | None:
        if value is not None and not _TOPIC.fullmatch(value):
            raise ValueError(f"{value!r} is not a Kafka topic name")
        return value

    @field_validator("client", "dead_letter_client")
    @classmethod
    def _client_properties(
        cls, value: dict[str, ClientValue], info: ValidationInfo
    ) -> dict[str, ClientValue]:
        for name, setting in value.items():
            if not _PROPERTY.fullmatch(name):
                raise ValueError(
                    f"{name!r} is not a librdkafka property name (e.g. 'fetch.min.bytes')"
                )
            if name in _AUTO_COMMIT and not _is_false(setting):
                raise ValueError(
                    f"{info.field_name}.{name} is {setting!r} but must be false "
                    f"({_WHY_NO_AUTO_COMMIT})"
                )
            if name in _KEY_PROPERTIES:
                raise ValueError(
                    f"{name!r} cannot be overridden here: set the {_KEY_PROPERTIES[name]} field "
                    "(it is part of the shared stream key)"
                )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.dead_letter is not None and self.dead_letter in self.topics:
            raise ValueError(
                f"dead_letter {self.dead_letter!r} is one of the consumed topics: rejected "
                "messages would come straight back"
            )
        typed = self._security_properties()
        for source in ("client", "dead_letter_client"):
            for name in getattr(self, source):
                if name in typed:
                    raise ValueError(
                        f"{source}.{name} is also set by the field {name.replace('.', '_')}; "
                        "set it in one place"
                    )
        sasl = self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")
        if self.sasl_mechanism is not None and not sasl and self.security_protocol is not None:
            raise ValueError(
                f"sasl_mechanism is set but security_protocol is {self.security_protocol}; "
                "use SASL_SSL or SASL_PLAINTEXT"
            )
        if (self.sasl_username is None) != (self.sasl_password is None):
            missing = "sasl_password" if self.sasl_password is None else "sasl_username"
            raise ValueError(f"{missing} is required with the other SASL credential")
        self._consistent_formats()
        return self

    def _consistent_formats(self) -> None:
        framed = [
            f"{side}_format {fmt}"
            for side, fmt in (("value", self.value_format), ("key", self.key_format))
            if fmt in REGISTRY_FORMATS
        ]
        if framed and self.schema_registry is None:
            raise ValueError(f"{' and '.join(framed)} need a schema_registry block (its url)")
        for side, fmt, cls in (
            ("value", self.value_format, self.value_message_class),
            ("key", self.key_format, self.key_message_class),
        ):
            if fmt == "protobuf" and cls is None:
                raise ValueError(
                    f"{side}_format protobuf needs {side}_message_class: the generated message "
                    "class, module:Class (confluent-kafka's ProtobufDeserializer decodes into it)"
                )
            if cls is not None and fmt != "protobuf":
                raise ValueError(f"{side}_message_class is for {side}_format protobuf, not {fmt}")
            if cls is not None and not _MESSAGE_CLASS.fullmatch(cls):
                raise ValueError(f"{side}_message_class {cls!r}: expected module:Class")

    def decodes(self) -> bool:
        """Whether values or keys are decoded through a Schema Registry."""
        return self.value_format in REGISTRY_FORMATS or self.key_format in REGISTRY_FORMATS

    # -- what the rest of the connector reads

    def stream_key(self) -> tuple[str, str, tuple[str, ...], str]:
        """``("kafka", servers, sorted topics, group id)``: only what picks the upstream."""
        servers = ",".join(sorted(self.bootstrap_servers.split(",")))
        return ("kafka", servers, tuple(sorted(self.topics)), self.group_id)

    def _security_properties(self) -> dict[str, str]:
        props: dict[str, str] = {}
        for name in type(self).model_fields:
            if not name.startswith(("security_", "sasl_", "ssl_")):
                continue
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            props[name.replace("_", ".")] = value
        return props

    def consumer_settings(self) -> dict[str, Any]:
        """librdkafka properties of the consumer (secrets included: never log them)."""
        settings: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": self.group_id,
            "auto.offset.reset": self.auto_offset_reset,
            "enable.partition.eof": False,
            # Watchers consume slower than librdkafka prefetches, so the local queue
            # reaches its limit (queued.max.messages.kbytes) and librdkafka stops
            # fetching for this long: 1 s by default, after which the watchers have
            # drained the queue and wait. 1 KB records on the emulator: 64k -> 99k/s.
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
            **self._security_properties(),
            **self.client,
        }
        settings["enable.auto.commit"] = False
        settings["enable.auto.offset.store"] = False
        return settings

    def starts_at_the_end(self) -> bool:
        """Whether a partition with no committed offset starts at the end of its log.

        ``auto_offset_reset: latest``, or one of librdkafka's synonyms passed in ``client``.
        """
        value = str(self.consumer_settings()["auto.offset.reset"]).strip().lower()
        return value in _RESET_TO_END

    def _client_settings(self) -> dict[str, Any]:
        """Servers, security and the ``client`` properties that are not consumer-only."""
        shared = {k: v for k, v in self.client.items() if not k.startswith(_CONSUMER_ONLY_PREFIXES)}
        return {
            "bootstrap.servers": self.bootstrap_servers,
            **self._security_properties(),
            **shared,
        }

    def dlq_settings(self) -> dict[str, Any]:
        """librdkafka properties of the DLQ producer (secrets included: never log them)."""
        return {
            # librdkafka refuses records over 1,000,000 bytes by default, while brokers
            # take up to ~1 MiB (and more, per topic): a consumed record must always fit
            # in its DLQ copy, or it would fail every advance of its group. The broker
            # still enforces the DLQ topic's own limit.
            "message.max.bytes": DLQ_MAX_MESSAGE_BYTES,
            **self._client_settings(),
            **self.dead_letter_client,
        }

    def admin_settings(self) -> dict[str, Any]:
        """librdkafka properties of the admin client that reads topic ids and limits."""
        return self._client_settings()

    def describe(self) -> str:
        """A secret-free one-liner for logs."""
        dlq = f" dead_letter={self.dead_letter}" if self.dead_letter else ""
        formats = ""
        if self.decodes():
            formats = f" value_format={self.value_format}"
            if self.key_format != "string":
                formats += f" key_format={self.key_format}"
        return (
            f"kafka servers={self.bootstrap_servers} topics={','.join(self.topics)} "
            f"group={self.group_id}{dlq}{formats}"
        )
