"""A broker's binding to the engine: its configuration, its stream key, its producer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic

from pydantic import BaseModel
from typing_extensions import TypeVar

from ..producer import SharedStreamProducer

if TYPE_CHECKING:
    from ._backlog import BacklogProbe
from ._publish import Publisher, PublishNotSupported
from ._stream_settings import deprecated_names
from .dlq import DeadLetterReader, DeadLettersNotSupported

__all__ = ["ConfigT", "Connector"]

#: A connector's configuration model (a bare ``Connector`` is ``Connector[BaseModel]``).
ConfigT = TypeVar("ConfigT", bound=BaseModel, default=BaseModel)


class Connector(ABC, Generic[ConfigT]):
    """One broker's binding to the engine, found by name through entry points.

    A subclass names itself (``name``, the YAML's ``connector:``), its configuration
    model (``config_model``: it validates the stream's block, every field except
    ``connector``, and refuses unsafe settings before anything connects), which of
    its fields pick the upstream (:meth:`key`) and how to build a producer
    (:meth:`producer`). Everything else (coercing a configuration, the shared stream
    key, the description) is done here, the same way for every broker.
    """

    name: ClassVar[str]
    config_model: type[ConfigT]

    # -- what a broker writes

    @classmethod
    @abstractmethod
    def key(cls, config: ConfigT) -> tuple[Hashable, ...]:
        """The shared stream key: only the fields that pick the upstream."""

    @classmethod
    @abstractmethod
    def producer(cls, config: ConfigT) -> SharedStreamProducer:
        """A new producer for one group's poll; it must connect lazily.

        Beyond the required methods, a producer may say what it did
        (``counters()``) and whether its broker answers (``broker_problem()``: why it
        cannot be reached now, or ``None``; ``/readyz`` then reports the stream not
        ready). A :class:`~acklane.core.connectors.Reachability` keeps the latter.
        """

    @classmethod
    def description(cls, config: ConfigT) -> str:
        """A one-line, secret-free description for logs and the CLI."""
        return f"{cls.name} {cls.key(config)!r}"

    @classmethod
    def publisher(cls, config: ConfigT, *, destination: str | None = None) -> Publisher:
        """A :class:`Publisher` that sends messages where this stream reads them.

        Optional (``acklane publish``): the default raises :class:`PublishNotSupported`.
        ``destination`` picks one when the stream reads several (a Kafka topic) or
        names another one (a Pub/Sub topic); ``None``: the stream's own.
        """
        raise PublishNotSupported(
            f"the {cls.name} connector cannot publish messages (it has no publisher)"
        )

    @classmethod
    def backlog_probe(cls, config: ConfigT) -> BacklogProbe | None:
        """A :class:`~acklane.core.observe.lag.BacklogProbe` that reads how much waits for
        the stream on the broker (``acklane_stream_lag``, ``/readyz``, progress lines).

        Optional: the default, ``None``, means "this connector cannot tell". The probe
        has clients of its own (never the producer's), connects lazily on its first
        read, and changes nothing on the broker.
        """
        return None

    @classmethod
    def dead_letter_reader(
        cls, config: ConfigT, *, options: Mapping[str, Any] | None = None
    ) -> DeadLetterReader:
        """A :class:`~acklane.core.connectors.dlq.DeadLetterReader` of the stream's
        dead-letter destination (``acklane dlq``); it must connect lazily.

        Optional: the default raises :class:`DeadLettersNotSupported`. ``options``
        are the command line's broker-specific choices (``subscription``: the
        Pub/Sub subscription that reads the dead-letter topic).
        """
        raise DeadLettersNotSupported(
            f"the {cls.name} connector cannot read its dead letters (it has no reader)"
        )

    @classmethod
    def offline_problems(cls, config: ConfigT) -> Sequence[tuple[str, str]]:
        """What ``acklane validate`` can find wrong without the network, as
        ``(field, message)`` pairs: a certificate file that does not exist, say.

        Optional: the default finds nothing. Never connects, never raises.
        """
        return ()

    @classmethod
    async def check_connection(cls, config: ConfigT, *, call_timeout: float) -> str | None:
        """Reach the broker as ``acklane validate --connect`` does, cheaply, changing
        nothing: no message is received, sent, settled or committed.

        Returns a short account of what was found (``"cluster abc: topics orders,
        orders.dlq exist"``). Raises when the broker cannot be used: an error whose
        message says why and names the setting to check (a
        :class:`~acklane.core.errors.BrokerAuthError` for refused credentials or
        permissions). Each call to the broker is bounded by ``call_timeout`` seconds (the
        caller bounds the whole check too). The default returns None: "this
        connector has no connection check".
        """
        return None

    # -- what the engine, the YAML loader and the triggers call

    @classmethod
    def config(cls, config: ConfigT | Mapping[str, Any]) -> ConfigT:
        """The configuration itself, or validated from a mapping holding its fields.

        Keys of the mapping that are not fields of ``config_model`` (nor old names it
        still reads) are ignored (a trigger's kwargs carry its subclass's own fields
        too); a YAML stream block is
        validated with ``config_model`` directly, where an unknown key is an error.
        """
        model = cls.config_model
        if isinstance(config, model):
            return config
        if isinstance(config, Mapping):
            fields = {*model.model_fields, *deprecated_names(model)}  # old names still read
            return model.model_validate({k: v for k, v in config.items() if k in fields})
        raise TypeError(
            f"connector {cls.name!r}: expected a {model.__name__} or a mapping of its fields, "
            f"got {type(config).__name__}"
        )

    @classmethod
    def stream_key(cls, config: ConfigT | Mapping[str, Any]) -> tuple[Hashable, ...]:
        """The shared stream key of a configuration (or of a mapping of its fields)."""
        return cls.key(cls.config(config))

    @classmethod
    def create_producer(cls, config: ConfigT | Mapping[str, Any]) -> SharedStreamProducer:
        """A new producer for one group's poll, from a configuration or its fields."""
        return cls.producer(cls.config(config))

    @classmethod
    def create_publisher(
        cls, config: ConfigT | Mapping[str, Any], *, destination: str | None = None
    ) -> Publisher:
        """A new publisher to the stream's upstream, from a configuration or its fields."""
        return cls.publisher(cls.config(config), destination=destination)

    @classmethod
    def create_dead_letter_reader(
        cls, config: ConfigT | Mapping[str, Any], *, options: Mapping[str, Any] | None = None
    ) -> DeadLetterReader:
        """A new reader of the stream's dead letters, from a configuration or its fields."""
        return cls.dead_letter_reader(cls.config(config), options=options)

    @classmethod
    def describe(cls, config: ConfigT | Mapping[str, Any]) -> str:
        """A one-line, secret-free description of a configuration (or of its fields)."""
        return cls.description(cls.config(config))
