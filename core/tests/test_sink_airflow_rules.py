"""The ``airflow`` sink's pure rules: its settings, the extra's shape, what each status
of Airflow's means. What Airflow itself does is tests/test_sink_airflow.py's (a real
Airflow API server); nothing here talks to one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest
from pydantic import ValidationError

from acklane.core.sinks import Delivery, RefusedDelivery, RetryableDelivery, sink_class

# the Airflow client's reading of replies, without a server: no public name
from acklane.core.sinks._airflow_client import Reply, detail_of, retry_after_of
from acklane.core.sinks.airflow import (
    AirflowSink,
    AirflowSinkSettings,
    UnsureDelivery,
    encode_extra,
    event_extra,
    outcome_of,
)

BASE = {"name": "af", "kind": "airflow", "url": "http://localhost:8080"}


def settings(**fields: Any) -> AirflowSinkSettings:
    return AirflowSinkSettings.model_validate({**BASE, **fields})


def delivery(payload: Any) -> Delivery:
    return Delivery(
        event_id="ev_0123",
        store_id=3,
        watcher="orders",
        stream="orders-topic",
        message_id="m-1",
        position=5,
        payload=payload,
        created_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
    )


def reply(status: int, body: str = "", **headers: str) -> Reply:
    return Reply(status, body, headers)


# -- settings ---------------------------------------------------------------------------------


def test_the_registry_finds_the_airflow_sink() -> None:
    assert sink_class("airflow") is AirflowSink
    assert AirflowSink.exactly_once and AirflowSink.settings_model is AirflowSinkSettings


def test_the_defaults() -> None:
    s = settings()
    assert (s.verify_tls, s.timeout, s.lookup_window, s.asset_ref()) == (True, 10.0, 3600.0, None)


def test_durations_take_units() -> None:
    assert (settings(timeout="30s").timeout, settings(lookup_window="2h").lookup_window) == (
        30.0,
        7200.0,
    )


def test_the_url_loses_its_trailing_slash() -> None:
    assert settings(url="https://airflow.example.com/prefix/").url == (
        "https://airflow.example.com/prefix"
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"url": "localhost:8080"}, "base URL"),
        ({"url": "http://admin:secret@localhost:8080"}, "must not hold credentials"),
        ({"url": "http://localhost:8080/?x=1"}, "without a query"),
        ({"username": "admin"}, "username and password go together"),
        ({"password": "pw-only"}, "username and password go together"),
        ({"username": "a", "password": "b", "token": "t"}, "either token or username"),
        ({"asset": "orders", "asset_uri": "s3://b/o"}, "either asset"),
        ({"batch_size": 5}, "one asset event per request"),
        ({"timeout": 0}, "greater than 0"),
    ],
)
def test_inconsistent_settings_are_refused_with_what_to_do(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        settings(**fields)


def test_secrets_are_not_in_the_settings_repr() -> None:
    s = settings(username="admin", password="hunter2-password")
    assert "hunter2-password" not in repr(s) and "hunter2-password" not in repr(AirflowSink(s))


def test_check_config_names_each_watcher_without_an_asset() -> None:
    problems = AirflowSink.check_config(settings(), {"a": "orders", "b": None, "c": ""})
    assert len(problems) == 2
    assert "watcher b has none" in problems[0] and "watcher c" in problems[1]


def test_check_config_is_content_with_the_sinks_own_asset() -> None:
    assert AirflowSink.check_config(settings(asset_uri="s3://b/o"), {"b": None}) == []


# -- the extra --------------------------------------------------------------------------------


def test_an_object_payload_is_spread_beside_acklanes_fields() -> None:
    d = delivery({"order": 1, "payload": "its own"})
    assert event_extra(d) == {
        "order": 1,
        "payload": "its own",
        "acklane": {**d.acklane_fields(), "payload_wrapped": False},
    }


def test_a_trace_context_goes_beside_acklanes_fields() -> None:
    d = delivery({"order": 1})
    trace = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    assert event_extra(d, trace)["acklane"] == {
        **d.acklane_fields(),
        "payload_wrapped": False,
        **trace,
    }
    assert event_extra(d) == event_extra(d, {})  # tracing off: nothing added


@pytest.mark.parametrize(
    "payload", [[1, 2], "text", 3, None, {"acklane": 1}, {"from_rest_api": False}]
)
def test_any_other_payload_goes_whole_under_payload(payload: Any) -> None:
    extra = event_extra(delivery(payload))
    assert extra["payload"] == payload and extra["acklane"]["payload_wrapped"] is True
    assert set(extra) == {"payload", "acklane"}


@pytest.mark.parametrize(
    "payload", [{"x": float("nan")}, {"x": float("inf")}, {"x": "\ud800"}, {"x": object()}]
)
def test_a_payload_without_a_strict_json_form_is_refused(payload: Any) -> None:
    with pytest.raises(RefusedDelivery, match="ev_0123 cannot be sent as JSON"):
        encode_extra(delivery(payload))


def test_the_extra_is_utf8_json() -> None:
    assert encode_extra(delivery({"name": "café"})).startswith('{"name":"café"'.encode())


# -- outcomes ---------------------------------------------------------------------------------


def test_2xx_is_delivered() -> None:
    assert outcome_of(reply(200, "{}"), "e", retry_after_cap=300) is None


@pytest.mark.parametrize("status", [400, 413, 422])
def test_a_body_airflow_refuses_is_parked_with_the_status_and_the_detail(status: int) -> None:
    body = '{"detail":[{"type":"dict_type","loc":["body","extra"]}]}'
    outcome = outcome_of(reply(status, body), "event ev_1", retry_after_cap=300)
    assert isinstance(outcome, RefusedDelivery)
    assert f"{status} " in outcome.reason and "dict_type" in outcome.reason


def test_a_permission_refusal_is_held_not_parked() -> None:
    outcome = outcome_of(reply(403, '{"detail":"Forbidden"}'), "e", retry_after_cap=300)
    assert type(outcome) is RetryableDelivery and "may not create asset events" in outcome.reason


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_a_5xx_is_retryable_and_unsure(status: int) -> None:
    outcome = outcome_of(reply(status, "oops", **{"Retry-After": "7"}), "e", retry_after_cap=300)
    assert isinstance(outcome, UnsureDelivery) and outcome.retry_after == 7.0


@pytest.mark.parametrize("status", [408, 429])
def test_a_timeout_or_throttle_answer_is_retryable_with_its_retry_after(status: int) -> None:
    outcome = outcome_of(reply(status, "", **{"Retry-After": "12"}), "e", retry_after_cap=300)
    assert type(outcome) is RetryableDelivery and outcome.retry_after == 12.0


def test_a_refusal_reason_has_no_credential_shapes() -> None:
    outcome = outcome_of(
        reply(422, '{"detail":"password=hunter2 rejected"}'), "e", retry_after_cap=300
    )
    assert outcome is not None and "hunter2" not in outcome.reason


def test_retry_after_as_an_http_date() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    header = format_datetime(now + timedelta(seconds=30), usegmt=True)
    assert retry_after_of({"Retry-After": header}, cap=300, now=now) == 30.0
    assert retry_after_of({"Retry-After": "soon"}, cap=300) is None
    assert retry_after_of({}, cap=300) is None


def test_detail_of_quotes_fastapis_detail_or_the_bodys_start() -> None:
    assert detail_of('{"detail":"Invalid credentials"}') == "Invalid credentials"
    assert detail_of("x" * 500, 10) == "x" * 10 + "..."


def test_a_500_listing_asset_events_is_retried_with_airflows_known_cause() -> None:
    """Airflow 3.3 answers 500 to GET /assets/events while an event's DAG run has no
    start date yet: the lookup is retried, and its reason names the cause."""
    from acklane.core.sinks._airflow_client import EVENTS_PATH, AirflowClient

    client = AirflowClient(
        url="http://localhost:8080",
        username=None,
        password=None,
        token="t",
        verify_tls=True,
        timeout=5.0,
        retry_after_cap=300,
        scrub=lambda text: text,
    )
    failed = Reply(500, "Internal Server Error", {})
    with pytest.raises(RetryableDelivery, match=r"71360; retried"):
        client.expect_ok(failed, f"GET /{EVENTS_PATH} of asset id 3")
    with pytest.raises(RetryableDelivery) as other:
        client.expect_ok(failed, "GET /api/v2/assets")
    assert "71360" not in str(other.value)
    client.expect_ok(Reply(200, "{}", {}), f"GET /{EVENTS_PATH} of asset id 3")
