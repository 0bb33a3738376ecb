"""The ``airflow`` sink against a real Apache Airflow 3.3.2 API server.

One server for the session (tests/conftest.py's ``airflow_server``: ``db migrate``
on SQLite, the DAGs of tests/airflow_dags stored, ``airflow api-server`` on a free
port, the simple auth manager's users). The sink is driven by calling its methods;
what Airflow got is read back through its REST API. Each test's events carry ids of
their own, so the tests share the assets without seeing each other's events.

Needs the ``airflow`` dependency group (``uv run --group airflow pytest -m airflow``).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from acklane.core.sinks import Delivery, RefusedDelivery, RetryableDelivery, SinkContext, SinkError
from acklane.core.sinks.airflow import AirflowSink, AirflowSinkSettings, CredentialsRefused
from acklane.integration.airflow import AirflowServer
from acklane.integration.emulator import free_port
from acklane.integration.testing import eventually

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(180)]

#: The watchers the sink serves: ``orders`` feeds the asset of that name.
CONTEXT = SinkContext(watcher_assets={"orders": "orders", "untagged": None})
URI = "s3://acklane-tests/orders.csv"


def delivery(payload: Any, *, attempt: int = 1, watcher: str = "orders") -> Delivery:
    """A stored event of its own (a fresh event id)."""
    unique = uuid.uuid4().hex
    return Delivery(
        event_id=f"ev_{unique}",
        store_id=1,
        watcher=watcher,
        stream="orders-topic",
        message_id=f"m-{unique[:8]}",
        position=7,
        payload=payload,
        created_at=datetime.now(UTC),
        attempt=attempt,
    )


def sink_for(server: AirflowServer, **fields: Any) -> AirflowSink:
    settings: dict[str, Any] = {
        "name": "to-airflow",
        "kind": "airflow",
        "url": server.url,
        "username": server.admin.username,
        "password": server.admin.password,
        **fields,
    }
    if "token" in fields:
        del settings["username"], settings["password"]
    return AirflowSink(AirflowSinkSettings.model_validate(settings), CONTEXT)


async def events_of(server: AirflowServer, d: Delivery, **asset: str) -> list[dict[str, Any]]:
    async with server.rest() as api:
        return await api.events_with_id(d.event_id, **(asset or {"name": "orders"}))


# -- delivery ---------------------------------------------------------------------------------


async def test_an_event_becomes_one_asset_event_with_its_payload_and_acklanes_fields(
    airflow_server: AirflowServer,
) -> None:
    d = delivery({"order": 42, "amount": 10.5})
    async with sink_for(airflow_server) as sink:
        assert await sink.deliver([d]) == [None]
    (event,) = await events_of(airflow_server, d)
    assert event["extra"] == {
        "order": 42,
        "amount": 10.5,
        "acklane": {**d.acklane_fields(), "payload_wrapped": False},
        "from_rest_api": True,  # Airflow's own mark
    }


async def test_with_tracing_on_the_extra_carries_the_delivery_spans_traceparent(
    airflow_server: AirflowServer,
) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from acklane.core.config import TracingSettings
    from acklane.core.observe import tracing

    exporter = InMemorySpanExporter()
    tracer = tracing.start_tracing(TracingSettings(enabled=True), {}, exporter=exporter)
    d = delivery({"order": 43})
    async with sink_for(airflow_server) as sink:
        sink.spans_from = tracer
        assert await sink.deliver([d]) == [None]
    (span,) = exporter.get_finished_spans()
    assert span.name == "deliver to-airflow"
    (event,) = await events_of(airflow_server, d)
    ours = event["extra"]["acklane"]
    version, trace_id, span_id, _flags = ours["traceparent"].split("-")
    assert (version, trace_id, span_id) == (
        "00",
        f"{span.context.trace_id:032x}",
        f"{span.context.span_id:016x}",
    )
    assert ours["event_id"] == d.event_id


async def test_a_payload_that_is_not_an_object_is_kept_under_payload(
    airflow_server: AirflowServer,
) -> None:
    d = delivery([1, "two", None])
    async with sink_for(airflow_server) as sink:
        assert await sink.deliver([d]) == [None]
    (event,) = await events_of(airflow_server, d)
    assert event["extra"]["payload"] == [1, "two", None]
    assert event["extra"]["acklane"]["payload_wrapped"] is True


async def test_a_payload_with_an_acklane_key_is_kept_whole_under_payload(
    airflow_server: AirflowServer,
) -> None:
    d = delivery({"acklane": "the payload's own", "order": 1})
    async with sink_for(airflow_server) as sink:
        assert await sink.deliver([d]) == [None]
    (event,) = await events_of(airflow_server, d)
    assert event["extra"]["payload"] == {"acklane": "the payload's own", "order": 1}
    assert event["extra"]["acklane"]["event_id"] == d.event_id


async def test_an_asset_named_by_uri_receives_the_event(airflow_server: AirflowServer) -> None:
    d = delivery({"order": 7})
    async with sink_for(airflow_server, asset_uri=URI) as sink:
        assert await sink.deliver([d]) == [None]
    assert len(await events_of(airflow_server, d, uri=URI)) == 1
    assert await events_of(airflow_server, d, name="orders") == []


async def test_a_sink_asset_overrides_the_watchers(airflow_server: AirflowServer) -> None:
    d = delivery({"order": 8}, watcher="untagged")  # a watcher without an asset
    async with sink_for(airflow_server, asset="orders-by-uri") as sink:
        assert await sink.deliver([d]) == [None]
    assert len(await events_of(airflow_server, d, name="orders-by-uri")) == 1


# -- credentials ------------------------------------------------------------------------------


async def test_a_revoked_token_is_replaced_by_a_fresh_login_and_the_event_delivered(
    airflow_server: AirflowServer,
) -> None:
    first, second = delivery({"n": 1}), delivery({"n": 2})
    async with sink_for(airflow_server) as sink, airflow_server.rest() as api:
        assert await sink.deliver([first]) == [None]
        old = sink._client._token  # type: ignore[union-attr]  # the token the sink logged in for
        assert old
        await api.revoke(old)  # Airflow now answers 403 "Invalid JWT token" to it
        assert await sink.deliver([second]) == [None]
        assert sink._client._token not in (None, old)  # type: ignore[union-attr]
    assert len(await events_of(airflow_server, second)) == 1


async def test_a_wrong_token_is_retryable_as_credentials_refused_without_the_token(
    airflow_server: AirflowServer,
) -> None:
    token = "not-a-jwt-" + uuid.uuid4().hex
    d = delivery({"n": 1})
    async with sink_for(airflow_server, token=token) as sink:
        (result,) = await sink.deliver([d])
    assert isinstance(result, CredentialsRefused) and isinstance(result, RetryableDelivery)
    assert "credentials refused" in result.reason and "the configured token" in result.reason
    assert token not in result.reason and token not in repr(result)
    assert await events_of(airflow_server, d) == []


async def test_a_wrong_password_is_retryable_as_credentials_refused_without_the_password(
    airflow_server: AirflowServer,
) -> None:
    password = "wrong-" + uuid.uuid4().hex
    d = delivery({"n": 1})
    sink = sink_for(airflow_server, password=password)
    async with sink:
        (result,) = await sink.deliver([d])
    assert isinstance(result, CredentialsRefused)
    assert f"credentials refused by Airflow (user {airflow_server.admin.username!r})" in (
        result.reason
    )
    assert password not in result.reason and password not in repr(sink)
    assert password not in repr(sink.settings)
    assert await events_of(airflow_server, d) == []


async def test_a_user_without_permission_to_post_is_held_retryably(
    airflow_server: AirflowServer,
) -> None:
    d = delivery({"n": 1})
    viewer = airflow_server.viewer
    async with sink_for(airflow_server, username=viewer.username, password=viewer.password) as sink:
        (result,) = await sink.deliver([d])
    assert type(result) is RetryableDelivery  # held, not parked: a permission is fixable
    assert "403" in result.reason and "may not create asset events" in result.reason
    assert await events_of(airflow_server, d) == []


# -- what Airflow cannot take -----------------------------------------------------------------


async def test_an_unknown_asset_is_retryable_with_its_name(airflow_server: AirflowServer) -> None:
    async with sink_for(airflow_server, asset="no-such-asset") as sink:
        (result,) = await sink.deliver([delivery({"n": 1})])
    assert type(result) is RetryableDelivery
    assert "'no-such-asset'" in result.reason and "is the DAG that uses it parsed?" in result.reason


async def test_a_payload_json_cannot_carry_is_refused_before_anything_is_sent(
    airflow_server: AirflowServer,
) -> None:
    # Airflow would store NaN as null: the event would arrive changed
    d = delivery({"ratio": float("nan")})
    async with sink_for(airflow_server) as sink:
        (result,) = await sink.deliver([d])
    assert isinstance(result, RefusedDelivery)
    assert d.event_id in result.reason and "cannot be sent as JSON" in result.reason
    assert await events_of(airflow_server, d) == []


async def test_an_unreachable_airflow_is_retryable(airflow_server: AirflowServer) -> None:
    sink = sink_for(airflow_server, url=f"http://127.0.0.1:{free_port()}", timeout=5)
    async with sink:
        (result,) = await sink.deliver([delivery({"n": 1})])
    assert type(result) is RetryableDelivery and "cannot connect" in result.reason


# -- exactly once -----------------------------------------------------------------------------


async def test_delivered_already_finds_an_event_posted_before_and_not_one_never_sent(
    airflow_server: AirflowServer,
) -> None:
    sent, unsent = delivery({"n": 1}), delivery({"n": 2})
    async with sink_for(airflow_server) as sink:
        assert await sink.deliver([sent]) == [None]
    async with sink_for(airflow_server) as restarted:  # as after a crash: nothing cached
        assert await restarted.delivered_already([sent, unsent]) == {sent.event_id}


async def test_delivered_already_searches_from_the_window_before_the_event_was_stored(
    airflow_server: AirflowServer,
) -> None:
    sent = delivery({"n": 1})
    async with sink_for(airflow_server) as sink:
        assert await sink.deliver([sent]) == [None]
        # stored by a clock 2 h ahead of Airflow's: the default window (1 h) misses it
        later = Delivery(**{**_fields(sent), "created_at": sent.created_at + timedelta(hours=2)})
        assert await sink.delivered_already([later]) == set()
    async with sink_for(airflow_server, lookup_window="3h") as wider:
        assert await wider.delivered_already([later]) == {sent.event_id}


async def test_a_retry_of_an_event_airflow_already_has_is_not_posted_again(
    airflow_server: AirflowServer,
) -> None:
    d = delivery({"n": 1})
    async with sink_for(airflow_server) as sink:
        assert await sink.deliver([d]) == [None]
        # the first attempt got through but its answer was lost (a timeout, a reset)
        retry = Delivery(**{**_fields(d), "attempt": 2})
        assert await sink.deliver([retry]) == [None]
    assert len(await events_of(airflow_server, d)) == 1


async def test_delivered_already_pages_through_more_events_than_one_page_holds(
    airflow_server: AirflowServer,
) -> None:
    # Airflow caps a page at 100 events: the one looked up comes after them
    fillers = [delivery({"filler": n}) for n in range(101)]
    target = delivery({"n": "target"})
    async with sink_for(airflow_server, asset_uri=URI) as sink:
        for d in [*fillers, target]:
            assert await sink.deliver([d]) == [None]
        looked_up = Delivery(**{**_fields(target), "created_at": fillers[0].created_at})
        assert await sink.delivered_already([looked_up]) == {target.event_id}


def _fields(d: Delivery) -> dict[str, Any]:
    return {name: getattr(d, name) for name in Delivery.__dataclass_fields__}


# -- check ------------------------------------------------------------------------------------


async def test_check_passes_with_good_credentials_and_an_existing_asset(
    airflow_server: AirflowServer,
) -> None:
    await sink_for(airflow_server, asset_uri=URI).check()


async def test_check_passes_for_the_watchers_assets_with_good_credentials(
    airflow_server: AirflowServer,
) -> None:
    await sink_for(airflow_server).check()


async def test_check_fails_naming_an_asset_airflow_lacks(airflow_server: AirflowServer) -> None:
    with pytest.raises(SinkError, match=r"sink to-airflow: .* no active asset 'no-such-asset'"):
        await sink_for(airflow_server, asset="no-such-asset").check()


async def test_check_fails_naming_refused_credentials_without_the_password(
    airflow_server: AirflowServer,
) -> None:
    password = "wrong-" + uuid.uuid4().hex
    with pytest.raises(SinkError, match="credentials refused") as caught:
        await sink_for(airflow_server, password=password).check()
    assert password not in str(caught.value)


async def test_check_fails_on_a_wrong_token_for_the_watchers_assets(
    airflow_server: AirflowServer,
) -> None:
    with pytest.raises(SinkError, match="credentials refused"):
        await sink_for(airflow_server, token="not-a-jwt-" + uuid.uuid4().hex).check()


async def test_check_fails_when_airflow_is_unreachable(airflow_server: AirflowServer) -> None:
    with pytest.raises(SinkError, match="cannot connect"):
        await sink_for(airflow_server, url=f"http://127.0.0.1:{free_port()}").check()


# -- what it is for ----------------------------------------------------------------------------


async def test_a_delivered_event_makes_an_asset_triggered_dag_run_that_succeeds(
    airflow_server: AirflowServer,
) -> None:
    # last in the file: the scheduler, once started, runs until the session ends
    d = delivery({"order": "for-a-dag-run"})
    async with sink_for(airflow_server, asset_uri=URI) as sink:
        assert await sink.deliver([d]) == [None]
    airflow_server.start_component("scheduler")
    async with airflow_server.rest() as api:

        async def run_succeeded() -> bool:
            airflow_server.check_alive()
            runs = await api.dag_runs("acklane_sink_orders_by_uri")
            return any(r["state"] == "success" for r in runs)

        await eventually(run_succeeded, "a successful run of acklane_sink_orders_by_uri", 120)
        runs = await api.dag_runs("acklane_sink_orders_by_uri")
    assert {r["run_type"] for r in runs} == {"asset_triggered"}
