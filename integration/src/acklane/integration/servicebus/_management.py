"""``$management``: the request/response operations the SDK sends on an entity's
management link (renew-lock, peek, receive-by-sequence-number, schedule / cancel,
update-disposition, session lock and state, rules, list-sessions).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import proton
from proton import (
    Array,
    Data,
    symbol,
)

from ._broker import Broker, Entity, Lock, SessionState, decode_message
from ._codec import (
    _ms,
    _text,
    _uuid,
    _values,
)
from ._rules import Rule, RuleError

# proton's annotations are narrower than what it accepts: its messages are handled as Any.
Message: Any = proton.Message

__all__ = ["Management"]

#: list-sessions' "no filter" value of last-updated-time: the year 10000, in seconds.
_LIST_SESSIONS_SENTINEL_S = 253402300800.0


#: The error a refused settlement is answered with (not retried by the SDK).
_REFUSED_CONDITION = "com.microsoft:argument-error"
_REFUSED = "settlement refused: the emulator was told to refuse it (POST /faults)"


class _MgmtError(Exception):
    def __init__(self, status: int, condition: str, description: str) -> None:
        super().__init__(description)
        self.status, self.condition, self.description = status, condition, description


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


class Management:
    """The ``$management`` operations on one namespace's broker (reactor thread).

    ``pump`` delivers an entity's ready messages (after a settlement or a session's
    release); ``refused`` says whether a settlement is to be refused (a fault told
    through the admin endpoint).
    """

    def __init__(
        self,
        broker: Broker,
        pump: Callable[[Entity], None],
        refused: Callable[[Entity], bool],
        release_session: Callable[[Entity, SessionState], None],
    ) -> None:
        self.broker = broker
        self._pump = pump
        self._refused = refused
        self._release_session = release_session

    def answer(self, path: str, request: Any, *, authorized: bool) -> Any:
        """The reply to a request on ``path``'s management link."""
        operation = _text((request.properties or {}).get("operation"))
        body = request.body if isinstance(request.body, dict) else {}
        reply = Message()
        try:
            if not authorized:
                raise _MgmtError(401, "amqp:unauthorized-access", "put a token on $cbs first")
            value = self._operate(operation, path, body)
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
