"""Pub/Sub emulators: acklane's own (a local process or a thread), or Google's under Docker.

acklane's emulator (:mod:`._server`) speaks the Publisher and Subscriber gRPC
services, so the official clients reach it through ``PUBSUB_EMULATOR_HOST``
(or the connector's ``emulator_host``). ``python -m acklane.integration.pubsub
--port P [--relaxed]`` runs it as a process; :class:`ServerThread` runs it in
this process. :class:`PubSubKit` creates throw-away topics and subscriptions on
any of them, for tests and benchmarks; :meth:`PubSubKit.stats` and
:func:`subscription_stats` read a subscription's backlog and leases on acklane's
emulator without pulling.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any, ClassVar

from .._container import ContainerEmulator, ContainerSpec
from ..emulator import EmulatorError, LocalProcessEmulator, free_port, require_free_port
from ._server import INSPECT_STATS, PubSubServer
from ._state import PubSubState
from ._thread import RELAXED_ENV, ServerThread

__all__ = [
    "DEFAULT_PROJECT",
    "DOCKER",
    "GOOGLE_EMULATOR_IMAGE",
    "LOCAL",
    "RELAXED_ENV",
    "GooglePubSubEmulator",
    "PubSubEmulator",
    "PubSubKit",
    "PubSubServer",
    "PubSubState",
    "ServerThread",
    "publisher_client",
    "subscriber_client",
    "subscription_stats",
]

#: Any project name does for an emulator.
DEFAULT_PROJECT = "acklane-test"
GOOGLE_EMULATOR_IMAGE = "gcr.io/google.com/cloudsdktool/google-cloud-cli:emulators"


def _channel(host: str) -> Any:
    import grpc

    return grpc.aio.insecure_channel(host)


def subscriber_client(emulator_host: str) -> Any:
    """A ``SubscriberAsyncClient`` on an emulator (no credentials); create it on a loop."""
    from google.pubsub_v1 import SubscriberAsyncClient
    from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcAsyncIOTransport

    return SubscriberAsyncClient(
        transport=SubscriberGrpcAsyncIOTransport(channel=_channel(emulator_host))
    )


def publisher_client(emulator_host: str) -> Any:
    """A ``PublisherAsyncClient`` on an emulator (no credentials); create it on a loop."""
    from google.pubsub_v1 import PublisherAsyncClient
    from google.pubsub_v1.services.publisher.transports import PublisherGrpcAsyncIOTransport

    return PublisherAsyncClient(
        transport=PublisherGrpcAsyncIOTransport(channel=_channel(emulator_host))
    )


def subscription_stats(
    emulator_host: str, subscription: str, timeout: float = 10.0
) -> dict[str, int]:
    """``{"backlog", "leased", "delayed"}`` of a subscription on acklane's emulator.

    Read-only: nothing is pulled, so nothing is leased or counted as a delivery
    attempt. ``backlog`` is every message not acked yet (leased ones included). A
    blocking call (Google's emulator has no such call: ``UNIMPLEMENTED``).
    """
    import grpc

    with grpc.insecure_channel(emulator_host) as channel:
        call = channel.unary_unary(INSPECT_STATS)
        answer = call(json.dumps({"subscription": subscription}).encode(), timeout=timeout)
    return {str(k): int(v) for k, v in json.loads(answer).items()}


def _wait_until_answers(host: str, timeout: float, alive: Any) -> None:
    """Block until a real ListTopics call succeeds (or ``alive()`` says it died)."""
    import grpc
    from google.pubsub_v1 import PublisherClient
    from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport

    channel = grpc.insecure_channel(host)
    client = PublisherClient(transport=PublisherGrpcTransport(channel=channel))
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                list(client.list_topics(project=f"projects/{DEFAULT_PROJECT}", timeout=2))
                return
            except Exception as exc:
                if not alive():
                    raise EmulatorError(
                        f"Pub/Sub emulator at {host} exited while starting"
                    ) from exc
                if time.monotonic() > deadline:
                    raise EmulatorError(
                        f"Pub/Sub emulator at {host}: ListTopics still failing after "
                        f"{timeout}s: {exc}"
                    ) from exc
                time.sleep(0.1)
    finally:
        channel.close()


class PubSubEmulator(LocalProcessEmulator):
    """acklane's Pub/Sub emulator in a subprocess on a free port.

    ``relaxed`` (default: ``$ACKLANE_PUBSUB_RELAXED``) allows ack deadlines from
    1 s and ``max_delivery_attempts`` from 1, for fast tests.
    """

    broker: ClassVar[str] = "pubsub"
    backend: ClassVar[str] = "local"

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        project: str = DEFAULT_PROJECT,
        relaxed: bool | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.project = project
        self.relaxed = (
            relaxed
            if relaxed is not None
            else os.environ.get(RELAXED_ENV, "").strip().lower() in ("1", "true", "yes", "on")
        )
        self._process: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def endpoint(self) -> str:
        if self.port is None:
            raise EmulatorError("the Pub/Sub emulator is not started")
        return f"{self.host}:{self.port}"

    def client_settings(self) -> dict[str, Any]:
        return {"project": self.project, "emulator_host": self.endpoint}

    def start(self) -> None:
        if self._process is not None:
            return
        if self.port is not None:
            require_free_port(self.host, self.port)
        self.port = self.port or free_port()
        command = [sys.executable, "-m", "acklane.integration.pubsub"]
        command += ["--host", self.host, "--port", str(self.port)]
        if self.relaxed:
            command.append("--relaxed")
        self._launch(
            command, "acklane-pubsub-", f"the Pub/Sub emulator on port {self.port} did not start"
        )

    def wait_healthy(self, timeout: float = 60.0) -> None:
        self._wait_answering(
            "the Pub/Sub emulator",
            self.host,
            self.port or 0,
            timeout,
            lambda left, alive: _wait_until_answers(self.endpoint, left, alive),
        )


def google_emulator_spec(image: str, project: str) -> ContainerSpec:
    """Google's emulator serving ``project`` on the container's port 8085."""
    return ContainerSpec(
        image,
        command=f"gcloud beta emulators pubsub start --project={project} --host-port=0.0.0.0:8085",
        exposed_ports=(8085,),
    )


class GooglePubSubEmulator(ContainerEmulator):
    """Google's emulator (``gcloud beta emulators pubsub start``) via testcontainers.

    It has no relaxed mode: ``relaxed`` is accepted and ignored, so tests that need
    ack deadlines under 10 s only pass on acklane's emulator.
    """

    broker: ClassVar[str] = "pubsub"
    title: ClassVar[str] = "Google's Pub/Sub emulator"

    def __init__(
        self,
        *,
        image: str = GOOGLE_EMULATOR_IMAGE,
        project: str = DEFAULT_PROJECT,
        relaxed: bool | None = None,
    ) -> None:
        super().__init__()
        self.image = image
        self.project = project
        self._endpoint: str | None = None

    @property
    def endpoint(self) -> str:
        if self._endpoint is None:
            raise EmulatorError("Google's Pub/Sub emulator is not started")
        return self._endpoint

    def client_settings(self) -> dict[str, Any]:
        return {"project": self.project, "emulator_host": self.endpoint}

    def _run(self) -> None:
        try:
            container = self._start(google_emulator_spec(self.image, self.project))
            host = container.get_container_host_ip()
            self._endpoint = f"{host}:{container.get_exposed_port(8085)}"
        except EmulatorError:
            raise
        except Exception as exc:
            raise EmulatorError(
                f"Google's Pub/Sub emulator ({self.image}) did not start: {exc}"
            ) from exc

    def wait_healthy(self, timeout: float = 120.0) -> None:
        if not self.started:
            raise EmulatorError("Google's Pub/Sub emulator is not started")
        _wait_until_answers(self.endpoint, timeout, lambda: True)

    def stop(self) -> None:
        super().stop()
        self._endpoint = None


LOCAL = PubSubEmulator
DOCKER = GooglePubSubEmulator


class PubSubKit:
    """Throw-away topics and subscriptions on an emulator, seen from outside acklane.

    ``async with PubSubKit(emulator.client_settings()) as kit``; everything it
    created is deleted on exit. Names get a random suffix, so tests sharing one
    emulator never see each other's messages. Names it returns are full paths
    (``projects/P/topics/T``).
    """

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.project = str(settings.get("project", DEFAULT_PROJECT))
        self.host = str(settings["emulator_host"])
        self.publisher: Any = None
        self.subscriber: Any = None
        self._topics: list[str] = []
        self._subscriptions: list[str] = []

    async def __aenter__(self) -> PubSubKit:
        self.publisher = publisher_client(self.host)
        self.subscriber = subscriber_client(self.host)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for name in self._subscriptions:
            with contextlib.suppress(Exception):
                await self.subscriber.delete_subscription(subscription=name)
        for name in self._topics:
            with contextlib.suppress(Exception):
                await self.publisher.delete_topic(topic=name)
        for client in (self.subscriber, self.publisher):
            with contextlib.suppress(Exception):
                await client.transport.close()

    def topic_path(self, name: str) -> str:
        return name if name.startswith("projects/") else f"projects/{self.project}/topics/{name}"

    def subscription_path(self, name: str) -> str:
        if name.startswith("projects/"):
            return name
        return f"projects/{self.project}/subscriptions/{name}"

    async def create_topic(self, prefix: str = "acklane") -> str:
        name = self.topic_path(f"{prefix}-{uuid.uuid4().hex[:12]}")
        await self.publisher.create_topic(name=name)
        self._topics.append(name)
        return name

    async def create_subscription(
        self,
        topic: str,
        prefix: str = "acklane-sub",
        *,
        ack_deadline: int = 10,
        ordering: bool = False,
        dead_letter_topic: str | None = None,
        max_delivery_attempts: int = 5,
        minimum_backoff: float | None = None,
    ) -> str:
        """Create a subscription with a unique name on ``topic``; return its path."""
        from google.pubsub_v1 import types

        name = self.subscription_path(f"{prefix}-{uuid.uuid4().hex[:12]}")
        request = types.Subscription(
            name=name,
            topic=self.topic_path(topic),
            ack_deadline_seconds=ack_deadline,
            enable_message_ordering=ordering,
        )
        if dead_letter_topic is not None:
            request.dead_letter_policy = types.DeadLetterPolicy(
                dead_letter_topic=self.topic_path(dead_letter_topic),
                max_delivery_attempts=max_delivery_attempts,
            )
        if minimum_backoff is not None:
            request.retry_policy = types.RetryPolicy(
                minimum_backoff=timedelta(seconds=minimum_backoff)
            )
        await self.subscriber.create_subscription(request=request)
        self._subscriptions.append(name)
        return name

    async def publish(
        self,
        topic: str,
        bodies: Iterable[bytes | str],
        *,
        attributes: Mapping[str, str] | None = None,
        ordering_key: str = "",
    ) -> list[str]:
        """Publish messages (one call per 500); their message ids, in order."""
        from google.pubsub_v1 import types

        messages = [
            types.PubsubMessage(
                data=body.encode() if isinstance(body, str) else body,
                attributes=dict(attributes or {}),
                ordering_key=ordering_key,
            )
            for body in bodies
        ]
        ids: list[str] = []
        for start in range(0, len(messages), 500):
            response = await self.publisher.publish(
                topic=self.topic_path(topic), messages=messages[start : start + 500]
            )
            ids.extend(response.message_ids)
        return ids

    async def stats(self, subscription: str) -> dict[str, int]:
        """The subscription's backlog and leases, without pulling (acklane's emulator only).

        See :func:`subscription_stats`.
        """
        call = self.subscriber.transport.grpc_channel.unary_unary(INSPECT_STATS)
        request = json.dumps({"subscription": self.subscription_path(subscription)})
        answer = await call(request.encode(), timeout=10)
        return {str(k): int(v) for k, v in json.loads(answer).items()}

    async def pull(
        self, subscription: str, *, max_messages: int = 100, ack: bool = True
    ) -> list[Any]:
        """Pull once (waiting briefly when empty) and ack what came; the ReceivedMessages."""
        response = await self.subscriber.pull(
            subscription=self.subscription_path(subscription), max_messages=max_messages
        )
        received = list(response.received_messages)
        if ack and received:
            await self.subscriber.acknowledge(
                subscription=self.subscription_path(subscription),
                ack_ids=[r.ack_id for r in received],
            )
        return received

    async def drain(
        self, subscription: str, *, expect: int, within: float = 20.0, ack: bool = True
    ) -> list[Any]:
        """Pull (and ack) until ``expect`` messages came or ``within`` seconds passed."""
        out: list[Any] = []
        deadline = time.monotonic() + within
        while len(out) < expect and time.monotonic() < deadline:
            out.extend(await self.pull(subscription, ack=ack))
        return out
