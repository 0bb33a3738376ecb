"""acklane's Service Bus emulator: an AMQP 1.0 server (python-qpid-proton) that the
official ``azure-servicebus`` SDK (>= 7.15) talks to unchanged.

What it does: CBS token auth (SAS tokens signed with the configured key), queues
and topics with subscriptions and their ``$DeadLetterQueue`` sub-queues, peek-lock
and receive-and-delete receive with link credit and drain, complete / abandon /
defer / dead-letter settlement (on the link, or through ``$management``), delivery
counts and max delivery count, lock duration and expiry, the ``$management``
operations the SDK uses (renew-lock, peek, receive-by-sequence-number, schedule /
cancel, update-disposition, session lock and state), sessions (a session lock per
receive link, the next available one on request), TTL and batches.

Also subscription rules (SQL and correlation filters, SQL actions), listing
sessions, any AMQP body the SDK sends, and a frame sequencer that tolerates the
SDK's out-of-order delivery ids (docs/emulators.md).

What it does not: TLS, duplicate detection, forwarding, partitions, transactions,
persistence (a restart empties it); a Config.json asking for one of these is refused.

A small HTTP admin endpoint (``--admin-port``, :mod:`._serve`) creates, deletes and
counts entities for tests: the AMQP side follows the reactor, the admin side queues
commands to it (:meth:`ServiceBusServer.call`). Here, the links and their
deliveries; the rest by concept: SAS tokens (:mod:`._sas`), ``$management``
(:mod:`._management`), the AMQP encodings (:mod:`._codec`).
"""

from __future__ import annotations

import functools
import logging
import queue
import time
import uuid
from collections.abc import Callable
from typing import Any

import proton
from proton import (
    Condition,
    Delivery,
    Described,
    Endpoint,
    Handler,
    Terminus,
    symbol,
    ulong,
)
from proton.reactor import Container

from ._broker import Broker, Entity, Lock, SessionState, Stored, decode_message
from ._codec import (
    _DOTNET_EPOCH_TICKS,
    _path_of,
    _text,
    split_batch,
)
from ._config import EmulatorConfig, EntityProperties
from ._management import _REFUSED, _REFUSED_CONDITION, Management
from ._rules import Rule
from ._sas import DEFAULT_KEY, DEFAULT_KEY_NAME, verify_sas_token

# proton's annotations are narrower than what it accepts (binary delivery tags, mutable
# message sections): its links and messages are handled as Any here.
Link: Any = proton.Link
Message: Any = proton.Message

__all__ = ["ServiceBusServer"]

log = logging.getLogger("acklane.integration.servicebus")

_TICK = 0.05
_SESSION_FILTER = symbol("com.microsoft:session-filter")
_LOCKED_UNTIL_UTC = symbol("com.microsoft:locked-until-utc")
_TIMEOUT = symbol("com.microsoft:timeout")
_DEFAULT_SESSION_WAIT = 65.0


def _send_failure(condition: str, description: str) -> Condition:
    """The error of a refused transfer, with the info map the service always sends (the
    SDK's sender reads it, and fails its callback without one, leaving the send hung)."""
    return Condition(
        condition, description, {symbol("com.microsoft:tracking-id"): str(uuid.uuid4())}
    )


def _guarded(method: Callable[..., Any]) -> Callable[..., Any]:
    """A reactor callback that logs its exceptions instead of stopping the server."""

    @functools.wraps(method)
    def guarded(*args: Any) -> Any:
        try:
            return method(*args)
        except Exception:
            log.exception("%s failed", getattr(method, "__name__", method))
            return None

    return guarded


class _LinkInfo:
    """What the server knows of one link (kept on the proton link object)."""

    def __init__(self, kind: str, path: str) -> None:
        self.kind = kind  # cbs | mgmt | send | consume | reply
        self.path = path
        self.entity: Entity | None = None
        self.delete_on_send = False
        self.session: SessionState | None = None
        self.session_pending_until: float | None = None


class ServiceBusServer(Handler):
    """The reactor's handler: one instance serves one namespace."""

    def on_unhandled(self, method: str, *args: Any) -> None:
        pass

    def __init__(
        self,
        config: EmulatorConfig,
        *,
        host: str = "127.0.0.1",
        port: int = 5672,
        key_name: str = DEFAULT_KEY_NAME,
        key: str = DEFAULT_KEY,
    ) -> None:
        super().__init__()
        self.host, self.port = host, port
        self.key_name, self.key = key_name, key
        self.broker = Broker(config.namespace)
        self.broker.on_ready = self._pump
        self._mgmt = Management(self.broker, self._pump, self._refused, self._release_session)
        for name, props in config.queues.items():
            self.broker.create_queue(name, props)
        for topic in config.topics.values():
            self.broker.create_topic(topic.name, dict(topic.subscriptions), topic.rules)
        self.commands: queue.Queue[tuple[Callable[[], Any], queue.Queue[Any]]] = queue.Queue()
        self._links: list[Any] = []
        self._pending_sessions: list[Any] = []
        self.container: Container | None = None
        #: Settlements still to refuse, by entity path (``refuse_settlements``).
        self.refusals: dict[str, int] = {}

    # ------------------------------------------------------------------ reactor

    def on_reactor_init(self, event: Any) -> None:
        self.container = event.container
        event.container.listen(f"{self.host}:{self.port}")
        event.container.schedule(_TICK, self)

    def on_timer_task(self, event: Any) -> None:
        try:
            self._tick()
        except Exception:
            log.exception("tick failed")
        event.container.schedule(_TICK, self)

    def on_connection_bound(self, event: Any) -> None:
        sasl = event.transport.sasl()
        sasl.allow_insecure_mechs = True
        sasl.allowed_mechs("ANONYMOUS PLAIN")

    def on_connection_remote_open(self, event: Any) -> None:
        conn = event.connection
        if conn.state & Endpoint.LOCAL_UNINIT:
            conn.container = "acklane-servicebus-emulator"
            conn.open()

    def on_session_remote_open(self, event: Any) -> None:
        if event.session.state & Endpoint.LOCAL_UNINIT:
            event.session.open()

    def on_link_remote_open(self, event: Any) -> None:
        link = event.link
        if not link.state & Endpoint.LOCAL_UNINIT:
            return
        try:
            self._attach(link)
        except Exception as exc:
            log.exception("attach failed")
            self._refuse(link, "amqp:internal-error", str(exc))

    def on_link_flow(self, event: Any) -> None:
        link = event.link
        info: _LinkInfo | None = getattr(link, "sb", None)
        if info is None or info.kind != "consume" or info.entity is None:
            return
        self._pump(info.entity)
        if link.drain_mode and link.credit > 0:
            link.drained()

    def on_delivery(self, event: Any) -> None:
        link, delivery = event.link, event.delivery
        info: _LinkInfo | None = getattr(link, "sb", None)
        if info is None:
            return
        if link.is_receiver:
            if delivery.readable and not delivery.partial:
                raw = link.recv(delivery.pending)
                link.advance()
                try:
                    self._incoming(link, info, bytes(raw), delivery)
                except Exception as exc:
                    log.exception("incoming message failed")
                    delivery.local.condition = _send_failure("amqp:internal-error", str(exc))
                    delivery.update(Delivery.REJECTED)
                    delivery.settle()
                link.flow(1)
        elif info.kind == "consume" and delivery.remote_state and not delivery.local_state:
            # Settled by the receiver too (a pre-settled disposition, as the SDK sends to
            # release what it prefetched and will not hand on) or not: the outcome applies.
            self._disposition(info, delivery)

    def on_link_remote_close(self, event: Any) -> None:
        self._detach(event.link)
        if event.link.state & Endpoint.LOCAL_ACTIVE:
            event.link.close()

    def on_session_remote_close(self, event: Any) -> None:
        if event.session.state & Endpoint.LOCAL_ACTIVE:
            event.session.close()

    def on_connection_remote_close(self, event: Any) -> None:
        self._drop_connection(event.connection)
        if event.connection.state & Endpoint.LOCAL_ACTIVE:
            event.connection.close()

    def on_transport_closed(self, event: Any) -> None:
        if event.connection is not None:
            self._drop_connection(event.connection)

    # -------------------------------------------------------------------- links

    def _refuse(self, link: Any, condition: str, description: str) -> None:
        """Refuse a link as AMQP 1.0 says (2.6.3) and the service does: attach with a
        null terminus on our side (the target of a link the client sends on, the
        source of one it receives on), then detach at once with the error. The SDK
        then fails the open with the error's own exception (``amqp:not-found`` is
        ``MessagingEntityNotFoundError``) instead of a later, unknown send failure."""
        if link.is_receiver:
            link.source.copy(link.remote_source)
            link.target.type = Terminus.UNSPECIFIED  # encoded as null
        else:
            link.target.copy(link.remote_target)
            link.source.type = Terminus.UNSPECIFIED
        link.open()
        link.condition = Condition(condition, description)
        link.close()

    def _attach(self, link: Any) -> None:
        remote_node = link.remote_source if link.is_sender else link.remote_target
        address = remote_node.address or ""
        path = _path_of(address)
        if path == "$cbs":
            info = _LinkInfo("cbs" if link.is_receiver else "reply", path)
        elif path.lower().endswith("/$management"):
            info = _LinkInfo("mgmt" if link.is_receiver else "reply", path[: -len("/$management")])
        elif link.is_receiver:
            if not self._authorized(link):
                self._refuse(link, "amqp:unauthorized-access", "put a token on $cbs first")
                return
            if not self.broker.is_send_target(path):
                self._refuse(
                    link, "amqp:not-found", f"The messaging entity '{path}' could not be found."
                )
                return
            info = _LinkInfo("send", path)
        else:
            if not self._authorized(link):
                self._refuse(link, "amqp:unauthorized-access", "put a token on $cbs first")
                return
            entity = self.broker.resolve(path)
            if entity is None:
                self._refuse(
                    link, "amqp:not-found", f"The messaging entity '{path}' could not be found."
                )
                return
            info = _LinkInfo("consume", path)
            info.entity = entity
            info.delete_on_send = link.remote_snd_settle_mode == Link.SND_SETTLED
            filters = self._filters(link)
            wants_session = _SESSION_FILTER in filters
            if wants_session != entity.sessionful:
                self._refuse(
                    link,
                    "amqp:not-allowed" if wants_session else "com.microsoft:argument-error",
                    f"entity '{path}' "
                    + ("does not require sessions" if wants_session else "requires sessions"),
                )
                return
            link.sb = info
            if wants_session:
                self._session_attach(link, info, entity, filters[_SESSION_FILTER])
                return
        link.sb = info
        self._open(link)
        if link.is_receiver:
            link.flow(1000)
        if info.kind == "consume":
            assert info.entity is not None
            info.entity.consumers.append(link)
        self._links.append(link)

    def _open(self, link: Any, session_id: str | None = None, until: float = 0.0) -> None:
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        if link.is_receiver:
            link.max_message_size = ulong(1024 * 1024)
        if session_id is not None:
            link.source.filter.clear()
            link.source.filter.put_dict({_SESSION_FILTER: session_id})
            link.properties = {
                _LOCKED_UNTIL_UTC: int(until * 10_000_000) + _DOTNET_EPOCH_TICKS,
            }
        link.open()

    @staticmethod
    def _filters(link: Any) -> dict[Any, Any]:
        data = link.remote_source.filter
        data.rewind()
        if not data.next():
            return {}
        value: Any = data.get_object()
        return dict(value) if isinstance(value, dict) else {}

    def _authorized(self, link: Any) -> bool:
        return bool(getattr(link.connection, "sb_authorized", False))

    def _session_attach(self, link: Any, info: _LinkInfo, entity: Entity, wanted: Any) -> None:
        now = time.time()
        if isinstance(wanted, Described):
            wanted = wanted.value
        if wanted is not None:
            session_id = str(wanted)
            state = entity.sessions.setdefault(session_id, SessionState(session_id))
            if state.owner is not None:
                self._refuse(
                    link,
                    "com.microsoft:session-cannot-be-locked",
                    f"The session '{session_id}' is locked by another receiver.",
                )
                return
            self._grant_session(link, info, entity, state, now)
            return
        props = link.remote_properties or {}
        wait = props.get(_TIMEOUT)
        info.session_pending_until = now + (
            float(wait) / 1000 if wait is not None else _DEFAULT_SESSION_WAIT
        )
        if not self._try_next_session(link, info, entity, now):
            self._pending_sessions.append(link)

    def _try_next_session(self, link: Any, info: _LinkInfo, entity: Entity, now: float) -> bool:
        for state in entity.sessions.values():
            if state.owner is None and entity.has_ready(state.session_id):
                self._grant_session(link, info, entity, state, now)
                return True
        return False

    def _grant_session(
        self, link: Any, info: _LinkInfo, entity: Entity, state: SessionState, now: float
    ) -> None:
        state.owner = link
        state.until = now + entity.props.lock_duration
        info.session = state
        info.session_pending_until = None
        self._open(link, state.session_id, state.until)
        entity.consumers.append(link)
        self._links.append(link)
        self._pump(entity)

    def _detach(self, link: Any) -> None:
        info: _LinkInfo | None = getattr(link, "sb", None)
        if link in self._links:
            self._links.remove(link)
        if link in self._pending_sessions:
            self._pending_sessions.remove(link)
        if info is None or info.entity is None:
            return
        entity = info.entity
        if link in entity.consumers:
            entity.consumers.remove(link)
        if info.session is not None and info.session.owner == link:
            self._release_session(entity, info.session)
            info.session = None

    def _release_session(self, entity: Entity, state: SessionState) -> None:
        """The session's lock ends: its messages' locks end with it (abandoned)."""
        state.owner = None
        for lock in list(entity.locks.values()):
            if lock.session is state:
                entity.settle(lock, "abandon")
        self._pump(entity)

    def _drop_connection(self, conn: Any) -> None:
        for link in list(self._links) + list(self._pending_sessions):
            if link.connection == conn:
                self._detach(link)

    # ------------------------------------------------------------------ receive

    def _pump(self, entity: Entity) -> None:
        """Hand available messages to the consumers with credit, one each in turn."""
        now = time.time()
        progress = True
        while progress:
            progress = False
            for link in list(entity.consumers):
                if link.credit <= 0 or not link.state & Endpoint.LOCAL_ACTIVE:
                    continue
                info: _LinkInfo = link.sb
                session = info.session.session_id if info.session is not None else None
                stored = entity.next_ready(session, now)
                if stored is None:
                    continue
                self._deliver(link, info, entity, stored, now)
                progress = True
        for link in entity.consumers:
            if link.drain_mode and link.credit > 0:
                link.drained()
        if self._pending_sessions and entity.sessionful:
            for link in list(self._pending_sessions):
                info = link.sb
                if info.entity is entity and self._try_next_session(link, info, entity, now):
                    self._pending_sessions.remove(link)

    def _deliver(
        self, link: Any, info: _LinkInfo, entity: Entity, stored: Stored, now: float
    ) -> None:
        if info.delete_on_send:
            entity.messages.pop(stored.seq, None)
            delivery = link.delivery(uuid.uuid4().bytes_le)
            link.send(stored.encode())
            link.advance()
            delivery.settle()
            return
        until = info.session.until if info.session is not None else now + entity.props.lock_duration
        lock = entity.lock(stored, until)
        delivery = link.delivery(lock.token.bytes_le)
        delivery.sb_token = lock.token
        lock.delivery = delivery
        link.send(stored.encode(until))
        link.advance()

    def _disposition(self, info: _LinkInfo, delivery: Delivery) -> None:
        entity = info.entity
        assert entity is not None
        token: uuid.UUID | None = getattr(delivery, "sb_token", None)
        lock = None if token is None else entity.locks.get(token)
        remote = delivery.remote
        state = delivery.remote_state
        if delivery.settled:  # settled by the receiver already: nothing to answer
            if lock is not None and lock.delivery == delivery:
                self._apply(entity, lock, state, remote)
            delivery.settle()
            self._pump(entity)
            return
        if lock is None or lock.delivery != delivery:
            session = info.session is not None
            delivery.local.condition = Condition(
                "com.microsoft:session-lock-lost" if session else "com.microsoft:message-lock-lost",
                "The lock supplied is invalid. Either the lock expired, or the message has "
                "already been removed from the queue.",
            )
            delivery.update(Delivery.REJECTED)
            delivery.settle()
            return
        if state != Delivery.RECEIVED and self._refused(entity):
            delivery.local.condition = Condition(_REFUSED_CONDITION, _REFUSED)
            delivery.update(Delivery.REJECTED)
            delivery.settle()
            return  # not applied: the lock stays until it lapses
        if not self._apply(entity, lock, state, remote):
            return  # RECEIVED: not an outcome
        if state == Delivery.MODIFIED:
            delivery.local.failed = remote.failed
            delivery.local.undeliverable = remote.undeliverable
        # A rejected outcome is echoed without the error: carrying one means "not applied".
        delivery.update(state)
        delivery.settle()
        self._pump(entity)

    @staticmethod
    def _apply(entity: Entity, lock: Lock, state: Any, remote: Any) -> bool:
        """Apply a receiver's outcome to its lock; False when it is not an outcome."""
        if state == Delivery.ACCEPTED:
            entity.settle(lock, "complete")
        elif state == Delivery.REJECTED:
            condition = remote.condition
            details: Any = condition.info if condition is not None else None
            extra: dict[Any, Any] = dict(details or {})
            reason = extra.get("DeadLetterReason", extra.get(symbol("DeadLetterReason")))
            description = extra.get(
                "DeadLetterErrorDescription", extra.get(symbol("DeadLetterErrorDescription"))
            )
            entity.settle(
                lock,
                "dead-letter",
                reason=None if reason is None else str(reason),
                description=None if description is None else str(description),
            )
        elif state == Delivery.MODIFIED:
            if remote.undeliverable:
                entity.settle(lock, "defer")
            else:
                entity.settle(lock, "abandon", count=bool(remote.failed))
        elif state == Delivery.RELEASED:
            entity.settle(lock, "release", count=False)
        else:
            return False
        return True

    # -------------------------------------------------------------------- send

    def _incoming(self, link: Any, info: _LinkInfo, raw: bytes, delivery: Delivery) -> None:
        if info.kind in ("cbs", "mgmt"):
            request = Message()
            request.decode(raw)
            reply = (
                self._cbs(link, request) if info.kind == "cbs" else self._management(info, request)
            )
            reply.correlation_id = request.id
            delivery.update(Delivery.ACCEPTED)
            delivery.settle()
            self._reply(link, request, reply)
            return
        if info.kind != "send":
            delivery.update(Delivery.REJECTED)
            delivery.settle()
            return
        if not self.broker.is_send_target(info.path):
            delivery.local.condition = _send_failure(
                "amqp:not-found", f"entity '{info.path}' is gone"
            )
            delivery.update(Delivery.REJECTED)
            delivery.settle()
            return
        parts = split_batch(raw)
        for part in parts if parts is not None else [raw]:
            self.broker.enqueue(info.path, decode_message(part))
        delivery.update(Delivery.ACCEPTED)
        delivery.settle()

    def _reply(self, request_link: Any, request: Any, reply: Any) -> None:
        target = _path_of(request_link.remote_target.address)
        candidates = [
            link
            for link in self._links
            if link.connection == request_link.connection and link.is_sender
        ]
        chosen = None
        for link in candidates:
            if request.reply_to and link.remote_target.address == request.reply_to:
                chosen = link
                break
        if chosen is None:
            for link in candidates:
                if (
                    _path_of(link.remote_source.address) == target
                    and link.session == request_link.session
                ):
                    chosen = link
                    break
        if chosen is None:
            log.warning("no reply link for a request to %s", target)
            return
        chosen.delivery(uuid.uuid4().bytes)
        chosen.send(reply.encode())
        chosen.advance()

    def _cbs(self, link: Any, request: Any) -> Any:
        props: dict[Any, Any] = request.properties or {}
        reply = Message()
        if _text(props.get("operation")) != "put-token":
            reply.properties = {"status-code": 400, "status-description": "unknown operation"}
            return reply
        token_type = _text(props.get("type"))
        why = verify_sas_token(_text(request.body), self.key_name, self.key)
        if why is None and token_type in ("servicebus.windows.net:sastoken", "jwt"):
            link.connection.sb_authorized = True
            reply.properties = {"status-code": 202, "status-description": "Accepted"}
        else:
            reply.properties = {
                "status-code": 401,
                "status-description": f"Unauthorized: {why or 'unsupported token type'}",
            }
        return reply

    # -------------------------------------------------------------- management

    def _management(self, info: _LinkInfo, request: Any) -> Any:
        return self._mgmt.answer(info.path, request, authorized=self._authorized_conn_for(info))

    def _authorized_conn_for(self, info: _LinkInfo) -> bool:
        return True  # the request link itself was attached by an authorised connection

    def _tick(self) -> None:
        while True:
            try:
                command, answer = self.commands.get_nowait()
            except queue.Empty:
                break
            try:
                answer.put((True, command()))
            except Exception as exc:
                answer.put((False, exc))
        now = time.time()
        for entity in list(self.broker.entities()):
            changed = False
            for seq, stored in list(entity.scheduled.items()):
                annotations: dict[Any, Any] = stored.message.annotations or {}
                when = annotations.get(symbol("x-opt-scheduled-enqueue-time"))
                if when is None or float(when) / 1000 <= now:
                    del entity.scheduled[seq]
                    stored.enqueued = now
                    entity.add(stored)
                    changed = True
            for state in entity.sessions.values():
                if state.owner is not None and state.until <= now:
                    link = state.owner
                    self._release_session(entity, state)
                    if link in entity.consumers:
                        entity.consumers.remove(link)
                    if link in self._links:
                        self._links.remove(link)
                    if link.state & Endpoint.LOCAL_ACTIVE:
                        link.condition = Condition(
                            "com.microsoft:session-lock-lost", "The session lock has expired."
                        )
                        link.close()
                    changed = True
            for lock in list(entity.locks.values()):
                if lock.session is None and lock.until <= now:
                    entity.settle(lock, "expire")
                    changed = True
            if changed or entity.consumers:
                self._pump(entity)
        for link in list(self._pending_sessions):
            info = link.sb
            if info.session_pending_until is not None and info.session_pending_until <= now:
                self._pending_sessions.remove(link)
                self._refuse(link, "com.microsoft:timeout", "no session is available")

    # ------------------------------------------------------------------- admin

    def call(self, command: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Run ``command`` on the reactor thread (from another thread) and return its result."""
        answer: queue.Queue[Any] = queue.Queue()
        self.commands.put((command, answer))
        ok, value = answer.get(timeout=timeout)
        if not ok:
            raise value
        return value

    def create(self, spec: dict[str, Any]) -> None:
        if "queue" in spec:
            props = EntityProperties.from_kwargs(**(spec.get("properties") or {}))
            self.broker.create_queue(spec["queue"], props)
        elif "topic" in spec:
            subs = {
                s["name"]: EntityProperties.from_kwargs(**(s.get("properties") or {}))
                for s in spec.get("subscriptions") or ()
            }
            rules = {
                s["name"]: [Rule.from_json(r) for r in s.get("rules") or ()]
                for s in spec.get("subscriptions") or ()
            }
            self.broker.create_topic(spec["topic"], subs, rules)
        else:
            raise ValueError("expected 'queue' or 'topic'")

    def delete(self, name: str) -> None:
        for entity in self.broker.delete(name):
            for member in (entity, entity.dlq):
                if member is None:
                    continue
                for link in list(member.consumers):
                    self._detach(link)
                    if link.state & Endpoint.LOCAL_ACTIVE:
                        link.condition = Condition("amqp:not-found", f"entity '{name}' was deleted")
                        link.close()

    def counts(self, path: str) -> dict[str, int]:
        entity = self.broker.resolve(path)
        if entity is None:
            raise KeyError(path)
        return entity.counts()

    def refuse_settlements(self, path: str, times: int) -> None:
        """Refuse the next ``times`` settlements of the entity (a fault, for tests): each is
        answered with an error and not applied, so its message comes back when its lock
        lapses."""
        entity = self.broker.resolve(path)
        if entity is None:
            raise KeyError(path)
        self.refusals[entity.path] = times

    def _refused(self, entity: Entity) -> bool:
        left = self.refusals.get(entity.path, 0)
        if left <= 0:
            return False
        self.refusals[entity.path] = left - 1
        return True


# Every reactor callback guarded once, here (not on every attribute access).
for _name, _callback in list(vars(ServiceBusServer).items()):
    if _name.startswith("on_") and callable(_callback):
        setattr(ServiceBusServer, _name, _guarded(_callback))
