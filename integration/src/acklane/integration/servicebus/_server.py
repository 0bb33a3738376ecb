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

A small HTTP admin endpoint (``--admin-port``) creates, deletes and counts entities
for tests: the AMQP side follows the reactor, the admin side queues commands to it.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import logging
import os
import queue
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import proton
from proton import (
    Array,
    Condition,
    Data,
    Delivery,
    Described,
    Endpoint,
    Handler,
    Terminus,
    symbol,
    timestamp,
    ulong,
)
from proton.reactor import Container

from ..emulator import free_port
from ._broker import Broker, Entity, Lock, SessionState, Stored, decode_message
from ._config import EmulatorConfig, EntityProperties
from ._rules import Rule, RuleError
from ._sequencer import FrameSequencer

# proton's annotations are narrower than what it accepts (binary delivery tags, mutable
# message sections): its links and messages are handled as Any here.
Link: Any = proton.Link
Message: Any = proton.Message

__all__ = ["DEFAULT_KEY", "DEFAULT_KEY_NAME", "ServiceBusServer", "serve"]

log = logging.getLogger("acklane.integration.servicebus")

DEFAULT_KEY_NAME = "RootManageSharedAccessKey"
DEFAULT_KEY = "SAS_KEY_VALUE"
_TICK = 0.05
#: Set to 0 to serve proton directly, without the frame sequencer in front of it.
SEQUENCER_ENV = "ACKLANE_SERVICEBUS_SEQUENCER"
_SESSION_FILTER = symbol("com.microsoft:session-filter")
_LOCKED_UNTIL_UTC = symbol("com.microsoft:locked-until-utc")
_TIMEOUT = symbol("com.microsoft:timeout")
_DOTNET_EPOCH_TICKS = 621355968000000000
_DATA_SECTION = 0x75
_SECTION_PREFIX = b"\x00\x53"
_DEFAULT_SESSION_WAIT = 65.0
#: list-sessions' "no filter" value of last-updated-time: the year 10000, in seconds.
_LIST_SESSIONS_SENTINEL_S = 253402300800.0


#: The error a refused settlement is answered with (not retried by the SDK).
_REFUSED_CONDITION = "com.microsoft:argument-error"
_REFUSED = "settlement refused: the emulator was told to refuse it (POST /faults)"


class _MgmtError(Exception):
    def __init__(self, status: int, condition: str, description: str) -> None:
        super().__init__(description)
        self.status, self.condition, self.description = status, condition, description


def _send_failure(condition: str, description: str) -> Condition:
    """The error of a refused transfer, with the info map the service always sends (the
    SDK's sender reads it, and fails its callback without one, leaving the send hung)."""
    return Condition(
        condition, description, {symbol("com.microsoft:tracking-id"): str(uuid.uuid4())}
    )


def _plain_description(rule: Rule) -> dict[str, Any]:
    """A rule's description as AMQP-encodable strings and maps."""
    description = dict(rule.description or {})
    out: dict[str, Any] = {}
    kind = description.get("filter", {}).get("type", "true")
    if kind == "sql":
        out["sql-filter"] = {"expression": description["filter"]["expression"]}
    elif kind == "correlation":
        out["correlation-filter"] = {
            k: v for k, v in description["filter"].items() if k != "type" and v is not None
        }
    else:
        out[f"{kind}-filter"] = {}
    if "action" in description:
        out["sql-rule-action"] = {"expression": description["action"]}
    return out


def _lock_lost(description: str = "The lock supplied is invalid.") -> _MgmtError:
    return _MgmtError(410, "com.microsoft:message-lock-lost", description)


def _path_of(address: str | None) -> str:
    if not address:
        return ""
    if "://" in address:
        return urllib.parse.urlparse(address).path.strip("/")
    return address.strip("/")


def _values(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, Array):
        return list(value.elements)
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


def _uuid(value: Any) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return uuid.UUID(bytes_le=bytes(value))
    return uuid.UUID(str(value))


def _text(value: Any) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors="replace")
    return "" if value is None else str(value)


def _ms(seconds: float) -> timestamp:
    return timestamp(int(seconds * 1000))


def split_batch(raw: bytes) -> list[bytes] | None:
    """The encoded messages of a batch (a message whose data sections are messages), else None."""
    parts: list[bytes] = []
    sections = 0
    offset = 0
    while offset < len(raw):
        data = Data()
        try:
            used = data.decode(raw[offset:])
        except Exception:
            return None
        offset += used
        data.rewind()
        if data.next() != Data.DESCRIBED:
            return None
        data.enter()
        data.next()
        # only the descriptor is read: a section's value may be one proton cannot turn
        # into Python objects (see decode_message)
        descriptor = int(data.get_ulong()) if data.type() == Data.ULONG else -1
        sections += 1
        if descriptor == _DATA_SECTION:
            data.next()
            if data.type() != Data.BINARY:
                return None
            body = bytes(data.get_binary())
            if not body.startswith(_SECTION_PREFIX):
                return None
            parts.append(body)
        elif descriptor in (0x74, 0x77, 0x76):  # application properties or a non-data body
            return None
    if not parts:
        return None
    for part in parts:
        try:
            decode_message(part)
        except Exception:
            return None
    return parts


def verify_sas_token(token: str, key_name: str, key: str, now: float | None = None) -> str | None:
    """None when the token is signed with ``key`` and not expired, else why not."""
    if not token.startswith("SharedAccessSignature "):
        return "not a SharedAccessSignature token"
    fields: dict[str, str] = {}
    for part in token[len("SharedAccessSignature ") :].split("&"):
        name, _, value = part.partition("=")
        fields[name] = value
    try:
        resource, expiry = fields["sr"], fields["se"]
        signature = urllib.parse.unquote_plus(fields["sig"])
    except KeyError:
        return "incomplete token"
    if fields.get("skn") != key_name:
        return f"unknown key name {fields.get('skn')!r}"
    expected = base64.b64encode(
        hmac.new(key.encode(), f"{resource}\n{expiry}".encode(), hashlib.sha256).digest()
    ).decode()
    if not hmac.compare_digest(expected, signature):
        return "invalid signature"
    if int(expiry) < (now or time.time()):
        return "token expired"
    return None


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
        operation = _text((request.properties or {}).get("operation"))
        body = request.body if isinstance(request.body, dict) else {}
        reply = Message()
        try:
            if not self._authorized_conn_for(info):
                raise _MgmtError(401, "amqp:unauthorized-access", "put a token on $cbs first")
            value = self._operate(operation, info.path, body)
        except _MgmtError as exc:
            reply.properties = {
                "statusCode": exc.status,
                "statusDescription": exc.description,
                "errorCondition": symbol(exc.condition),
            }
            return reply
        status = 200
        if value is None:
            status, value = 204, None
        reply.properties = {"statusCode": status, "statusDescription": "OK"}
        reply.body = value
        return reply

    def _authorized_conn_for(self, info: _LinkInfo) -> bool:
        return True  # the request link itself was attached by an authorised connection

    def _entity(self, path: str) -> Entity:
        entity = self.broker.resolve(path)
        if entity is None:
            raise _MgmtError(
                404, "amqp:not-found", f"The messaging entity '{path}' could not be found."
            )
        return entity

    def _locks(self, entity: Entity, tokens: list[Any]) -> list[Lock]:
        locks = []
        for raw in tokens:
            lock = entity.locks.get(_uuid(raw))
            if lock is None:
                raise _lock_lost()
            locks.append(lock)
        return locks

    def _operate(self, operation: str, path: str, body: dict[Any, Any]) -> Any:
        now = time.time()
        op = operation.removeprefix("com.microsoft:")
        if op == "renew-lock":
            entity = self._entity(path)
            locks = self._locks(entity, _values(body.get("lock-tokens")))
            for lock in locks:
                lock.until = now + entity.props.lock_duration
            return {
                "expirations": Array(Data.NULL, Data.TIMESTAMP, *[_ms(lk.until) for lk in locks])
            }
        if op == "update-disposition":
            entity = self._entity(path)
            status = str(body.get("disposition-status", ""))
            outcome = {
                "completed": "complete",
                "abandoned": "abandon",
                "defered": "defer",
                "suspended": "dead-letter",
            }.get(status)
            if outcome is None:
                raise _MgmtError(400, "com.microsoft:argument-error", f"unknown status {status!r}")
            if self._refused(entity):
                raise _MgmtError(400, _REFUSED_CONDITION, _REFUSED)
            for lock in self._locks(entity, _values(body.get("lock-tokens"))):
                reason = body.get("deadletter-reason")
                description = body.get("deadletter-description")
                entity.settle(
                    lock,
                    outcome,
                    reason=None if reason is None else str(reason),
                    description=None if description is None else str(description),
                )
            self._pump(entity)
            return {}
        if op == "peek-message":
            entity = self._entity(path)
            start = int(body.get("from-sequence-number", 0))
            count = int(body.get("message-count", 1))
            session = body.get("session-id")
            found = [
                {"message": s.encode(state=entity.state_of(s))}
                for s in entity.peekable()
                if s.seq >= start and (session is None or s.session == str(session))
            ][:count]
            return {"messages": found} if found else None
        if op == "receive-by-sequence-number":
            entity = self._entity(path)
            mode = int(body.get("receiver-settle-mode", 1))
            out: list[dict[str, Any]] = []
            for seq in _values(body.get("sequence-numbers")):
                stored = entity.messages.get(int(seq))
                if stored is None or not stored.deferred:
                    raise _MgmtError(
                        404, "com.microsoft:message-not-found", f"no deferred message {seq}"
                    )
                if mode == 0:
                    entity.messages.pop(stored.seq, None)
                    out.append({"message": stored.encode()})
                else:
                    lock = entity.lock(stored, now + entity.props.lock_duration)
                    locked: dict[str, Any] = {"message": stored.encode(lock.until, state=1)}
                    locked["lock-token"] = lock.token
                    out.append(locked)
            return {"messages": out}
        if op == "schedule-message":
            if not self.broker.is_send_target(path):
                raise _MgmtError(404, "amqp:not-found", f"no entity {path!r}")
            seqs = []
            for item in _values(body.get("messages")):
                message = decode_message(bytes(item["message"]))
                seqs.append(self.broker.enqueue(path, message, scheduled=True))
            return {"sequence-numbers": Array(Data.NULL, Data.LONG, *seqs)}
        if op == "cancel-scheduled-message":
            if not self.broker.is_send_target(path):
                raise _MgmtError(404, "amqp:not-found", f"no entity {path!r}")
            self.broker.cancel_scheduled(
                path, [int(s) for s in _values(body.get("sequence-numbers"))]
            )
            return {}
        if op in ("renew-session-lock", "get-session-state", "set-session-state"):
            entity = self._entity(path)
            state = entity.sessions.get(str(body.get("session-id")))
            if state is None or state.owner is None:
                raise _MgmtError(
                    410, "com.microsoft:session-lock-lost", "The session lock was lost."
                )
            if op == "renew-session-lock":
                state.until = now + entity.props.lock_duration
                for lock in entity.locks.values():
                    if lock.session is state:
                        lock.until = state.until
                return {"expiration": _ms(state.until)}
            if op == "get-session-state":
                return {"session-state": state.state}
            raw = body.get("session-state")
            state.state = None if raw is None else bytes(raw)
            state.state_updated = now
            return {}
        if op == "get-message-sessions":
            return self._list_sessions(self._entity(path), body)
        if op in ("add-rule", "remove-rule", "enumerate-rules"):
            return self._rules_operation(op, self._entity(path), body)
        raise _MgmtError(400, "amqp:not-implemented", f"operation {operation!r} is not supported")

    @staticmethod
    def _rules_operation(op: str, entity: Entity, body: dict[Any, Any]) -> Any:
        """Rule management over ``$management`` (a subscription's rules).

        ``add-rule``: ``rule-name`` and ``rule-description`` with one of ``sql-filter``
        (``expression``), ``correlation-filter`` (its properties; ``properties`` for
        application properties), ``true-filter`` or ``false-filter``, and optionally
        ``sql-rule-action`` (``expression``). ``remove-rule``: ``rule-name``.
        ``enumerate-rules`` (``skip``, ``top``): ``{"rules": [{"rule-description":
        {...}}]}``, each with its ``rule-name``.
        """
        if entity.rules is None:
            raise _MgmtError(
                400, "com.microsoft:argument-error", f"'{entity.path}' is not a subscription"
            )
        if op == "enumerate-rules":
            skip = int(body.get("skip", 0) or 0)
            top = int(body.get("top", 100) or 100)
            listed = [
                {"rule-description": {"rule-name": r.name, **_plain_description(r)}}
                for r in list(entity.rules.values())[skip : skip + top]
            ]
            return {"rules": listed} if listed else None
        name = _text(body.get("rule-name"))
        if not name:
            raise _MgmtError(400, "com.microsoft:argument-error", "a rule-name is required")
        if op == "remove-rule":
            if name not in entity.rules:
                raise _MgmtError(
                    404, "com.microsoft:message-not-found", f"The rule '{name}' was not found."
                )
            del entity.rules[name]
            return {}
        if name in entity.rules:
            raise _MgmtError(
                409, "com.microsoft:entity-already-exists", f"The rule '{name}' already exists."
            )
        description = body.get("rule-description") or {}
        spec: dict[str, Any] = {"name": name}
        if "sql-filter" in description:
            spec["sql"] = _text((description["sql-filter"] or {}).get("expression"))
        elif "correlation-filter" in description:
            correlation = {
                _text(k): (
                    {_text(pk): pv for pk, pv in v.items()} if isinstance(v, dict) else _text(v)
                )
                for k, v in (description["correlation-filter"] or {}).items()
            }
            spec["correlation"] = {k.replace("-", ""): v for k, v in correlation.items()}
        elif "false-filter" in description:
            spec["filter_type"] = "false"
        else:
            spec["filter_type"] = "true"
        action = description.get("sql-rule-action")
        if action:
            spec["action"] = _text((action or {}).get("expression"))
        try:
            entity.rules[name] = Rule.from_json(spec)
        except RuleError as exc:
            raise _MgmtError(400, "com.microsoft:argument-error", str(exc)) from None
        return {}

    @staticmethod
    def _list_sessions(entity: Entity, body: dict[Any, Any]) -> Any:
        """The session ids with active messages or a stored state, as the service lists
        them; with a real ``last-updated-time`` (not the SDK's year-10000 sentinel),
        those whose state was set after it."""
        if not entity.sessionful:
            raise _MgmtError(
                400, "com.microsoft:argument-error", f"entity '{entity.path}' has no sessions"
            )
        since = body.get("last-updated-time")
        since_s = float(since) / 1000 if since is not None else None
        if since_s is not None and since_s >= _LIST_SESSIONS_SENTINEL_S:
            since_s = None
        ids: set[str] = set()
        if since_s is None:
            ids.update(s.session for s in entity.messages.values() if s.session is not None)
            ids.update(n for n, st in entity.sessions.items() if st.state is not None)
        else:
            ids.update(n for n, st in entity.sessions.items() if st.state_updated > since_s)
        skip = int(body.get("skip", 0) or 0)
        top = int(body.get("top", 100) or 100)
        page = sorted(ids)[skip : skip + top]
        if not page:
            return None  # 204 No Content: no session matches
        return {"skip": skip + len(page), "sessions-ids": Array(Data.NULL, Data.STRING, *page)}

    # -------------------------------------------------------------------- time

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


class _Admin(BaseHTTPRequestHandler):
    server_handler: ServiceBusServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)

    def _answer(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _run(self, command: Callable[[], Any]) -> None:
        try:
            result = self.server_handler.call(command)
        except KeyError as exc:
            self._answer(404, {"error": f"not found: {exc}"})
        except Exception as exc:
            self._answer(400, {"error": str(exc)})
        else:
            self._answer(200, result if result is not None else {})

    def do_GET(self) -> None:
        path = urllib.parse.unquote(self.path)
        if path == "/health":
            self._run(lambda: {"namespace": self.server_handler.broker.namespace})
        elif path.startswith("/entities/"):
            name = path[len("/entities/") :]
            self._run(lambda: self.server_handler.counts(name))
        else:
            self._answer(404, {"error": "unknown path"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        spec = json.loads(self.rfile.read(length) or b"{}")
        if urllib.parse.unquote(self.path) == "/faults":
            entity, times = str(spec.get("entity", "")), int(spec.get("settlements", 1))
            self._run(lambda: self.server_handler.refuse_settlements(entity, times))
        else:
            self._run(lambda: self.server_handler.create(spec))

    def do_DELETE(self) -> None:
        name = urllib.parse.unquote(self.path)[len("/entities/") :]
        self._run(lambda: self.server_handler.delete(name))


def serve(
    config: EmulatorConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 5672,
    admin_port: int | None = None,
    key_name: str = DEFAULT_KEY_NAME,
    key: str = DEFAULT_KEY,
) -> None:
    """Run the emulator until the process ends.

    Clients connect to ``port``, where the frame sequencer listens (see
    ``_sequencer``); proton serves on a loopback port of its own behind it.
    """
    if os.environ.get(SEQUENCER_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        handler = ServiceBusServer(config, host=host, port=port, key_name=key_name, key=key)
    else:
        engine_port = free_port()
        sequencer = FrameSequencer(host, port, ("127.0.0.1", engine_port))
        handler = ServiceBusServer(
            config, host="127.0.0.1", port=engine_port, key_name=key_name, key=key
        )
        sequencer.start()
    if admin_port is not None:
        admin_class = type("Admin", (_Admin,), {"server_handler": handler})
        httpd = ThreadingHTTPServer((host, admin_port), admin_class)
        threading.Thread(target=httpd.serve_forever, name="admin", daemon=True).start()
    Container(handler).run()
