"""acklane's Pub/Sub emulator: the Publisher and Subscriber gRPC services on a
:class:`~._state.PubSubState`.

A ``grpc.aio`` server with generic handlers; the request and response classes are
the ones ``google-cloud-pubsub`` ships (``google.pubsub_v1.types.X.pb()``), so the
official clients talk to it unchanged through ``PUBSUB_EMULATOR_HOST``. One call of
its own, not Pub/Sub's: ``INSPECT_STATS``, a subscription's backlog and leases read
without pulling (tests and benchmarks; JSON, no protobuf).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import empty_pb2
from google.pubsub_v1 import types as t

from ._model import (
    MAX_ACK_DEADLINE,
    _Stream,
    _Subscription,
)
from ._paging import paginate
from ._schemas import SchemaError
from ._state import (
    PubSubState,
    _project,
)
from ._status import _Abort, _AckIdFailure, _invalid, _unimplemented
from ._types import pb

__all__ = ["INSPECT_STATS", "PULL_WAIT", "PubSubServer"]

log = logging.getLogger(__name__)

#: acklane's read-only inspection call (not part of Pub/Sub): JSON request and answer.
INSPECT_STATS = "/acklane.pubsub.v1.Inspector/SubscriptionStats"
#: How long a unary Pull waits for messages before it answers empty.
PULL_WAIT = 2.0


class PubSubServer:
    """The gRPC servicer: the Publisher and Subscriber services on a ``PubSubState``."""

    def __init__(self, state: PubSubState, *, pull_wait: float = PULL_WAIT) -> None:
        self.state = state
        self.pull_wait = pull_wait
        self._server: grpc.aio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.port: int | None = None

    # ----------------------------------------------------------- serving

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", 20 * 1024 * 1024),
                ("grpc.max_send_message_length", 20 * 1024 * 1024),
            ]
        )
        server.add_generic_rpc_handlers(self._handlers())
        self.port = server.add_insecure_port(f"{host}:{port}")
        if not self.port:
            raise OSError(f"cannot listen on {host}:{port}")
        await server.start()
        self._server = server
        self._sweeper = asyncio.create_task(self._sweep())
        return self.port

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            try:
                self.state.sweep()
            except Exception:
                log.exception("Pub/Sub emulator: sweep failed")

    async def stop(self, grace: float | None = 0.5) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._server is not None:
            server, self._server = self._server, None
            for sub in self.state.subscriptions.values():
                sub.poke()
            await server.stop(grace)

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()

    def _handlers(self) -> tuple[grpc.GenericRpcHandler, ...]:
        def unary(fn: Any, request: str, response: str | None) -> grpc.RpcMethodHandler:
            out = pb[response] if response else empty_pb2.Empty
            return grpc.unary_unary_rpc_method_handler(
                self._guard(fn),
                request_deserializer=pb[request].FromString,
                response_serializer=out.SerializeToString,
            )

        publisher = {
            "CreateTopic": unary(self.create_topic, "Topic", "Topic"),
            "GetTopic": unary(self.get_topic, "GetTopicRequest", "Topic"),
            "ListTopics": unary(self.list_topics, "ListTopicsRequest", "ListTopicsResponse"),
            "ListTopicSubscriptions": unary(
                self.list_topic_subscriptions,
                "ListTopicSubscriptionsRequest",
                "ListTopicSubscriptionsResponse",
            ),
            "DeleteTopic": unary(self.delete_topic, "DeleteTopicRequest", None),
            "Publish": unary(self.publish, "PublishRequest", "PublishResponse"),
            "UpdateTopic": unary(self.update_topic, "UpdateTopicRequest", "Topic"),
            "DetachSubscription": unary(
                self.detach_subscription,
                "DetachSubscriptionRequest",
                "DetachSubscriptionResponse",
            ),
            "ListTopicSnapshots": unary(
                self.list_topic_snapshots,
                "ListTopicSnapshotsRequest",
                "ListTopicSnapshotsResponse",
            ),
        }
        subscriber = {
            "CreateSubscription": unary(self.create_subscription, "Subscription", "Subscription"),
            "GetSubscription": unary(
                self.get_subscription, "GetSubscriptionRequest", "Subscription"
            ),
            "UpdateSubscription": unary(
                self.update_subscription, "UpdateSubscriptionRequest", "Subscription"
            ),
            "ListSubscriptions": unary(
                self.list_subscriptions, "ListSubscriptionsRequest", "ListSubscriptionsResponse"
            ),
            "DeleteSubscription": unary(
                self.delete_subscription, "DeleteSubscriptionRequest", None
            ),
            "Pull": unary(self.pull, "PullRequest", "PullResponse"),
            "Acknowledge": unary(self.acknowledge, "AcknowledgeRequest", None),
            "ModifyAckDeadline": unary(self.modify_ack_deadline, "ModifyAckDeadlineRequest", None),
            "ModifyPushConfig": unary(self.modify_push_config, "ModifyPushConfigRequest", None),
            "CreateSnapshot": unary(self.create_snapshot, "CreateSnapshotRequest", "Snapshot"),
            "GetSnapshot": unary(self.get_snapshot, "GetSnapshotRequest", "Snapshot"),
            "UpdateSnapshot": unary(self.update_snapshot, "UpdateSnapshotRequest", "Snapshot"),
            "ListSnapshots": unary(
                self.list_snapshots, "ListSnapshotsRequest", "ListSnapshotsResponse"
            ),
            "DeleteSnapshot": unary(self.delete_snapshot, "DeleteSnapshotRequest", None),
            "Seek": unary(self.seek, "SeekRequest", "SeekResponse"),
            "StreamingPull": grpc.stream_stream_rpc_method_handler(
                self.streaming_pull,
                request_deserializer=pb["StreamingPullRequest"].FromString,
                response_serializer=pb["StreamingPullResponse"].SerializeToString,
            ),
        }
        inspector = {
            # JSON in and out, no protobuf: ``{"subscription": path}`` -> :meth:`stats`.
            INSPECT_STATS.rsplit("/", 1)[1]: grpc.unary_unary_rpc_method_handler(
                self._inspect_stats
            ),
        }
        iam = {
            name: grpc.unary_unary_rpc_method_handler(self._refuse_iam)
            for name in ("SetIamPolicy", "GetIamPolicy", "TestIamPermissions")
        }
        handlers = [
            grpc.method_handlers_generic_handler("google.pubsub.v1.Publisher", publisher),
            grpc.method_handlers_generic_handler("google.pubsub.v1.Subscriber", subscriber),
            grpc.method_handlers_generic_handler(INSPECT_STATS.split("/")[1], inspector),
            grpc.method_handlers_generic_handler("google.iam.v1.IAMPolicy", iam),
        ]
        handlers.append(self.state.schemas.handler(self._guard))
        return tuple(handlers)

    @staticmethod
    async def _refuse_iam(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "acklane's Pub/Sub emulator does not implement IAM policies (google.iam.v1."
            "IAMPolicy); neither does Google's emulator. Test access control on the service.",
        )
        raise AssertionError("unreachable")  # abort raises

    async def _inspect_stats(
        self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bytes:
        try:
            name = json.loads(request)["subscription"]
            return json.dumps(self.state.stats(str(name))).encode()
        except _Abort as exc:
            await context.abort(exc.code, exc.message)
        except (ValueError, KeyError, TypeError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad request: {exc}")
        raise AssertionError("unreachable")  # abort raises

    @staticmethod
    def _guard(fn: Any) -> Any:
        with_context = fn.__name__ == "pull"

        async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            try:
                return await (fn(request, context) if with_context else fn(request))
            except _AckIdFailure as exc:
                await context.abort(exc.code, exc.message, exc.trailing_metadata())
            except (_Abort, SchemaError) as exc:
                await context.abort(exc.code, exc.message)

        return call

    # ----------------------------------------------------------- publisher

    async def create_topic(self, request: Any) -> Any:
        return self.state.create_topic(request)

    async def get_topic(self, request: Any) -> Any:
        return self.state.topic(request.topic).config

    async def list_topics(self, request: Any) -> Any:
        project = _project(request.project)
        names = sorted(n for n in self.state.topics if n.startswith(f"projects/{project}/"))
        page, token = paginate(names, request.page_size, request.page_token)
        return pb["ListTopicsResponse"](
            topics=[self.state.topics[n].config for n in page], next_page_token=token
        )

    async def list_topic_subscriptions(self, request: Any) -> Any:
        names = sorted(self.state.topic(request.topic).subscriptions)
        page, token = paginate(names, request.page_size, request.page_token)
        return pb["ListTopicSubscriptionsResponse"](subscriptions=page, next_page_token=token)

    async def delete_topic(self, request: Any) -> Any:
        self.state.delete_topic(request.topic)
        return empty_pb2.Empty()

    async def publish(self, request: Any) -> Any:
        ids = self.state.publish(request.topic, request.messages)
        return pb["PublishResponse"](message_ids=ids)

    async def update_topic(self, request: Any) -> Any:
        return self.state.update_topic(request.topic, request.update_mask.paths)

    async def detach_subscription(self, request: Any) -> Any:
        self.state.detach_subscription(request.subscription)
        return pb["DetachSubscriptionResponse"]()

    async def list_topic_snapshots(self, request: Any) -> Any:
        names = sorted(self.state.topic(request.topic).snapshots)
        page, token = paginate(names, request.page_size, request.page_token)
        return pb["ListTopicSnapshotsResponse"](snapshots=page, next_page_token=token)

    # ----------------------------------------------------------- subscriber

    async def create_subscription(self, request: Any) -> Any:
        return self.state.create_subscription(request)

    async def get_subscription(self, request: Any) -> Any:
        return self.state.subscription(request.subscription).config

    async def update_subscription(self, request: Any) -> Any:
        return self.state.update_subscription(request.subscription, request.update_mask.paths)

    async def list_subscriptions(self, request: Any) -> Any:
        project = _project(request.project)
        names = sorted(n for n in self.state.subscriptions if n.startswith(f"projects/{project}/"))
        page, token = paginate(names, request.page_size, request.page_token)
        return pb["ListSubscriptionsResponse"](
            subscriptions=[self.state.subscriptions[n].config for n in page],
            next_page_token=token,
        )

    async def delete_subscription(self, request: Any) -> Any:
        self.state.delete_subscription(request.subscription)
        return empty_pb2.Empty()

    async def acknowledge(self, request: Any) -> Any:
        if not request.ack_ids:
            raise _invalid("No ack ids were given.")
        self.state.acknowledge(request.subscription, request.ack_ids)
        return empty_pb2.Empty()

    async def modify_ack_deadline(self, request: Any) -> Any:
        if not request.ack_ids:
            raise _invalid("No ack ids were given.")
        self.state.modify_ack_deadline(
            request.subscription, request.ack_ids, request.ack_deadline_seconds
        )
        return empty_pb2.Empty()

    async def modify_push_config(self, request: Any) -> Any:
        if request.push_config.push_endpoint:
            raise _unimplemented("push subscriptions (push_config.push_endpoint)")
        sub = self.state.subscription(request.subscription)
        sub.config.ClearField("push_config")  # an empty push config: a pull subscription
        return empty_pb2.Empty()

    async def create_snapshot(self, request: Any) -> Any:
        return self.state.create_snapshot(request.name, request.subscription, dict(request.labels))

    async def get_snapshot(self, request: Any) -> Any:
        return self.state.snapshot(request.snapshot).config

    async def update_snapshot(self, request: Any) -> Any:
        return self.state.update_snapshot(request.snapshot, request.update_mask.paths)

    async def list_snapshots(self, request: Any) -> Any:
        project = _project(request.project)
        names = sorted(n for n in self.state.snapshots if n.startswith(f"projects/{project}/"))
        page, token = paginate(names, request.page_size, request.page_token)
        return pb["ListSnapshotsResponse"](
            snapshots=[self.state.snapshots[n].config for n in page], next_page_token=token
        )

    async def delete_snapshot(self, request: Any) -> Any:
        self.state.delete_snapshot(request.snapshot)
        return empty_pb2.Empty()

    async def seek(self, request: Any) -> Any:
        target = request.WhichOneof("target")
        if target == "time":
            self.state.seek(request.subscription, to_ns=request.time.ToNanoseconds())
        elif target == "snapshot":
            self.state.seek(request.subscription, snapshot=request.snapshot)
        else:
            raise _invalid("A seek needs a time or a snapshot.")
        return pb["SeekResponse"]()

    async def pull(self, request: Any, context: Any = None) -> Any:
        if request.max_messages <= 0:
            raise _invalid("max_messages must be a positive integer.")
        state = self.state
        sub = state.live_subscription(request.subscription)
        give_up = state.clock() + (0 if request.return_immediately else self.pull_wait)
        while True:
            sub.changed.clear()
            taken = state.take(sub, min(request.max_messages, 1000))
            if taken and context is not None and (context.cancelled() or context.done()):
                state.release(sub, taken)  # nobody will read this answer
                return pb["PullResponse"]()
            if taken or state.subscriptions.get(sub.config.name) is not sub:
                return pb["PullResponse"](received_messages=taken)
            left = give_up - state.clock()
            if left <= 0:
                return pb["PullResponse"]()
            await _wait(sub, min(left, _until(state, sub)))

    async def streaming_pull(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        state = self.state
        try:
            first = await anext(aiter(requests))
        except StopAsyncIteration:
            return
        try:
            sub = state.live_subscription(first.subscription)
            deadline = first.stream_ack_deadline_seconds
            if not state.min_ack_deadline <= deadline <= MAX_ACK_DEADLINE:
                raise _invalid(
                    f"Invalid stream_ack_deadline_seconds: {deadline}; it must be between "
                    f"{state.min_ack_deadline} and {MAX_ACK_DEADLINE} seconds."
                )
            self._stream_control(sub, first)
        except _Abort as exc:
            await context.abort(exc.code, exc.message)
            return
        stream = _Stream(deadline, first.max_outstanding_messages, first.max_outstanding_bytes)
        closed = asyncio.Event()

        async def read() -> None:
            try:
                async for request in requests:
                    if request.stream_ack_deadline_seconds:
                        stream.deadline = max(
                            state.min_ack_deadline,
                            min(request.stream_ack_deadline_seconds, MAX_ACK_DEADLINE),
                        )
                    try:
                        self._stream_control(sub, request)
                    except _Abort as exc:
                        log.warning("StreamingPull control request refused: %s", exc.message)
            finally:
                closed.set()
                sub.poke()

        reader = asyncio.create_task(read())
        properties = t.StreamingPullResponse.SubscriptionProperties.pb()(
            message_ordering_enabled=sub.ordered, exactly_once_delivery_enabled=sub.exactly_once
        )
        try:
            while not closed.is_set() and state.subscriptions.get(sub.config.name) is sub:
                sub.changed.clear()
                taken = state.take(sub, 1000, stream)
                if taken:
                    response = pb["StreamingPullResponse"](received_messages=taken)
                    response.subscription_properties.CopyFrom(properties)
                    yield response
                    continue
                await _wait(sub, _until(state, sub), closed)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    def _stream_control(self, sub: _Subscription, request: Any) -> None:
        name = sub.config.name
        if request.ack_ids:
            self.state.acknowledge(name, request.ack_ids)
        if len(request.modify_deadline_ack_ids) != len(request.modify_deadline_seconds):
            raise _invalid("modify_deadline_seconds and modify_deadline_ack_ids differ in length")
        by_seconds: dict[int, list[str]] = {}
        for ack_id, seconds in zip(
            request.modify_deadline_ack_ids, request.modify_deadline_seconds, strict=True
        ):
            by_seconds.setdefault(seconds, []).append(ack_id)
        for seconds, ack_ids in by_seconds.items():
            self.state.modify_ack_deadline(name, ack_ids, seconds)


def _until(state: PubSubState, sub: _Subscription) -> float:
    wake = state.next_wakeup(sub)
    return 1.0 if wake is None else max(min(wake - state.clock(), 1.0), 0.001)


async def _wait(sub: _Subscription, seconds: float, closed: asyncio.Event | None = None) -> None:
    waiters = [asyncio.ensure_future(sub.changed.wait())]
    if closed is not None:
        waiters.append(asyncio.ensure_future(closed.wait()))
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
