"""acklane's Airflow triggers without a broker: kwargs, keys, connections, reasons.

Airflow is imported by a fixture (AIRFLOW_HOME a temp dir first), never at
collection. Needs the ``airflow`` dependency group.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from acklane.core.producer import AdvanceItem, SharedStreamProducer

pytestmark = pytest.mark.airflow

KAFKA = {"topics": ["orders", "audit"], "group_id": "g1", "dead_letter": "orders-dlq"}
SQS = {"queue_url": "http://127.0.0.1:5000/123456789012/orders", "wait_time_seconds": 1}
PUBSUB = {"project": "p1", "subscription": "orders-sub", "dead_letter": "orders-dlq"}
SERVICEBUS = {"queue": "orders", "max_wait_time": 1}
FILTER = {
    "match": {"body.type": "order"},
    "reject": {"body.amount": {"lt": 0}},
    "emit": {"id": "body.id"},
}


@pytest.fixture(scope="session")
def aa(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """acklane.airflow's trigger classes and the Airflow modules the tests use."""
    old_home = os.environ.get("AIRFLOW_HOME")
    os.environ.setdefault("AIRFLOW_HOME", str(tmp_path_factory.mktemp("airflow-home")))
    try:
        pytest.importorskip("airflow.triggers.base", reason="Airflow is not installed")
        from airflow.sdk import Asset, AssetWatcher, Connection
        from airflow.serialization.decoders import smart_decode_trigger_kwargs
        from airflow.serialization.encoders import encode_trigger
        from airflow.serialization.serialized_objects import BaseSerialization
        from airflow.triggers import base, shared_stream

        import acklane.airflow as package
        from acklane.airflow import _trigger

        yield SimpleNamespace(
            pkg=package,
            internals=_trigger,
            Kafka=package.KafkaEventTrigger,
            Sqs=package.SqsEventTrigger,
            PubSub=package.PubSubEventTrigger,
            ServiceBus=package.ServiceBusEventTrigger,
            Error=package.AirflowTriggerError,
            Asset=Asset,
            AssetWatcher=AssetWatcher,
            Connection=Connection,
            encode=encode_trigger,
            decode=smart_decode_trigger_kwargs,
            ser=BaseSerialization,
            base=base,
            ss=shared_stream,
        )
    finally:
        if old_home is None:
            os.environ.pop("AIRFLOW_HOME", None)
        else:
            os.environ["AIRFLOW_HOME"] = old_home


def _all(aa: SimpleNamespace) -> list[tuple[Any, dict[str, Any]]]:
    return [
        (aa.Kafka, {"conn_id": "kafka1", **KAFKA}),
        (aa.Kafka, {"bootstrap_servers": "127.0.0.1:9092", **KAFKA}),
        (aa.Sqs, {"conn_id": "aws1", **SQS}),
        (aa.Sqs, {"region": "eu-west-1", **SQS}),
        (aa.PubSub, {"conn_id": "gcp1", **PUBSUB}),
        (aa.PubSub, {"emulator_host": "127.0.0.1:8085", **PUBSUB}),
        (aa.ServiceBus, {"conn_id": "sb1", **SERVICEBUS}),
    ]


def test_every_trigger_round_trips_through_airflows_serialization(aa: SimpleNamespace) -> None:
    for cls, kwargs in _all(aa):
        trigger = cls(**kwargs, filter=FILTER, name="orders")
        watcher = aa.AssetWatcher(name="w", trigger=trigger)  # Airflow's own check passes
        encoded = aa.encode(watcher.trigger)
        assert (
            encoded["classpath"]
            == f"acklane.airflow.{cls.__module__.rsplit('.', 1)[1]}.{cls.__name__}"
        )
        stored = json.loads(json.dumps(aa.ser.serialize(encoded["kwargs"])))  # the database
        decoded = {k: aa.decode(v) for k, v in aa.ser.deserialize(stored).items()}
        again = cls(**decoded)
        assert again.serialize() == trigger.serialize()
        assert again.shared_stream_key() == trigger.shared_stream_key()
        assert aa.base.BaseEventTrigger.hash(*again.serialize()) == aa.base.BaseEventTrigger.hash(
            *trigger.serialize()
        )


def test_every_trigger_is_in_ack_mode_under_airflows_manager(aa: SimpleNamespace) -> None:
    for cls in (aa.Kafka, aa.Sqs, aa.PubSub, aa.ServiceBus):
        group = SimpleNamespace(trigger_class=cls)
        assert aa.ss._SharedStreamGroup._is_ack_required(group), cls


def test_triggers_of_one_upstream_share_a_key_whatever_their_filters(aa: SimpleNamespace) -> None:
    a = aa.Kafka(conn_id="kafka1", **KAFKA, filter=FILTER, name="a")
    b = aa.Kafka(conn_id="kafka1", **{**KAFKA, "topics": ["audit", "orders"]}, name="b")
    other_group = aa.Kafka(conn_id="kafka1", **{**KAFKA, "group_id": "g2"})
    other_conn = aa.Kafka(conn_id="kafka2", **KAFKA)
    assert a.shared_stream_key() == b.shared_stream_key()
    assert len({a.shared_stream_key(), other_group.shared_stream_key()}) == 2
    assert len({a.shared_stream_key(), other_conn.shared_stream_key()}) == 2
    # with every setting given, the key is acklane's own for the connector
    full = aa.Kafka(bootstrap_servers="b:1,a:1", **KAFKA)
    assert full.shared_stream_key() == (
        "acklane",
        "kafka",
        "kafka",
        "a:1,b:1",
        ("audit", "orders"),
        "g1",
    )


@pytest.mark.parametrize(
    ("broker", "kwargs", "named"),
    [
        ("Kafka", {"sasl_password": "s3cret-pass"}, "sasl_password"),
        ("Kafka", {"client": {"sasl.password": "s3cret-pass"}}, "client.sasl.password"),
        ("Sqs", {"aws_secret_access_key": "s3cret-key"}, "aws_secret_access_key"),
        (
            "ServiceBus",
            {"connection_string": "Endpoint=sb://x;SharedAccessKey=k"},
            "connection_string",
        ),
    ],
)
def test_secrets_are_refused_in_the_kwargs_and_the_error_fails_only_that_trigger(
    aa: SimpleNamespace, broker: str, kwargs: dict[str, Any], named: str
) -> None:
    base = {"Kafka": KAFKA, "Sqs": SQS, "ServiceBus": SERVICEBUS}[broker]
    with pytest.raises(aa.Error) as caught:
        getattr(aa, broker)(conn_id="c", **base, **kwargs)
    assert named in str(caught.value) and "connection" in str(caught.value)
    for value in kwargs.values():
        assert str(value) not in str(caught.value)
    # Airflow's triggerer fails just the trigger whose constructor raises a TypeError
    assert isinstance(caught.value, TypeError)


def test_bad_settings_and_filters_are_refused_when_the_dag_is_parsed(aa: SimpleNamespace) -> None:
    with pytest.raises(aa.Error, match="topicz: not a setting of kafka streams"):
        aa.Kafka(conn_id="c", topicz=["a"])
    with pytest.raises(aa.Error, match="bootstrap_servers: Field required"):
        aa.Kafka(**KAFKA)  # no connection: everything must be here
    with pytest.raises(aa.Error, match="did you mean 'body'"):
        aa.Kafka(conn_id="c", **KAFKA, filter={"match": {"bdy.type": "x"}})
    with pytest.raises(aa.Error, match="cannot import module"):
        aa.Kafka(conn_id="c", **KAFKA, filter="no_such_module_here:fn")


def test_a_filter_function_is_named_by_its_import_path_as_in_yaml(aa: SimpleNamespace) -> None:
    short = aa.Kafka(conn_id="c", **KAFKA, filter="json:loads")
    long = aa.Kafka(conn_id="c", **KAFKA, filter={"function": "json:loads"})
    assert short.serialize() == long.serialize()
    assert short.serialize()[1]["filter"] == {"function": "json:loads"}


def _conn(aa: SimpleNamespace, **fields: Any) -> Any:
    extra = fields.pop("extra", None)
    return aa.Connection(conn_id="c", extra=None if extra is None else json.dumps(extra), **fields)


def test_a_kafka_connection_gives_servers_group_and_credentials(aa: SimpleNamespace) -> None:
    conn = _conn(
        aa,
        conn_type="kafka",
        extra={
            "bootstrap.servers": "k1:9092,k2:9092",
            "group.id": "from-conn",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "user",
            "sasl.password": "s3cret-pass",
            "enable.auto.commit": "false",
            "fetch.wait.max.ms": 50,
        },
    )
    fields = aa.Kafka.connection_fields(conn, conn.extra_dejson)
    config = aa.Kafka.config_of({"topics": ["orders"], "dead_letter": "dlq"}, fields)
    assert config.bootstrap_servers == "k1:9092,k2:9092" and config.group_id == "from-conn"
    assert config.sasl_password.get_secret_value() == "s3cret-pass"
    assert config.client == {"enable.auto.commit": "false", "fetch.wait.max.ms": 50}
    settings = config.consumer_settings()
    assert settings["enable.auto.commit"] is False and settings["sasl.username"] == "user"
    # the trigger's own settings win over the connection's
    assert aa.Kafka.config_of({"topics": ["o"], "group_id": "mine"}, fields).group_id == "mine"
    with pytest.raises(aa.Error, match=r"enable\.auto\.commit"):
        on = {**fields, "client": {"enable.auto.commit": "true"}}
        aa.Kafka.config_of({"topics": ["orders"]}, on)


def test_an_aws_connection_gives_keys_region_and_endpoint(aa: SimpleNamespace) -> None:
    conn = _conn(
        aa,
        conn_type="aws",
        login="AKIDEXAMPLE",
        password="s3cret-key",
        extra={"region_name": "eu-west-1", "endpoint_url": "http://127.0.0.1:5000"},
    )
    config = aa.Sqs.config_of(SQS, aa.Sqs.connection_fields(conn, conn.extra_dejson))
    assert config.region == "eu-west-1" and config.endpoint_url == "http://127.0.0.1:5000"
    assert config.aws_access_key_id.get_secret_value() == "AKIDEXAMPLE"
    assert config.aws_secret_access_key.get_secret_value() == "s3cret-key"


def test_a_google_connection_gives_project_and_key_file(aa: SimpleNamespace) -> None:
    conn = _conn(
        aa, conn_type="google_cloud_platform", extra={"project": "p9", "key_path": "/k.json"}
    )
    kwargs = {"subscription": "orders-sub"}
    config = aa.PubSub.config_of(kwargs, aa.PubSub.connection_fields(conn, conn.extra_dejson))
    assert config.subscription_path == "projects/p9/subscriptions/orders-sub"
    assert config.credentials_file == "/k.json"
    inline = _conn(aa, conn_type="google_cloud_platform", extra={"keyfile_dict": {"k": "v"}})
    with pytest.raises(aa.Error, match="key_path"):
        aa.PubSub.connection_fields(inline, inline.extra_dejson)


def test_an_azure_service_bus_connection_gives_the_connection_string(aa: SimpleNamespace) -> None:
    text = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=s3cret"
    conn = _conn(aa, conn_type="azure_service_bus", schema=text)
    config = aa.ServiceBus.config_of(SERVICEBUS, aa.ServiceBus.connection_fields(conn, {}))
    assert config.namespace == "ns.servicebus.windows.net"
    identity = _conn(aa, conn_type="azure_service_bus", extra={"fully_qualified_namespace": "ns2"})
    fields = aa.ServiceBus.connection_fields(identity, identity.extra_dejson)
    assert aa.ServiceBus.config_of(SERVICEBUS, fields).credential == "default"


async def test_the_connection_is_read_when_the_poll_starts(
    aa: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra = {
        "bootstrap.servers": "k1:9092",
        "group.id": "g-conn",
        "sasl.username": "u",
        "sasl.password": "pw-12345",
    }
    monkeypatch.setenv(
        "AIRFLOW_CONN_ACKLANE_T1", json.dumps({"conn_type": "kafka", "extra": extra})
    )
    trigger = aa.Kafka(conn_id="acklane_t1", topics=["orders"])
    _, kwargs = trigger.serialize()
    assert "pw-12345" not in json.dumps(kwargs)  # the secret is never in the kwargs
    config = await aa.Kafka.aconfig(kwargs)
    assert config.bootstrap_servers == "k1:9092" and config.group_id == "g-conn"
    assert config.sasl_password.get_secret_value() == "pw-12345"


class _Inner(SharedStreamProducer):
    """Records what acklane's producer would be asked to advance."""

    def __init__(self) -> None:
        self.batches: list[list[AdvanceItem]] = []

    async def open_stream(self) -> Any:  # pragma: no cover - not opened here
        raise NotImplementedError
        yield

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        self.batches.append(list(batch))


def _producer(aa: SimpleNamespace, raws: list[Any]) -> Any:
    producer = aa.internals._AcklaneProducer(aa.Kafka, {"conn_id": "c", **KAFKA})
    producer.inner = _Inner()
    for i, raw in enumerate(raws):
        producer._pending[id(raw)] = aa.internals._Pending(raw, ("payload", i))
        producer._raw_of[id(producer._pending[id(raw)].payload)] = id(raw)
    return producer


async def test_a_reject_reason_given_under_airflows_manager_reaches_acklanes_producer(
    aa: SimpleNamespace,
) -> None:
    from acklane.core.producer import reject_reasons_of

    raws = [object(), object()]
    producer = _producer(aa, raws)
    assert producer.note_reject(raws[1], "watcher orders: reject rule matched")
    assert not producer.note_reject(object(), "not ours")
    airflow_outcomes = [
        aa.ss.AdvanceOutcome(acked=1, failed=0, rejected=0),
        aa.ss.AdvanceOutcome(acked=0, failed=0, rejected=1),  # Airflow's: no reasons
    ]
    payloads = [producer._pending[id(r)].payload for r in raws]
    await producer.advance(
        [AdvanceItem(p, o) for p, o in zip(payloads, airflow_outcomes, strict=True)]
    )
    (batch,) = producer.inner.batches
    assert [reject_reasons_of(item.outcome) for item in batch] == [
        (),
        ("watcher orders: reject rule matched",),
    ]
    assert [(i.outcome.acked, i.outcome.rejected) for i in batch] == [(1, 0), (0, 1)]
    assert producer._pending == {} and producer._raw_of == {}  # nothing kept past its advance


async def test_a_trigger_joining_a_poll_built_with_other_settings_is_refused(
    aa: SimpleNamespace,
) -> None:
    raw = object()
    producer = _producer(aa, [raw])
    key = producer.key
    aa.internals._LIVE.setdefault(key, []).append(producer)
    try:
        same = aa.Kafka(conn_id="c", **KAFKA, filter=FILTER)
        same._check_group_settings(key, raw)  # filters may differ
        other = aa.Kafka(conn_id="c", **{**KAFKA, "dead_letter": "elsewhere"})
        assert other.shared_stream_key() == key
        with pytest.raises(aa.Error, match=r"other settings \(dead_letter\)"):
            other._check_group_settings(key, raw)
    finally:
        await producer.aclose()
    assert key not in aa.internals._LIVE


def test_the_asset_store_acklanes_filters_use_is_airflows_asset_state_store(
    aa: SimpleNamespace,
) -> None:
    trigger = aa.Kafka(conn_id="c", **KAFKA)
    assert trigger.asset_store is None  # outside the triggerer
    store = object()
    trigger.asset_state_store = store  # what the triggerer injects
    assert trigger.asset_store is store


# -- both managers, on the Kafka emulator --------------------------------------------------------


@pytest.mark.parametrize("manager_kind", ["airflow", "acklane"])
@pytest.mark.timeout(90)
async def test_the_kafka_trigger_runs_under_both_managers_with_reasons_and_commits(
    aa: SimpleNamespace, kafka_kit: Any, manager_kind: str
) -> None:
    """Driven as Airflow's triggerer drives it: subscribe, filter, bind, confirm."""
    import asyncio
    import contextlib

    from acklane.core import manager as acklane_manager
    from acklane.core.connectors.deadletter import REJECT_REASON

    bodies = [
        json.dumps({"type": "order", "id": i, "amount": -1 if i == 2 else i}) for i in range(5)
    ]
    topic, dlq = kafka_kit.new_topic("both"), kafka_kit.new_topic("both-dlq")
    group = kafka_kit.unique("both")
    await asyncio.to_thread(kafka_kit.produce, topic, bodies)
    settings = {
        "bootstrap_servers": kafka_kit.bootstrap_servers,
        "topics": [topic],
        "group_id": group,
        "dead_letter": dlq,
        "poll_timeout": 0.05,
        "client": dict(kafka_kit.FAST_GROUP),
    }
    triggers = [
        aa.Kafka(**settings, filter=FILTER, name="orders"),  # rejects id 2
        aa.Kafka(**settings, filter={"emit": "body.id"}, name="all"),
    ]
    key = triggers[0].shared_stream_key()
    assert triggers[1].shared_stream_key() == key
    cls = (
        aa.ss.SharedStreamManager
        if manager_kind == "airflow"
        else acklane_manager.SharedStreamManager
    )
    manager = cls(max_subscriber_queue=64, ack_timeout=30.0, cohort_grace_period=0.3)
    fired: dict[int, list[Any]] = {0: [], 1: []}
    pending: list[int] = []

    async def watch(trigger_id: int) -> None:
        raw = manager.subscribe(trigger_id=trigger_id, trigger=triggers[trigger_id], key=key)
        try:
            async for event in triggers[trigger_id].filter_shared_stream(raw):
                seq = manager.bind_pending_event(trigger_id=trigger_id, key=key)
                fired[trigger_id].append(event.payload)
                if seq is not None:
                    pending.append(seq)
        finally:
            await manager.unsubscribe(trigger_id, key)

    async def persist() -> None:  # the metadata database, confirming in batches
        while True:
            await asyncio.sleep(0.05)
            seqs, pending[:] = list(pending), []
            if seqs:
                manager.confirm_persisted(seqs)

    tasks = [asyncio.create_task(watch(0)), asyncio.create_task(watch(1))]
    store = asyncio.create_task(persist())
    try:
        async with asyncio.timeout(60):
            while (await asyncio.to_thread(kafka_kit.committed, group, topic)).get(0) != 5:
                await asyncio.sleep(0.2)
    finally:
        for task in [*tasks, store]:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, store, return_exceptions=True)
        await manager.stop_all()
    assert sorted(p["id"] for p in fired[0]) == [0, 1, 3, 4]
    assert sorted(fired[1]) == [0, 1, 2, 3, 4]
    copies = await asyncio.to_thread(kafka_kit.read, dlq, 5, timeout=2.0)
    assert [dict(m.headers())[REJECT_REASON].decode() for m in copies] == [
        "watcher orders: reject rule matched: body.amount lt 0 (value: -1)"
    ]
