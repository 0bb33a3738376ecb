"""Watcher filters: the declarative ``filter:`` block and function filters."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from acklane.core.message import RawMessage
from acklane.core.pipeline.filters import FilterSpecError, Rejected, compile_filter
from acklane.core.trigger import TriggerEvent, current_window


def msg(body: Any = None, *, raw: bytes | None = None, **attributes: str) -> RawMessage:
    data = raw if raw is not None else json.dumps(body).encode()
    return RawMessage(body=data, attributes=attributes, key="k1", message_id="t/0/7", source="t")


def fires(spec: dict[str, Any] | None, message: RawMessage) -> list[Any] | Rejected:
    return compile_filter(spec, label="watcher w").evaluate(message)


def matches(match: dict[str, Any], body: Any, **attributes: str) -> bool:
    return fires({"match": match}, msg(body, **attributes)) != []


# -- operators --------------------------------------------------------------------------


def test_a_bare_value_means_equality() -> None:
    assert matches({"body.type": "order.created"}, {"type": "order.created"})
    assert not matches({"body.type": "order.created"}, {"type": "order.paid"})


def test_eq_does_not_confuse_booleans_with_numbers() -> None:
    assert not matches({"body.flag": {"eq": 1}}, {"flag": True})
    assert matches({"body.flag": {"eq": True}}, {"flag": True})
    assert matches({"body.n": {"eq": 1}}, {"n": 1.0})


def test_ne_holds_for_a_different_or_missing_value() -> None:
    assert matches({"body.type": {"ne": "test"}}, {"type": "real"})
    assert matches({"body.type": {"ne": "test"}}, {})
    assert not matches({"body.type": {"ne": "test"}}, {"type": "test"})


@pytest.mark.parametrize(
    ("op", "operand", "value", "expected"),
    [
        ("gt", 100, 101, True),
        ("gt", 100, 100, False),
        ("gte", 100, 100, True),
        ("gte", 100, 99.5, False),
        ("lt", 10, 9, True),
        ("lt", 10, 10, False),
        ("lte", 10, 10, True),
        ("lte", 10, 11, False),
        ("gt", "2024-01-01", "2024-06-30", True),
        ("gt", 100, "1000", False),  # a string is not comparable with a number
        ("gt", 0, True, False),  # nor is a boolean
    ],
)
def test_ordering_operators_compare_numbers_with_numbers_and_strings_with_strings(
    op: str, operand: Any, value: Any, expected: bool
) -> None:
    assert matches({"body.x": {op: operand}}, {"x": value}) is expected


def test_ordering_operators_do_not_hold_for_a_missing_value() -> None:
    assert not matches({"body.amount": {"gt": 0}}, {})


def test_in_and_not_in_test_membership() -> None:
    assert matches({"attributes.source": {"in": ["web", "mobile"]}}, {}, source="web")
    assert not matches({"attributes.source": {"in": ["web", "mobile"]}}, {}, source="pos")
    assert matches({"attributes.source": {"not_in": ["test"]}}, {}, source="web")
    assert matches({"attributes.source": {"not_in": ["test"]}}, {})
    assert not matches({"attributes.source": {"not_in": ["test"]}}, {}, source="test")


def test_exists_tests_presence_even_of_null() -> None:
    assert matches({"body.x": {"exists": True}}, {"x": None})
    assert not matches({"body.x": {"exists": True}}, {})
    assert matches({"body.x": {"exists": False}}, {})


def test_regex_searches_strings_only() -> None:
    assert matches({"body.type": {"regex": r"^order\."}}, {"type": "order.created"})
    assert not matches({"body.type": {"regex": r"^order\."}}, {"type": "refund.order."})
    assert not matches({"body.type": {"regex": "1"}}, {"type": 1})


def test_contains_looks_into_strings_lists_and_mappings() -> None:
    assert matches({"body.note": {"contains": "rush"}}, {"note": "please rush it"})
    assert matches({"body.tags": {"contains": "vip"}}, {"tags": ["new", "vip"]})
    assert matches({"body.meta": {"contains": "trace"}}, {"meta": {"trace": 1}})
    assert not matches({"body.tags": {"contains": "vip"}}, {"tags": ["new"]})


def test_several_operators_on_one_path_must_all_hold() -> None:
    rule = {"body.amount": {"gt": 10, "lte": 20}}
    assert matches(rule, {"amount": 20})
    assert not matches(rule, {"amount": 21})


def test_every_match_entry_must_hold() -> None:
    rule = {"body.type": "order.created", "attributes.source": "web"}
    assert matches(rule, {"type": "order.created"}, source="web")
    assert not matches(rule, {"type": "order.created"}, source="pos")


def test_paths_reach_into_nested_objects_and_list_items() -> None:
    assert matches(
        {"body.order.items.1.sku": "B"}, {"order": {"items": [{"sku": "A"}, {"sku": "B"}]}}
    )
    assert not matches({"body.order.items.5.sku": "B"}, {"order": {"items": []}})


def test_attribute_names_may_contain_dots() -> None:
    assert matches(
        {"attributes.acklane.origin.topic": "orders"}, {}, **{"acklane.origin.topic": "orders"}
    )


def test_message_fields_are_paths_too() -> None:
    assert matches({"key": "k1", "message_id": {"regex": "/7$"}, "source": "t"}, {})


# -- reject rules and poison messages ---------------------------------------------------


def test_a_reject_rule_that_holds_rejects_with_the_rule_as_reason() -> None:
    verdict = fires({"reject": {"body.valid": False}}, msg({"valid": False}))
    assert isinstance(verdict, Rejected)
    assert verdict.reason == "watcher w: reject rule matched: body.valid eq false (value: false)"


def test_any_one_reject_rule_is_enough() -> None:
    spec = {"reject": {"body.valid": False, "body.amount": {"lt": 0}}}
    assert isinstance(fires(spec, msg({"valid": True, "amount": -1})), Rejected)
    assert fires(spec, msg({"valid": True, "amount": 1})) == [{"valid": True, "amount": 1}]


def test_reject_rules_apply_to_messages_the_match_would_skip() -> None:
    spec = {"match": {"body.type": "order"}, "reject": {"body.valid": False}}
    assert isinstance(fires(spec, msg({"type": "other", "valid": False})), Rejected)


def test_a_body_that_is_not_json_is_rejected_with_the_decode_error() -> None:
    verdict = fires({"match": {"body.type": "x"}}, msg(raw=b"{not json"))
    assert isinstance(verdict, Rejected)
    assert "watcher w: message t/0/7 body is not JSON" in verdict.reason
    assert "line 1 column 2" in verdict.reason


def test_a_body_that_is_not_utf8_is_rejected_with_the_reason() -> None:
    verdict = fires(None, msg(raw=b"\xff\xfe"))
    assert isinstance(verdict, Rejected)
    assert "not UTF-8" in verdict.reason


def test_a_filter_that_reads_no_body_lets_non_json_through() -> None:
    spec = {"match": {"attributes.source": "web"}, "emit": {"source": "attributes.source"}}
    assert fires(spec, msg(raw=b"\x00binary", source="web")) == [{"source": "web"}]


def test_reject_invalid_json_false_lets_text_bodies_fire() -> None:
    spec = {"reject_invalid_json": False}
    assert fires(spec, msg(raw=b"plain text")) == ["plain text"]


def test_reject_invalid_json_true_applies_even_without_body_paths() -> None:
    spec = {
        "match": {"attributes.source": "web"},
        "emit": "attributes",
        "reject_invalid_json": True,
    }
    assert isinstance(fires(spec, msg(raw=b"oops", source="web")), Rejected)


# -- emit -------------------------------------------------------------------------------


def test_without_a_filter_every_message_fires_with_its_decoded_body() -> None:
    assert fires(None, msg({"a": 1})) == [{"a": 1}]


def test_emit_message_gives_body_attributes_and_identity() -> None:
    assert fires({"emit": "message"}, msg({"a": 1}, source="web")) == [
        {
            "body": {"a": 1},
            "attributes": {"source": "web"},
            "key": "k1",
            "message_id": "t/0/7",
            "source": "t",
        }
    ]


def test_emit_a_path_gives_that_value() -> None:
    assert fires({"emit": "body.order"}, msg({"order": {"id": 3}})) == [{"id": 3}]


def test_emit_a_mapping_builds_the_payload_with_null_for_missing_paths() -> None:
    spec = {"emit": {"id": "body.id", "src": "attributes.source", "none": "body.nope"}}
    assert fires(spec, msg({"id": 9}, source="web")) == [{"id": 9, "src": "web", "none": None}]


# -- compile-time checks ----------------------------------------------------------------


def problems(spec: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    with pytest.raises(FilterSpecError) as info:
        compile_filter(spec)
    return info.value.problems


def test_an_unknown_operator_is_named_with_a_suggestion() -> None:
    [(where, message)] = problems({"match": {"body.amount": {"gtt": 1}}})
    assert where == ("match", "body.amount", "gtt")
    assert "unknown operator 'gtt'; did you mean 'gt'?" in message


def test_a_path_with_an_unknown_root_is_refused() -> None:
    [(where, message)] = problems({"match": {"headers.x": 1}})
    assert where == ("match", "headers.x")
    assert "must start with one of body, attributes" in message


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ({"in": "web"}, "in expects a list"),
        ({"exists": "yes"}, "exists expects true or false"),
        ({"regex": "("}, "invalid regular expression"),
        ({"gt": [1]}, "gt expects a number or a string"),
        ({"contains": [1]}, "contains expects a single value"),
    ],
)
def test_an_operand_of_the_wrong_kind_is_refused(condition: dict[str, Any], expected: str) -> None:
    [(where, message)] = problems({"match": {"body.x": condition}})
    assert where == ("match", "body.x", next(iter(condition)))
    assert expected in message


def test_an_unusable_emit_is_refused() -> None:
    [(where, message)] = problems({"emit": 5})
    assert where == ("emit",)
    assert "expected body, message, a path" in message


def test_an_unknown_filter_field_is_refused() -> None:
    [(where, _)] = problems({"matches": {}})
    assert where == ("matches",)


# -- function filters -------------------------------------------------------------------


@pytest.fixture
def module(write_module: Callable[..., str]) -> str:
    """An importable module of filter functions, under a unique name."""
    return write_module(
        "acklane_test_filters",
        textwrap.dedent(
            """
            from acklane.core.trigger import TriggerEvent, reject_shared_stream_event

            def big(message):
                body = message.json()
                if body.get("valid") is False:
                    reject_shared_stream_event("invalid order")
                    return None
                if body["amount"] > 100:
                    return {"id": body["id"]}
                return None

            def split(message):
                return [{"n": n} for n in message.json()["items"]]

            async def lookup(message):
                return {"len": len(message.body)}

            CLEANED = []

            async def tidy(stream, watcher):
                try:
                    async for message in stream:
                        yield {"body": message.text()}
                finally:
                    CLEANED.append(watcher)

            async def takeover(stream, watcher):
                async for message in stream:
                    yield {"watcher": watcher, "body": message.text()}
                    yield TriggerEvent("raw event")

            def no_args():
                return None

            NOT_CALLABLE = 3
            """
        ),
    )


def test_a_function_filter_returns_the_payload(module: str) -> None:
    f = compile_filter({"function": f"{module}:big"})
    assert f.evaluate(msg({"id": 1, "amount": 500})) == [{"id": 1}]
    assert f.evaluate(msg({"id": 2, "amount": 5})) == []


def test_a_function_filter_may_return_several_payloads(module: str) -> None:
    f = compile_filter({"function": f"{module}:split"})
    assert f.evaluate(msg({"items": [1, 2]})) == [{"n": 1}, {"n": 2}]


def test_a_function_meeting_a_non_json_body_rejects_it(module: str) -> None:
    verdict = compile_filter({"function": f"{module}:big"}, label="watcher w").evaluate(
        msg(raw=b"<xml/>")
    )
    assert isinstance(verdict, Rejected)
    assert verdict.reason.startswith("watcher w: message t/0/7 body is not JSON")


def test_a_missing_module_is_named(module: str) -> None:
    [(where, message)] = problems({"function": "no_such_module_xyz:fn"})
    assert where == ("function",)
    assert "cannot import module 'no_such_module_xyz'" in message


def test_a_missing_attribute_is_named(module: str) -> None:
    [(_, message)] = problems({"function": f"{module}:nope"})
    assert f"module {module!r} has no attribute 'nope'" in message


def test_a_non_callable_is_refused(module: str) -> None:
    [(_, message)] = problems({"function": f"{module}:NOT_CALLABLE"})
    assert "is a int, not a function" in message


def test_a_function_that_cannot_take_a_message_is_refused(module: str) -> None:
    [(_, message)] = problems({"function": f"{module}:no_args"})
    assert "cannot be called as fn(message)" in message


def test_a_function_cannot_be_combined_with_match(module: str) -> None:
    [(where, _)] = problems({"function": f"{module}:big", "match": {"body.x": 1}})
    assert where == ("match",)


# -- running over a stream, with the engine's binding window ----------------------------


class FakeWindow:
    """Stands in for the engine's binding window: records rejections."""

    def __init__(self) -> None:
        self.rejections: list[str | None] = []

    def reject(self, reason: str | None) -> bool:
        self.rejections.append(reason)
        return True


async def stream_of(*messages: RawMessage) -> AsyncIterator[RawMessage]:
    for m in messages:
        yield m


async def run(spec: dict[str, Any] | None, *messages: RawMessage) -> tuple[list[Any], FakeWindow]:
    window = FakeWindow()
    token = current_window.set(window)
    try:
        f = compile_filter(spec, label="watcher w")
        events = [e async for e in f.run(stream_of(*messages), "the-watcher")]
    finally:
        current_window.reset(token)
    return events, window


async def test_run_yields_trigger_events_and_rejects_through_the_window() -> None:
    events, window = await run(
        {"match": {"body.amount": {"gt": 1}}, "reject": {"body.valid": False}},
        msg({"amount": 5}),
        msg({"amount": 0}),
        msg({"amount": 9, "valid": False}),
        msg(raw=b"junk"),
    )
    assert events == [TriggerEvent({"amount": 5})]
    assert len(window.rejections) == 2
    assert "reject rule matched" in (window.rejections[0] or "")
    assert "body is not JSON" in (window.rejections[1] or "")


async def test_a_function_may_reject_through_the_window_itself(module: str) -> None:
    events, window = await run(
        {"function": f"{module}:big"}, msg({"id": 1, "valid": False, "amount": 1000})
    )
    assert events == []
    assert window.rejections == ["invalid order"]


async def test_an_async_function_is_awaited_per_message(module: str) -> None:
    events, _ = await run({"function": f"{module}:lookup"}, msg(raw=b"abc"))
    assert events == [TriggerEvent({"len": 3})]


async def test_an_async_generator_function_takes_over_the_stream(module: str) -> None:
    events, _ = await run({"function": f"{module}:takeover"}, msg(raw=b"hi"))
    assert events == [
        TriggerEvent({"watcher": "the-watcher", "body": "hi"}),
        TriggerEvent("raw event"),
    ]


async def test_closing_a_stream_filter_closes_the_users_generator_at_once(module: str) -> None:
    # The engine closes the filter when a watcher leaves: the user's finally blocks
    # must run then, in that task, not later when the garbage collector finds it.
    f = compile_filter({"function": f"{module}:tidy"})

    async def raw() -> AsyncIterator[RawMessage]:
        while True:
            yield msg({"n": 1})

    events = f.run(raw(), "w1")
    await events.__anext__()
    await events.aclose()
    assert sys.modules[module].CLEANED == ["w1"]
