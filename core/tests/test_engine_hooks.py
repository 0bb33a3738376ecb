"""The engine's hooks: one protocol, plain values, a fixed order, nothing called in vain."""

from __future__ import annotations

import uuid
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

import pytest
from engine_harness import AckTrigger, Upstream, Watcher

from acklane.core import SharedStreamManager
from acklane.core.manager import HookChain, Hooks, Received, Verdict, hook_of
from acklane.core.producer import AdvanceItem
from acklane.core.testing import eventually


@pytest.fixture(params=["generator", "inline"], autouse=True)
def watcher_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """The hooks see the same moments whichever path a filter takes."""
    Watcher.inline_mode = request.param == "inline"
    yield request.param
    Watcher.inline_mode = False


class Recorder(Hooks):
    """Writes down every moment it is told of, as plain values."""

    def __init__(self, name: str = "", calls: list[tuple[Any, ...]] | None = None) -> None:
        self.name = name
        self.calls: list[tuple[Any, ...]] = [] if calls is None else calls

    def received(self, key: Hashable, messages: Sequence[Received]) -> None:
        self.calls += [("received", m.raw) for m in messages]

    def filtered(self, key: Hashable, message: Received, verdict: Verdict) -> None:
        self.calls.append(("filtered", message.raw, verdict))

    def advanced(self, key: Hashable, batch: Sequence[AdvanceItem]) -> None:
        self.calls.append((self.name or "advanced", [item.broker_payload for item in batch]))


def _odd_fires_three_rejected(raw: Any) -> Any:
    return "reject" if raw == 3 else [raw] if raw % 2 else []


async def test_hooks_see_each_message_and_each_verdict_in_plain_values() -> None:
    up = Upstream(f"up-{uuid.uuid4().hex[:8]}")
    recorder = Recorder()
    manager = SharedStreamManager(ack_timeout=30.0, hooks=recorder)
    Watcher(manager, "w", AckTrigger(up.name, _odd_fires_three_rejected)).start()
    await eventually(lambda: bool(manager.group_stats()))
    up.push(1, 2, 3)
    await eventually(lambda: len(up.items) == 3)
    await manager.stop_all()
    calls = recorder.calls
    assert [c[1] for c in calls if c[0] == "received"] == [1, 2, 3]
    assert [c[2] for c in calls if c[0] == "filtered"] == [
        Verdict("w", "fired", 1),
        Verdict("w", "acked"),
        Verdict("w", "rejected", 0, "rejected 3"),
    ]
    assert sorted(p for c in calls if c[0] == "advanced" for p in c[1]) == [1, 2, 3]


async def test_a_chain_calls_its_hooks_in_order_after_the_constructors_callbacks() -> None:
    up = Upstream(f"up-{uuid.uuid4().hex[:8]}")
    calls: list[tuple[Any, ...]] = []
    manager = SharedStreamManager(
        ack_timeout=30.0,
        on_advance=lambda key, batch: calls.append(
            ("on_advance", [i.broker_payload for i in batch])
        ),
        hooks=HookChain(Recorder("first", calls), Recorder("second", calls)),
    )
    Watcher(manager, "w", AckTrigger(up.name)).start()
    await eventually(lambda: bool(manager.group_stats()))
    up.push(1)
    await eventually(lambda: len(up.items) == 1)
    await manager.stop_all()
    assert [c[0] for c in calls if c[0] not in ("received", "filtered")] == [
        "on_advance",
        "first",
        "second",
    ]


def test_a_moment_nobody_overrides_has_no_hook_to_call() -> None:
    class Advances(Hooks):
        def advanced(self, key: Hashable, batch: Sequence[AdvanceItem]) -> None:
            pass

    assert hook_of(Hooks(), "received") is None
    assert hook_of(HookChain(Hooks(), Advances()), "received") is None
    only = Advances()
    assert hook_of(HookChain(Hooks(), only), "advanced") == only.advanced
    assert hook_of(HookChain(only, Advances()), "advanced") is not None
