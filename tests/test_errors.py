"""One error root: every exception acklane's distributions define is an ``AcklaneError``.

The classes are collected by importing every module under the ``acklane`` namespace
(core, the memory connector, every installed connector, the integration package), so
a new error class fails :func:`test_every_error_class_is_classified` until it is given
its branch in ``BRANCHES``. Private classes (``_CliError``) never leave their module
and are not collected.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from pathlib import Path
from types import ModuleType

import pytest

import acklane
import acklane.core
from acklane.core import (
    AcklaneError,
    ConfigError,
    ConnectorError,
    SharedStreamError,
    StateStoreError,
)
from acklane.core.config import parse_config
from acklane.core.connectors import load_connector
from acklane.core.stores import encode_value, validate_key

#: Every public exception class of the distributions (``module.QualName``) -> the
#: branch of the hierarchy it must derive from (``AcklaneError`` itself: directly
#: beneath the root).
BRANCHES: dict[str, type[AcklaneError]] = {
    # the root and its branches
    "acklane.core.errors.AcklaneError": AcklaneError,
    "acklane.core.errors.ConfigError": ConfigError,
    "acklane.core.errors.ConnectorError": ConnectorError,
    "acklane.core.errors.StateStoreError": StateStoreError,
    "acklane.core.errors.SharedStreamError": SharedStreamError,
    # configuration
    "acklane.core.pipeline.filters.FilterSpecError": AcklaneError,
    # connectors
    "acklane.core.connectors._registry.UnknownConnector": ConnectorError,
    "acklane.core.errors.BrokerAuthError": ConnectorError,
    # the kinds every connector's errors branch by (its error map raises them)
    "acklane.core.errors.ReceiveError": ConnectorError,
    "acklane.core.errors.AdvanceError": ConnectorError,
    "acklane.core.errors.DeadLetterRefused": ConnectorError,
    "acklane.core.errors.BrokerUnreachable": ConnectorError,
    "acklane.core.connectors._publish.PublishNotSupported": ConnectorError,
    "acklane.core.connectors._publish.PublishError": ConnectorError,
    "acklane.connectors.kafka._errors.KafkaReceiveError": ConnectorError,
    "acklane.connectors.kafka._errors.KafkaAdvanceError": ConnectorError,
    "acklane.connectors.sqs._producer.SqsConnectorError": ConnectorError,
    "acklane.connectors.sqs._producer.SqsAdvanceError": ConnectorError,
    "acklane.connectors.pubsub._producer.PubSubConnectorError": ConnectorError,
    "acklane.connectors.servicebus._producer.ServiceBusConnectorError": ConnectorError,
    "acklane.connectors.memory._broker.MemoryCommitRefused": ConnectorError,
    # state stores
    "acklane.core.stores._errors.InvalidKeyError": StateStoreError,
    "acklane.core.stores._errors.InvalidValueError": StateStoreError,
    "acklane.core.stores._errors.ValueTooLargeError": StateStoreError,
    "acklane.core.stores._errors.ValueTypeError": StateStoreError,
    "acklane.core.stores._errors.AssetInactiveError": StateStoreError,
    "acklane.core.stores._errors.OffloadedValueMissingError": StateStoreError,
    # the engine's subscribers
    "acklane.core.trigger.AckTimeout": SharedStreamError,
    "acklane.core.trigger.SubscriberOverflow": SharedStreamError,
    "acklane.core.trigger.StreamEnded": SharedStreamError,
    "acklane.core.pipeline._cohort.WatcherLeft": SharedStreamError,
    # the runner gave up: engine.max_restarts
    "acklane.core.pipeline._cohort.RestartsExhausted": AcklaneError,
    # the event store's database
    "acklane.core.events._store.StoreUnavailable": AcklaneError,
    "acklane.core.observe.metrics.MetricsPortUnavailable": AcklaneError,
    # the data a filter reads
    "acklane.core.message.BodyDecodeError": AcklaneError,
    # sinks
    "acklane.core.sinks._base.SinkError": AcklaneError,
    "acklane.core.sinks._base.DeliveryError": AcklaneError,
    "acklane.core.sinks._base.RetryableDelivery": AcklaneError,
    "acklane.core.sinks._base.RefusedDelivery": AcklaneError,
    "acklane.core.sinks._registry.UnknownSinkKind": AcklaneError,
    "acklane.core.sinks._outbox.LeaseLost": AcklaneError,
    "acklane.core.sinks.webhook.SignatureError": AcklaneError,
    "acklane.core.sinks._airflow_client.UnsureDelivery": AcklaneError,
    "acklane.core.sinks._airflow_client.CredentialsRefused": AcklaneError,
    "acklane.integration.airflow.AirflowServerError": AcklaneError,
    "acklane.integration.airflow.AirflowNotInstalled": AcklaneError,
    # tracing configured without OpenTelemetry installed
    "acklane.core.observe.tracing.TracingUnavailable": AcklaneError,
    # tooling: the demo and the emulators
    "acklane.core.cli.demo.DemoBrokerUnavailable": AcklaneError,
    "acklane.core.cli.demo.UnknownDemoBroker": AcklaneError,
    "acklane.integration.emulator.EmulatorError": AcklaneError,
    # the emulators' own refusals (answered to their clients as the service would)
    "acklane.integration.pubsub._filter.FilterError": AcklaneError,
    "acklane.integration.pubsub._schemas.SchemaError": AcklaneError,
    "acklane.integration.servicebus._rules.RuleError": AcklaneError,
    "acklane.integration.schema_registry.RegistryError": AcklaneError,
    "acklane.integration._avro_compat.AvroSchemaError": AcklaneError,
    "acklane.connectors.kafka._formats.SchemaRegistryUnavailable": ConnectorError,
    "acklane.core.connectors.dlq.DeadLettersNotSupported": ConnectorError,
}
# acklane-airflow is installed with the `airflow` group only; its other modules import
# Airflow, so the walk below imports just its errors module (and its lazy package).
AIRFLOW_ERRORS = "acklane.airflow._errors"
if importlib.util.find_spec("acklane.airflow") is not None:
    BRANCHES[f"{AIRFLOW_ERRORS}.AirflowTriggerError"] = AcklaneError

#: The built-in bases callers caught before the common root; they must keep working.
BUILTIN_BASES: dict[str, type[Exception]] = {
    "acklane.core.errors.ReceiveError": RuntimeError,
    "acklane.core.errors.AdvanceError": RuntimeError,
    "acklane.core.errors.ConfigError": ValueError,
    "acklane.core.pipeline.filters.FilterSpecError": ValueError,
    "acklane.core.message.BodyDecodeError": ValueError,
    "acklane.core.connectors._registry.UnknownConnector": LookupError,
    "acklane.connectors.kafka._errors.KafkaReceiveError": RuntimeError,
    "acklane.connectors.kafka._errors.KafkaAdvanceError": RuntimeError,
    "acklane.connectors.sqs._producer.SqsConnectorError": RuntimeError,
    "acklane.connectors.sqs._producer.SqsAdvanceError": RuntimeError,
    "acklane.connectors.memory._broker.MemoryCommitRefused": RuntimeError,
    "acklane.core.stores._errors.InvalidKeyError": ValueError,
    "acklane.core.stores._errors.InvalidValueError": ValueError,
    "acklane.core.stores._errors.ValueTypeError": TypeError,
    "acklane.core.stores._errors.AssetInactiveError": RuntimeError,
    "acklane.core.stores._errors.OffloadedValueMissingError": LookupError,
    "acklane.core.cli.demo.DemoBrokerUnavailable": RuntimeError,
    "acklane.core.events._store.StoreUnavailable": RuntimeError,
    "acklane.core.observe.metrics.MetricsPortUnavailable": OSError,
    "acklane.core.cli.demo.UnknownDemoBroker": LookupError,
    "acklane.integration.emulator.EmulatorError": RuntimeError,
    "acklane.core.sinks._registry.UnknownSinkKind": LookupError,
    "acklane.core.sinks.webhook.SignatureError": ValueError,
    "acklane.core.observe.tracing.TracingUnavailable": RuntimeError,
    "acklane.integration._avro_compat.AvroSchemaError": ValueError,
}


def _module_names() -> list[str]:
    """Every module under the ``acklane`` namespace, on every path it spans.

    Walks files rather than ``pkgutil.walk_packages``, which does not descend into
    the PEP 420 namespace ``acklane.connectors``.
    """
    names: set[str] = set()
    for root in map(Path, acklane.__path__):
        for path in root.rglob("*.py"):
            parts = ["acklane", *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            if name.startswith("acklane.airflow.") and name != AIRFLOW_ERRORS:
                continue  # imports Airflow (7-10 s, and it needs AIRFLOW_HOME set first)
            if parts[-1] != "__main__":
                names.add(name)
    return sorted(names)


def _modules() -> list[ModuleType]:
    return [importlib.import_module(name) for name in _module_names()]


def _error_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module in _modules():
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and issubclass(obj, BaseException)
                and obj.__module__ == module.__name__
                and not obj.__name__.startswith("_")
            ):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


ERRORS = _error_classes()


def test_the_walk_reaches_every_distribution() -> None:
    prefixes = {name.rsplit(".", 1)[0] for name in ERRORS}
    for expected in (
        "acklane.core.errors",
        "acklane.connectors.kafka._errors",
        "acklane.connectors.sqs._producer",
        "acklane.integration.emulator",
    ):
        assert expected in prefixes


def test_every_error_class_is_classified() -> None:
    unclassified = sorted(set(ERRORS) - set(BRANCHES))
    assert not unclassified, f"give these error classes a branch in BRANCHES: {unclassified}"
    gone = sorted(set(BRANCHES) - set(ERRORS))
    assert not gone, f"no longer defined, drop them from BRANCHES: {gone}"


@pytest.mark.parametrize(
    "name",
    sorted(BRANCHES),
)
def test_each_error_is_an_acklane_error_under_its_branch(name: str) -> None:
    cls = ERRORS[name]
    assert issubclass(cls, AcklaneError)
    assert issubclass(cls, BRANCHES[name])
    # one branch only: a connector error is not also a config error, and so on
    branches = (ConfigError, ConnectorError, StateStoreError, SharedStreamError)
    assert [b for b in branches if issubclass(cls, b)] == (
        [] if BRANCHES[name] is AcklaneError else [BRANCHES[name]]
    )


@pytest.mark.parametrize("name", sorted(BUILTIN_BASES))
def test_the_builtin_bases_callers_caught_before_still_hold(name: str) -> None:
    assert issubclass(ERRORS[name], BUILTIN_BASES[name])


def test_connector_errors_live_under_connector_error() -> None:
    for name, cls in ERRORS.items():
        if name.startswith("acklane.connectors."):
            assert issubclass(cls, ConnectorError), name


def test_the_old_import_paths_still_work() -> None:
    from acklane.connectors.kafka import KafkaAdvanceError, KafkaReceiveError
    from acklane.connectors.sqs import SqsAdvanceError, SqsConnectorError
    from acklane.core.config import ConfigError as ConfigErrorFromConfig
    from acklane.core.connectors import UnknownConnector
    from acklane.core.stores import StateStoreError as StateStoreErrorFromStores
    from acklane.core.trigger import AckTimeout, StreamEnded, SubscriberOverflow
    from acklane.core.trigger import SharedStreamError as SharedStreamErrorFromTrigger

    assert ConfigErrorFromConfig is ConfigError
    assert StateStoreErrorFromStores is StateStoreError
    assert SharedStreamErrorFromTrigger is SharedStreamError
    connector_errors: list[type[Exception]] = [
        KafkaAdvanceError,
        KafkaReceiveError,
        SqsAdvanceError,
        SqsConnectorError,
        UnknownConnector,
    ]
    assert all(issubclass(cls, ConnectorError) for cls in connector_errors)
    stream_errors: list[type[Exception]] = [AckTimeout, StreamEnded, SubscriberOverflow]
    assert all(issubclass(cls, SharedStreamError) for cls in stream_errors)


def test_the_root_classes_are_exported_from_acklane_core() -> None:
    for name in (
        "AcklaneError",
        "ConfigError",
        "ConnectorError",
        "SharedStreamError",
        "StateStoreError",
    ):
        assert name in acklane.core.__all__
        assert getattr(acklane.core, name) is getattr(acklane.core.errors, name)


# -- except AcklaneError catches real errors -----------------------------------------


def test_except_acklane_error_catches_a_config_error() -> None:
    try:
        parse_config("- just\n- a list\n", source="bad.yaml")
    except AcklaneError as exc:
        caught: AcklaneError = exc
    else:  # pragma: no cover - the assertion below says what went wrong
        pytest.fail("an invalid configuration raised nothing")
    assert isinstance(caught, ConfigError)
    assert "bad.yaml" in str(caught)


def test_except_acklane_error_catches_a_config_error_naming_an_unknown_connector() -> None:
    with pytest.raises(AcklaneError) as info:
        parse_config("streams:\n  s:\n    connector: no-such-broker\nwatchers: []\n")
    assert isinstance(info.value, ConfigError)


def test_except_acklane_error_catches_state_store_errors() -> None:
    with pytest.raises(AcklaneError) as info:
        validate_key("")
    assert isinstance(info.value, StateStoreError)
    with pytest.raises(AcklaneError) as info:
        encode_value("k", {"x": math.nan}, max_bytes=None)
    assert isinstance(info.value, StateStoreError)
    with pytest.raises(AcklaneError) as info:
        encode_value("k", "x" * 100, max_bytes=10)
    assert isinstance(info.value, StateStoreError)


def test_except_acklane_error_catches_a_connector_error() -> None:
    with pytest.raises(AcklaneError) as info:
        load_connector("no-such-broker")
    assert isinstance(info.value, ConnectorError)
    # and what caught it before still does
    with pytest.raises(LookupError):
        load_connector("no-such-broker")
