"""``schema:`` in a declarative filter: JSON Schema (2020-12) checked before the rules."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from acklane.core.config import ConfigError, load_config, parse_config
from acklane.core.message import RawMessage
from acklane.core.pipeline.filters import FilterSpecError, Rejected, compile_filter

ORDER: dict[str, Any] = {
    "type": "object",
    "required": ["id", "amount"],
    "properties": {
        "id": {"type": "integer"},
        "amount": {"type": "number"},
        "items": {"type": "array", "items": {"type": "object", "required": ["sku"]}},
    },
}


def msg(body: Any = None, *, raw: bytes | None = None) -> RawMessage:
    data = raw if raw is not None else json.dumps(body).encode()
    return RawMessage(body=data, key="k1", message_id="t/0/7", source="t")


def test_a_body_that_passes_the_schema_goes_on_to_the_rules() -> None:
    f = compile_filter({"schema": ORDER, "match": {"body.amount": {"gt": 100}}}, label="watcher w")
    assert f.evaluate(msg({"id": 1, "amount": 150})) == [{"id": 1, "amount": 150}]
    assert f.evaluate(msg({"id": 2, "amount": 5})) == []


def test_a_body_that_fails_is_rejected_with_the_failing_path_and_message() -> None:
    f = compile_filter({"schema": ORDER}, label="watcher w")
    assert f.evaluate(msg({"id": 1, "amount": "lots"})) == Rejected(
        'watcher w: schema: body.amount: "lots" is not of type "number"'
    )
    verdict = f.evaluate(msg({"id": 1, "amount": 3, "items": [{"sku": "a"}, {}]}))
    assert verdict == Rejected('watcher w: schema: body.items.1: "sku" is a required property')
    verdict = f.evaluate(msg({"amount": "x"}))
    assert isinstance(verdict, Rejected)
    assert verdict.reason.endswith("(and 1 more)"), verdict.reason


def test_the_schema_is_checked_before_the_reject_rules() -> None:
    f = compile_filter({"schema": ORDER, "reject": {"body.amount": {"lt": 0}}}, label="w")
    verdict = f.evaluate(msg({"amount": -1}))
    assert verdict == Rejected('w: schema: body: "id" is a required property')


def test_on_schema_error_skip_fires_nothing_and_rejects_nothing() -> None:
    f = compile_filter({"schema": ORDER, "on_schema_error": "skip"}, label="w")
    assert f.evaluate(msg({"id": "one", "amount": 1})) == []
    assert f.evaluate(msg({"id": 1, "amount": 1})) == [{"id": 1, "amount": 1}]


def test_a_body_that_is_not_json_is_still_rejected_as_such() -> None:
    f = compile_filter({"schema": ORDER, "on_schema_error": "skip"}, label="w")
    verdict = f.evaluate(msg(raw=b"not json"))
    assert isinstance(verdict, Rejected) and "body is not JSON" in verdict.reason


async def test_the_running_filter_applies_the_schema_too() -> None:
    from acklane.core.trigger import TriggerEvent

    f = compile_filter({"schema": ORDER, "on_schema_error": "skip"}, label="w")

    async def stream() -> Any:
        for body in ({"id": 1, "amount": 2}, {"id": "x"}, {"id": 3, "amount": 4}):
            yield msg(body)

    events = [e async for e in f.run(stream(), "w")]
    assert events == [TriggerEvent({"id": 1, "amount": 2}), TriggerEvent({"id": 3, "amount": 4})]


def test_a_schema_file_is_read_relative_to_the_configuration(tmp_path: Path) -> None:
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "order.json").write_text(json.dumps(ORDER))
    (tmp_path / "schemas" / "money.yaml").write_text("type: number\nminimum: 0\n")
    (tmp_path / "schemas" / "refund.json").write_text(
        json.dumps({"properties": {"amount": {"$ref": "money.yaml"}}})
    )
    config = tmp_path / "p.yaml"
    config.write_text(
        textwrap.dedent(
            """\
            streams:
              s: {connector: memory, topics: [t]}
            watchers:
              - name: orders
                stream: s
                filter: {schema: schemas/order.json}
              - name: refunds
                stream: s
                filter: {schema: schemas/refund.json}
            """
        )
    )
    loaded = load_config(config)
    orders, refunds = (w.compiled_filter for w in loaded.watchers)
    assert orders.evaluate(msg({"id": 1, "amount": 2})) == [{"id": 1, "amount": 2}]
    assert isinstance(orders.evaluate(msg({"id": 1})), Rejected)
    # a local $ref, relative to the schema file
    verdict = refunds.evaluate(msg({"amount": -3}))
    reason = "watcher refunds: schema: body.amount: -3 is less than the minimum of 0"
    assert verdict == Rejected(reason)
    # the watcher's kwargs hold the file's absolute path: they compile from anywhere
    assert loaded.watchers[0].filter == {"schema": str(tmp_path / "schemas" / "order.json")}


def _problems(text: str, tmp_path: Path) -> list[str]:
    config = tmp_path / "p.yaml"
    config.write_text(textwrap.dedent(text))
    with pytest.raises(ConfigError) as info:
        load_config(config)
    return [str(p) for p in info.value.problems]


def test_schema_problems_name_the_file_line_and_field(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("{not json")
    problems = _problems(
        """\
        streams:
          s: {connector: memory, topics: [t]}
        watchers:
          - name: a
            stream: s
            filter:
              schema: missing.json
          - name: b
            stream: s
            filter:
              schema:
                type: object
                properties:
                  amount: {type: 12}
          - name: c
            stream: s
            filter:
              schema: broken.json
          - name: d
            stream: s
            filter:
              on_schema_error: skip
          - name: e
            stream: s
            filter:
              schema: {$ref: "https://example.com/order.json"}
          - name: f
            stream: s
            filter:
              schema: {type: object}
              on_schema_error: drop
        """,
        tmp_path,
    )
    config = tmp_path / "p.yaml"
    assert problems[0].startswith(f"{config}:7: watchers[0].filter.schema: cannot read ")
    assert problems[1].startswith(
        f"{config}:14: watchers[1].filter.schema.properties.amount.type: not a valid JSON Schema"
    )
    assert problems[2].startswith(f"{config}:18: watchers[2].filter.schema: ")
    assert "is not a JSON document" in problems[2]
    assert problems[3] == (
        f"{config}:22: watchers[3].filter.on_schema_error: applies only with a schema: "
        "give schema too"
    )
    assert problems[4].startswith(f"{config}:26: watchers[4].filter.schema: ")
    assert "only local files are read" in problems[4]
    assert problems[5].startswith(f"{config}:31: watchers[5].filter.on_schema_error: ")
    assert len(problems) == 6, problems


def test_a_schema_does_not_combine_with_a_function_filter() -> None:
    with pytest.raises(FilterSpecError, match="schema: cannot be combined with function"):
        compile_filter({"function": "json:loads", "schema": {"type": "object"}})


def test_config_text_without_a_file_reads_schemas_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "s.json").write_text(json.dumps({"type": "object"}))
    monkeypatch.chdir(tmp_path)
    config = parse_config(
        "streams: {s: {connector: memory, topics: [t]}}\n"
        "watchers: [{name: w, stream: s, filter: {schema: s.json}}]\n"
    )
    assert isinstance(config.watchers[0].compiled_filter.evaluate(msg([1])), Rejected)
