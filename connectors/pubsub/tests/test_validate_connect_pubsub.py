"""``acklane validate --connect`` on Pub/Sub streams: the check, one line each.

Against acklane's Pub/Sub emulator: a readable subscription and dead-letter topic;
a subscription or a topic that does not exist; an endpoint that does not answer. The
emulator checks no credentials, so refusals come from a gRPC server started here that
answers every call ``UNAUTHENTICATED`` or ``PERMISSION_DENIED``, the status codes
Google's service answers, which the official client reads as it would Google's.

What ``acklane run`` does against such a stream (refused credentials stop it; an
unreachable endpoint is told once) is a rule of every connector:
``tests/test_conformance_run_errors.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from acklane.core.cli.checks import CheckResult, run_checks
from acklane.core.config import load_config
from acklane.integration.emulator import Emulator, free_port
from acklane.integration.pubsub import PubSubKit
from acklane.integration.testing import write_pipeline

pytestmark = pytest.mark.filterwarnings("ignore:The return_immediately flag:DeprecationWarning")


def _pipeline(tmp_path: Path, stream: str) -> Path:
    return write_pipeline(tmp_path, "pubsub", stream)


async def _check(tmp_path: Path, stream: str) -> CheckResult:
    checks = await run_checks(load_config(_pipeline(tmp_path, stream)), call_timeout=5)
    (check,) = [c for c in checks if c.target == "stream orders"]
    assert check.setting == "streams.orders"
    return check


@pytest.fixture
def settings(pubsub_emulator: Emulator) -> dict[str, Any]:
    return pubsub_emulator.client_settings()


async def test_connect_to_a_subscription_and_its_dead_letter_topic(
    tmp_path: Path, settings: dict[str, Any]
) -> None:
    async with PubSubKit(settings) as kit:
        topic = await kit.create_topic()
        dlq = await kit.create_topic("dlq")
        sub = await kit.create_subscription(topic)
        check = await _check(
            tmp_path,
            f"project: {kit.project}\nemulator_host: {kit.host}\nsubscription: {sub}\n"
            f"dead_letter: {dlq}\n",
        )
    assert check.status == "ok", check
    assert f"subscription {sub} (topic {topic}) readable" in check.detail
    assert f"dead-letter topic {dlq} exists" in check.detail


async def test_connect_names_what_does_not_exist(tmp_path: Path, settings: dict[str, Any]) -> None:
    async with PubSubKit(settings) as kit:
        topic = await kit.create_topic()
        sub = await kit.create_subscription(topic)
        stream = f"project: {kit.project}\nemulator_host: {kit.host}\n"
        no_sub = await _check(tmp_path, stream + "subscription: no-such-sub\n")
        no_dlq = await _check(
            tmp_path, stream + f"subscription: {sub}\ndead_letter: no-such-topic\n"
        )
    assert no_sub.status == "failed"
    assert "no such subscription" in no_sub.detail and "(subscription)" in no_sub.detail
    assert no_dlq.status == "failed"
    assert "no such dead-letter topic" in no_dlq.detail
    assert "(dead_letter)" in no_dlq.detail


async def test_connect_to_an_endpoint_that_does_not_answer(tmp_path: Path) -> None:
    check = await _check(
        tmp_path, f"project: p\nemulator_host: 127.0.0.1:{free_port()}\nsubscription: orders-sub\n"
    )
    assert check.status == "failed"
    assert "no answer from the Pub/Sub endpoint (emulator_host)" in check.detail
    assert "UNAVAILABLE" in check.detail


class _Refusing(grpc.GenericRpcHandler):
    def __init__(self, code: grpc.StatusCode) -> None:
        self.code = code

    def service(self, handler_call_details: Any) -> Any:
        def refuse(request: bytes, context: grpc.ServicerContext) -> bytes:
            context.abort(self.code, "request had invalid authentication credentials")
            raise AssertionError("abort raises")

        return grpc.unary_unary_rpc_method_handler(refuse)


@pytest.fixture(params=[grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED])
def refusing_endpoint(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """host:port of a gRPC server answering every call with the code; the code's name."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((_Refusing(request.param),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", request.param.name
    finally:
        server.stop(grace=None)


async def test_connect_to_an_endpoint_that_refuses(
    tmp_path: Path, refusing_endpoint: tuple[str, str]
) -> None:
    host, code = refusing_endpoint
    check = await _check(tmp_path, f"project: p\nemulator_host: {host}\nsubscription: orders-sub\n")
    assert check.status == "failed"
    assert f"{code}: request had invalid authentication credentials" in check.detail
    assert "(check streams.orders." in check.detail
