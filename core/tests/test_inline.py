"""Pure filters evaluated inline by the group, the JSON decoder and the store's encoder.

The engine's rules hold on the inline path (test_engine_rules.py runs every rule on
both paths); here: random mixes of inline verdicts against a model (the property
test), one decode per message for all the watchers, and msgspec agreeing with the
standard library on what is JSON and what it means.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import uuid
from collections.abc import AsyncIterator, Hashable, Iterable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acklane.core import AdvanceItem, BaseEventTrigger, RawMessage, SharedStreamManager
from acklane.core.events._model import encode_fields  # the store's encoder, without a store
from acklane.core.manager import BoundEvent, Rejected
from acklane.core.message import BodyDecodeError

# _make_test: the generic rule the fast path must agree with (no public name says it)
from acklane.core.pipeline.filters import _make_test, compile_filter
from acklane.core.producer import LaneBatch, SharedStreamProducer

# -- the JSON decoder: msgspec first, the standard library's verdict in every case ---------

BODIES = [
    b'{"a": 1, "b": [1, 2.5, "x"], "c": null, "d": true}',
    b"123456789012345678901234567890",  # beyond 64 bits: exact, as json.loads gives it
    b"-9223372036854775809",
    b"1E400",  # json.loads: inf
    b"NaN",
    b"[Infinity, -Infinity]",
    b'"\\ud800"',  # a lone surrogate escape: json.loads takes it
    b'{"a": 1, "a": 2}',
    b"\xef\xbb\xbf{}",  # a BOM: refused by both
    b'"\xff"',  # not UTF-8
    b"[1,]",
    b"",
    b'  {"x": "\\u00e9"}\n',
    b'"a\x01b"',  # a raw control character
]


@pytest.mark.parametrize("body", BODIES)
def test_json_decodes_as_the_standard_library_does(body: bytes) -> None:
    message = RawMessage(body=body, message_id="m")
    try:
        expected: Any = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        with pytest.raises(BodyDecodeError) as err:
            message.json()
        assert "body is not" in str(err.value)
        return
    got = message.json()
    if isinstance(expected, float) and math.isnan(expected):
        assert math.isnan(got)
    else:
        assert got == expected and type(got) is type(expected)
        assert json.dumps(got) == json.dumps(expected)


def test_a_body_is_decoded_once_for_every_watcher_evaluating_the_message() -> None:
    decodes: list[bytes] = []

    class Counting(RawMessage):
        __slots__ = ()

        def json(self) -> Any:
            decodes.append(self.body)
            return RawMessage.json(self)

    filters = [compile_filter({"match": {"body.k": i}}).evaluator for i in range(5)]
    first, second = Counting(body=b'{"k": 3}'), Counting(body=b'{"k": 4}')
    assert [f(first) for f in filters] == [[], [], [], [{"k": 3}], []]
    assert [f(second) for f in filters] == [[], [], [], [], [{"k": 4}]]
    assert len(decodes) == 2
    assert filters[3](first) == [{"k": 3}]  # kept on the message, not only the last one's
    assert len(decodes) == 2
    bad = Counting(body=b"{oops")
    verdicts = [f(bad) for f in filters]
    assert all(isinstance(v, Rejected) and "not JSON" in v.reason for v in verdicts)
    assert len(decodes) == 3  # the failure is remembered too


VALUES = [0, 1, 1.0, 2, -1, True, False, None, "1", "x", "", [1], {"a": 1}, 10**30, 0.5]


@pytest.mark.parametrize("operand", [0, 1, 1.0, True, False, None, "1", "x", "", 0.5])
def test_a_one_field_eq_decides_as_the_generic_rule(operand: Any) -> None:
    generic = _make_test("eq", operand)
    compiled = compile_filter({"match": {"body.v": operand}}).evaluator
    nested = compile_filter({"match": {"body.a.v": operand}}).evaluator
    for value in VALUES:
        body = json.dumps({"v": value}).encode()
        assert bool(compiled(RawMessage(body=body))) is generic(value), (operand, value)
        wrapped = json.dumps({"a": {"v": value}}).encode()
        assert bool(nested(RawMessage(body=wrapped))) is generic(value), (operand, value)
    assert compiled(RawMessage(body=b"{}")) == []  # missing
    assert compiled(RawMessage(body=b"[1]")) == []  # not a mapping


# -- the store's encoder: only JSON values, and what is read back is what was put ---------


@pytest.mark.parametrize(
    "payload",
    [
        {"a": 1, "b": [1.5, None, True], "é": "ü"},
        10**30,
        "\ud800",  # a lone surrogate: msgspec refuses it, the standard library escapes it
        [[[[]]]],
        {"deep": [{"x": -0.0}]},
    ],
)
def test_a_json_payload_is_stored_as_text_that_reads_back_equal(payload: Any) -> None:
    row = encode_fields("w", "k", payload, "m", 0)
    assert json.loads(row[2]) == payload


@pytest.mark.parametrize(
    "payload, where",
    [
        (float("nan"), "is a float nan"),
        ({"x": [float("inf")]}, "is a float inf"),
        ((1, 2), "is a tuple"),
        ({1: "a"}, "has a key 1"),
        ({"at": datetime.date(2026, 1, 1)}, "is a date"),
        ({"id": uuid.UUID(int=1)}, "is a UUID"),
        ({"s": {1, 2}}, "is a set"),
    ],
)
def test_a_payload_that_is_not_exactly_json_is_refused(payload: Any, where: str) -> None:
    with pytest.raises(TypeError, match="payload is not a JSON value") as err:
        encode_fields("w", "k", payload, "m", 0)
    assert where in str(err.value)


# -- random inline verdicts against a model ------------------------------------------------


class _Producer(SharedStreamProducer):
    """A pushed batch whose first id is odd goes out as one LaneBatch (lane "a"), any
    other as plain pairs, each of the lane its id's parity says ("a" odd, None even)."""

    def __init__(self, queue: asyncio.Queue[list[int]]) -> None:
        self.queue = queue
        self.batches: list[list[AdvanceItem]] = []
        self.lane_of: dict[int, Hashable] = {}

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        raise AssertionError("the engine prefers open_batches")
        yield  # pragma: no cover

    def open_batches(self) -> AsyncIterator[Iterable[tuple[Any, Any]]] | None:
        return self._batches()

    async def _batches(self) -> AsyncIterator[Iterable[tuple[Any, Any]]]:
        while True:
            ids = await self.queue.get()
            pairs = [(i, i) for i in ids]
            whole = ids[0] % 2 == 1
            for i in ids:
                self.lane_of[i] = "a" if whole or i % 2 else None
            yield LaneBatch("a", pairs) if whole else pairs

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        self.batches.append(list(batch))

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        return self.lane_of[broker_payload]

    def message_id(self, broker_payload: Any) -> str | None:
        return f"m{broker_payload}"


_QUEUES: dict[str, asyncio.Queue[list[int]]] = {}
_PRODUCERS: dict[str, _Producer] = {}


class _Trigger(BaseEventTrigger):
    def __init__(self, name: str) -> None:
        self.name = name

    def shared_stream_key(self) -> Hashable:
        return ("inline-prop", self.name)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        producer = _PRODUCERS[kwargs["name"]] = _Producer(_QUEUES[kwargs["name"]])
        return producer


# a verdict per (watcher, event): what its filter does with it
VERDICTS = st.sampled_from(["nothing", "one", "two", "reject", "raise"])


async def _scenario(
    watchers: int, batches: list[list[list[str]]], defer_confirm: list[bool]
) -> None:
    name = f"p{uuid.uuid4().hex[:8]}"
    _QUEUES[name] = asyncio.Queue()
    manager = SharedStreamManager(max_subscriber_queue=64, ack_timeout=60.0)
    trigger = _Trigger(name)
    key = trigger.shared_stream_key()
    table: dict[tuple[int, int], str] = {}
    pending: list[int] = []
    alive = [True] * watchers
    expected: dict[int, list[int]] = {}  # acked, failed, rejected
    # what each watcher emitted with its confirmation deferred: acked once confirmed,
    # failed if the watcher fails first (it is failed out of everything it holds)
    awaiting: list[list[int]] = [[] for _ in range(watchers)]

    def evaluator(w: int) -> Any:
        def evaluate(raw: int) -> list[Any] | Rejected:
            verdict = table[(w, raw)]
            if verdict == "raise":
                raise RuntimeError(f"bug on {raw}")
            if verdict == "reject":
                return Rejected(f"w{w} rejects {raw}")
            return {"nothing": [], "one": [raw], "two": [raw, raw]}[verdict]

        return evaluate

    def emitter(w: int) -> Any:
        def emit(payload: Any, bound: BoundEvent | None) -> None:
            assert bound is not None and bound.message_id == f"m{payload}"
            if defer_confirm[w]:
                pending.append(bound.seq)
            else:
                manager.confirm_persisted([bound.seq])

        return emit

    subs = [
        manager.inline_subscription(
            trigger_id=f"w{w}", trigger=trigger, key=key, evaluate=evaluator(w), emit=emitter(w)
        )
        for w in range(watchers)
    ]
    waits = [asyncio.ensure_future(s.wait()) for s in subs]
    next_id = 1
    for rows in batches:
        ids = list(range(next_id, next_id + len(rows)))
        next_id += len(rows)
        # a LaneBatch (odd first id) is broadcast at once, to the snapshot of its start:
        # a member failed on the way counts as failed for the rest of it
        whole = ids[0] % 2 == 1
        snapshot = [w for w in range(watchers) if alive[w]]
        for raw, row in zip(ids, rows, strict=True):
            if not whole:
                snapshot = [w for w in range(watchers) if alive[w]]
            counts = [0, 0, 0]
            for w in range(watchers):
                # watcher w's verdict on this message: the row, rotated by w
                table[(w, raw)] = verdict = row[w % len(row)]
                if w not in snapshot:
                    continue
                if not alive[w] or verdict == "raise":
                    if alive[w]:
                        alive[w] = False
                        for held in awaiting[w]:
                            expected[held][0] -= 1
                            expected[held][1] += 1
                        awaiting[w].clear()
                    counts[1] += 1
                elif verdict == "reject":
                    counts[2] += 1
                else:
                    counts[0] += 1
                    if verdict != "nothing" and defer_confirm[w]:
                        awaiting[w].append(raw)
            expected[raw] = counts
        _QUEUES[name].put_nowait(ids)
        for _ in range(10):
            await asyncio.sleep(0)
    manager.confirm_persisted(pending)
    for _ in range(20):
        await asyncio.sleep(0)
    producer = _PRODUCERS[name]
    advanced = [item for batch in producer.batches for item in batch]
    got = {
        item.broker_payload: (item.outcome.acked, item.outcome.failed, item.outcome.rejected)
        for item in advanced
    }
    assert len(advanced) == len(got) == len(expected)  # each advanced exactly once
    assert got == {raw: tuple(counts) for raw, counts in expected.items()}
    for lane in (None, "a"):
        order = [i.broker_payload for i in advanced if producer.lane_of[i.broker_payload] == lane]
        assert order == sorted(order)
    for i in advanced:
        reasons = set(i.outcome.reject_reasons)
        assert len(reasons) == i.outcome.rejected
    for w, done in enumerate(waits):
        assert done.done() == (not alive[w])
        if not alive[w]:
            assert isinstance(done.exception(), RuntimeError)
    await manager.stop_all()
    for s in subs:
        await s.aclose()
    await asyncio.gather(*waits, return_exceptions=True)
    del _QUEUES[name], _PRODUCERS[name]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(1, 4),
    st.lists(
        st.lists(st.lists(VERDICTS, min_size=1, max_size=4), min_size=1, max_size=6),
        min_size=1,
        max_size=6,
    ),
    st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_random_inline_verdicts_resolve_every_message_as_the_model_says(
    watchers: int, batches: list[list[list[str]]], defer: list[bool]
) -> None:
    """Each message is advanced once, in lane order, with the outcome counts of its
    snapshot: acked (nothing fired, or every event confirmed), rejected with a reason,
    failed by a raising filter (out of later snapshots: its wait() raises)."""
    asyncio.run(_scenario(watchers, batches, defer))
