"""SQS emulators: moto's server as a local process, or LocalStack under Docker.

Both speak the SQS API on an HTTP endpoint; :meth:`client_settings` gives the
``connector: sqs`` YAML fields that reach it (endpoint, region, dummy keys), and
:func:`sqs_client` a boto3 client on them. :class:`SqsQueues` creates throw-away
queues on either, for tests and benchmarks.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from ._container import DOCKER_EXTRA_HINT, ContainerEmulator, ContainerSpec
from .emulator import EmulatorError, LocalProcessEmulator, free_port, require_free_port

__all__ = ["DOCKER", "LOCAL", "LocalStackSqs", "MotoSqs", "SqsQueues", "sqs_client"]

DEFAULT_REGION = "us-east-1"
#: Any keys do for the emulators; real-looking ones keep botocore's signer happy.
DUMMY_ACCESS_KEY_ID = "testing"
DUMMY_SECRET_ACCESS_KEY = "testing"
LOCALSTACK_IMAGE = "localstack/localstack:4.4"


def sqs_client(settings: Mapping[str, Any], **options: Any) -> Any:
    """A boto3 (synchronous) SQS client on ``settings``, an emulator's
    :meth:`~acklane.integration.emulator.Emulator.client_settings` (endpoint, region,
    keys); ``options`` go to ``boto3.client`` as well (``config=``...)."""
    import boto3

    return boto3.client(
        "sqs",
        endpoint_url=settings["endpoint_url"],
        region_name=settings["region"],
        aws_access_key_id=settings["aws_access_key_id"],
        aws_secret_access_key=settings["aws_secret_access_key"],
        **options,
    )


def _list_queues_until_healthy(
    settings: Mapping[str, Any], timeout: float, alive: Callable[[], bool]
) -> None:
    """Block until a real ListQueues call succeeds (or ``alive()`` says the server died)."""
    from botocore.config import Config

    endpoint = settings["endpoint_url"]
    client = sqs_client(
        settings, config=Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=5)
    )
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                client.list_queues()
                return
            except Exception as exc:
                if not alive():
                    raise EmulatorError(
                        f"SQS emulator at {endpoint} exited while starting"
                    ) from exc
                if time.monotonic() > deadline:
                    raise EmulatorError(
                        f"SQS emulator at {endpoint}: ListQueues still failing after "
                        f"{timeout}s: {exc}"
                    ) from exc
                time.sleep(0.1)
    finally:
        client.close()


class MotoSqs(LocalProcessEmulator):
    """moto's server (``python -m moto.server``) in a subprocess on a free port.

    A subprocess rather than moto's in-process thread: it can be killed, and its
    long polls don't compete with the tests for the GIL.
    """

    broker: ClassVar[str] = "sqs"
    backend: ClassVar[str] = "local"

    def __init__(
        self, *, host: str = "127.0.0.1", port: int | None = None, region: str = DEFAULT_REGION
    ) -> None:
        self.host = host
        self.port = port
        self.region = region
        self._process: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def endpoint(self) -> str:
        if self.port is None:
            raise EmulatorError("the moto SQS emulator is not started")
        return f"http://{self.host}:{self.port}"

    def client_settings(self) -> dict[str, Any]:
        return {
            "endpoint_url": self.endpoint,
            "region": self.region,
            "aws_access_key_id": DUMMY_ACCESS_KEY_ID,
            "aws_secret_access_key": DUMMY_SECRET_ACCESS_KEY,
        }

    def start(self) -> None:
        if self._process is not None:
            return
        if self.port is not None:
            require_free_port(self.host, self.port)
        self.port = self.port or free_port()
        self._launch(
            [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)],
            "acklane-moto-",
            f"moto SQS server on port {self.port} did not start",
        )

    def wait_healthy(self, timeout: float = 60.0) -> None:
        self._wait_answering(
            "the moto SQS emulator",
            self.host,
            self.port or 0,
            timeout,
            lambda left, alive: _list_queues_until_healthy(self.client_settings(), left, alive),
        )


class LocalStackSqs(ContainerEmulator):
    """LocalStack's image (SQS only) via testcontainers (``acklane-integration[docker]``)."""

    broker: ClassVar[str] = "sqs"
    title: ClassVar[str] = "the LocalStack SQS emulator"
    startup_timeout: float = 90.0

    def __init__(self, *, image: str = LOCALSTACK_IMAGE, region: str = DEFAULT_REGION) -> None:
        super().__init__()
        self.image = image
        self.region = region
        self._endpoint: str | None = None

    @property
    def endpoint(self) -> str:
        if self._endpoint is None:
            raise EmulatorError("the LocalStack SQS emulator is not started")
        return self._endpoint

    def client_settings(self) -> dict[str, Any]:
        return {
            "endpoint_url": self.endpoint,
            "region": self.region,
            "aws_access_key_id": DUMMY_ACCESS_KEY_ID,
            "aws_secret_access_key": DUMMY_SECRET_ACCESS_KEY,
        }

    def _run(self) -> None:
        try:
            from testcontainers.localstack import LocalStackContainer
        except ImportError as exc:
            raise EmulatorError(DOCKER_EXTRA_HINT) from exc
        container = LocalStackContainer(image=self.image, region_name=self.region).with_services(
            "sqs"
        )
        try:
            self._start(ContainerSpec(self.image), container)
        except Exception as exc:
            raise EmulatorError(f"LocalStack ({self.image}) did not start: {exc}") from exc
        self._endpoint = str(container.get_url())

    def wait_healthy(self, timeout: float = 90.0) -> None:
        if not self.started:
            raise EmulatorError("the LocalStack SQS emulator is not started")
        _list_queues_until_healthy(self.client_settings(), timeout, lambda: True)

    def stop(self) -> None:
        super().stop()
        self._endpoint = None


LOCAL = MotoSqs
DOCKER = LocalStackSqs


class SqsQueues:
    """Throw-away queues on an emulator, and a view of them from outside the producer.

    Use as ``async with SqsQueues(emulator.client_settings()) as queues``; every
    queue it created is deleted on exit. Names get a random suffix, so tests
    sharing one emulator never see each other's messages.
    """

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.settings = dict(settings)
        self._created: list[str] = []
        self._client_cm: Any = None
        self.client: Any = None

    async def __aenter__(self) -> SqsQueues:
        import aioboto3

        session = aioboto3.Session(
            aws_access_key_id=self.settings.get("aws_access_key_id"),
            aws_secret_access_key=self.settings.get("aws_secret_access_key"),
            region_name=self.settings.get("region", DEFAULT_REGION),
        )
        self._client_cm = session.client("sqs", endpoint_url=self.settings.get("endpoint_url"))
        self.client = await self._client_cm.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            for url in self._created:
                with contextlib.suppress(Exception):  # best-effort cleanup
                    await self.client.delete_queue(QueueUrl=url)
        finally:
            await self._client_cm.__aexit__(None, None, None)

    async def create(
        self,
        prefix: str = "acklane",
        *,
        fifo: bool = False,
        visibility_timeout: int = 30,
        dead_letter_arn: str | None = None,
        max_receive_count: int = 10,
        attributes: Mapping[str, str] | None = None,
    ) -> str:
        """Create a queue with a unique name; return its URL.

        ``attributes`` adds or overrides queue attributes (``MaximumMessageSize``...).
        """
        name = f"{prefix}-{uuid.uuid4().hex[:12]}" + (".fifo" if fifo else "")
        settings = {"VisibilityTimeout": str(visibility_timeout)}
        if fifo:
            settings["FifoQueue"] = "true"
        if dead_letter_arn:
            settings["RedrivePolicy"] = json.dumps(
                {"deadLetterTargetArn": dead_letter_arn, "maxReceiveCount": str(max_receive_count)}
            )
        settings.update(attributes or {})
        response = await self.client.create_queue(QueueName=name, Attributes=settings)
        url = str(response["QueueUrl"])
        self._created.append(url)
        return url

    async def arn(self, url: str) -> str:
        response = await self.client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
        return str(response["Attributes"]["QueueArn"])

    async def send(
        self,
        url: str,
        bodies: Iterable[str],
        *,
        group_id: str | None = None,
        attributes: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Send messages (10 per call); return their ``MessageId`` in order."""
        ids: list[str] = []
        batch: list[dict[str, Any]] = []

        async def flush() -> None:
            response = await self.client.send_message_batch(QueueUrl=url, Entries=batch)
            if response.get("Failed"):
                raise EmulatorError(f"send to {url} failed: {response['Failed']}")
            by_id = {entry["Id"]: entry["MessageId"] for entry in response["Successful"]}
            ids.extend(by_id[entry["Id"]] for entry in batch)
            batch.clear()

        for body in bodies:
            entry: dict[str, Any] = {"Id": str(len(batch)), "MessageBody": body}
            if attributes:
                entry["MessageAttributes"] = {
                    k: {"DataType": "String", "StringValue": v} for k, v in attributes.items()
                }
            if group_id is not None:
                entry["MessageGroupId"] = group_id
                entry["MessageDeduplicationId"] = uuid.uuid4().hex
            batch.append(entry)
            if len(batch) == 10:
                await flush()
        if batch:
            await flush()
        return ids

    async def receive(
        self,
        url: str,
        *,
        max_messages: int = 10,
        wait: int = 0,
        visibility_timeout: int | None = None,
    ) -> list[dict[str, Any]]:
        """Receive directly (not through acklane), with all attributes."""
        request: dict[str, Any] = {
            "QueueUrl": url,
            "MaxNumberOfMessages": max_messages,
            "WaitTimeSeconds": wait,
            "MessageAttributeNames": ["All"],
            "MessageSystemAttributeNames": ["All"],
        }
        if visibility_timeout is not None:
            request["VisibilityTimeout"] = visibility_timeout
        response = await self.client.receive_message(**request)
        return list(response.get("Messages", []))

    async def counts(self, url: str) -> tuple[int, int]:
        """``(visible, in flight)``: ApproximateNumberOfMessages and ...NotVisible."""
        response = await self.client.get_queue_attributes(
            QueueUrl=url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )
        attrs = response["Attributes"]
        return (
            int(attrs.get("ApproximateNumberOfMessages", 0)),
            int(attrs.get("ApproximateNumberOfMessagesNotVisible", 0)),
        )
