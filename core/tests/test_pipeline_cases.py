"""``acklane test`` and acklane.testing: a pipeline's cases through its own watchers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from acklane.core.cli.app import app
from acklane.core.config import ConfigError
from acklane.testing import assert_pipeline_tests, run_pipeline_tests

PIPELINE = """\
engine: {{ack_timeout: 5}}
streams:
  orders:
    connector: memory
    topics: [orders]
    dead_letter: orders.dlq
    max_attempts: 2
  loose:
    connector: memory
    topics: [loose]
watchers:
  - name: valid-orders
    stream: orders
    filter:
      schema: order.schema.json
      match: {{body.amount: {{gt: 100}}}}
      emit: {{id: body.id}}
  - name: crashes
    stream: orders
    filter: {{function: "{module}:crash_on_boom"}}
  - name: typed
    stream: loose
    filter:
      schema: {{type: object, required: [kind]}}
      on_schema_error: skip
  - name: strict
    stream: loose
    filter:
      reject: {{body.kind: bad}}
"""

SCHEMA = {
    "type": "object",
    "required": ["id", "amount"],
    "properties": {"id": {"type": "integer"}, "amount": {"type": "number"}},
}

CASES = """\
stream: orders
cases:
  - name: a valid big order fires
    message: {body: {id: 1, amount: 150}}
    expect:
      valid-orders: {fire: [{id: 1}]}
      crashes: nothing
    dead_letter: nothing
  - name: the schema rejects with the failing path
    message: {body: {id: 1, amount: "lots"}}
    expect:
      valid-orders: {reject: 'schema: body\\.amount: "lots" is not of type "number"'}
    dead_letter: {reason: "watcher valid-orders: schema: body.amount"}
  - name: a filter that keeps raising is dead-lettered as poison after max_attempts
    message: {body: {id: 2, amount: 1, boom: true}}
    expect:
      valid-orders: {reject: "^poison: failed 2 times; last error: watcher crashes: "}
      crashes: {reject: "ZeroDivisionError"}
    dead_letter: {reason: "poison: failed 2 times"}
  - name: skipped by its schema, rejected by another, dropped without a dead_letter
    stream: loose
    message: {body: {kind: bad, n: 1}, key: k, headers: {n: 1}}
    expect:
      typed: {fire: [{kind: bad}], compare: subset}
      strict: {reject: "body.kind eq \\"bad\\""}
    dead_letter: dropped
  - name: a body the schema refuses is skipped with on_schema_error skip
    stream: loose
    message: {body: [1, 2]}
    expect: {typed: nothing, strict: {fire: [[1, 2]]}}
    dead_letter: nothing
"""

FAILING = """\
cases:
  - name: this one passes
    stream: orders
    message: {body: {id: 3, amount: 300}}
    expect: {valid-orders: {fire: [{id: 3}]}}
  - name: this one expects the wrong payload
    stream: orders
    message: {body: {id: 4, amount: 400}}
    expect:
      valid-orders: {fire: [{id: 5}]}
      crashes: {reject: "never"}
    dead_letter: {reason: "nope"}
"""


@pytest.fixture
def pipeline(tmp_path: Path) -> Path:
    module = f"casefilters_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            """\
            def crash_on_boom(message):
                if message.json().get("boom"):
                    return 1 / 0
                return None
            """
        )
    )
    (tmp_path / "order.schema.json").write_text(json.dumps(SCHEMA))
    config = tmp_path / "orders.yaml"
    config.write_text(PIPELINE.format(module=module))
    (tmp_path / "orders.tests.yaml").write_text(CASES)
    (tmp_path / "failing.yaml").write_text(FAILING)
    return config


def test_the_cases_beside_the_pipeline_pass(pipeline: Path) -> None:
    results = assert_pipeline_tests(pipeline)
    assert [r.case.name for r in results][:1] == ["a valid big order fires"]
    assert len(results) == 5
    poison = results[2]
    assert poison.watchers["crashes"].rejected is not None
    assert poison.logs, "the engine's warnings are kept with the case"


def test_a_failing_case_shows_its_diff_and_exits_1(pipeline: Path) -> None:
    failing = pipeline.with_name("failing.yaml")
    done = subprocess.run(
        [sys.executable, "-m", "acklane.core.cli", "test", str(pipeline), str(failing)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "120", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert f"{failing}::this one passes PASSED" in out
    assert f"{failing}::this one expects the wrong payload FAILED" in out
    assert " FAILURES " in out
    assert f"{failing}:6: this one expects the wrong payload" in out
    assert "watcher valid-orders: event 0: the expected payload differs from the one fired" in out
    assert "watcher crashes: expected a rejection matching 'never', but it did nothing" in out
    assert "--- expected\n+++ actual" in out
    assert " valid-orders:\n   fire:\n-  - id: 5\n-crashes:\n-  reject: never\n" in out
    assert "+  - id: 4\n+crashes: nothing\n+dead_letter: nothing" in out
    assert out.rstrip().splitlines()[-1].strip("= ").startswith("1 failed, 1 passed in ")


def test_junit_reports_each_case(pipeline: Path) -> None:
    failing = pipeline.with_name("failing.yaml")
    got = CliRunner().invoke(app, ["test", str(pipeline), str(failing), "--format", "junit"])
    assert got.exit_code == 1, got.output
    root = ET.fromstring(got.stdout)
    (suite,) = root.findall("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("2", "1", "0")
    passed, failed = suite.findall("testcase")
    assert passed.find("failure") is None
    failure = failed.find("failure")
    assert failure is not None and failure.text is not None
    assert failed.get("line") == "6"
    assert "+++ actual" in failure.text


def test_k_selects_cases_by_name(pipeline: Path) -> None:
    got = CliRunner().invoke(app, ["test", str(pipeline), "-k", "schema rejects"])
    assert got.exit_code == 0, got.output
    assert "1 passed" in got.stdout
    assert "a valid big order" not in got.stdout


def test_problems_of_a_case_file_name_file_line_and_field(pipeline: Path) -> None:
    bad = pipeline.with_name("bad.yaml")
    bad.write_text(
        textwrap.dedent(
            """\
            cases:
              - name: one
                message: {body: 1, text: "1"}
                expect:
                  valid-order: {fire: [1]}
                  typed: nothing
              - name: two
                stream: orders
                message: {body: {}}
                expect:
                  crashes: {fire: {id: 1}}
                  valid-orders: {reject: "("}
                dead_letter: maybe
            """
        )
    )
    with pytest.raises(ConfigError) as info:
        run_pipeline_tests(pipeline, bad)
    assert [str(p) for p in info.value.problems] == [
        f"{bad}:2: cases[0].stream: the pipeline has several streams (orders, loose): name "
        "the case's stream (here, in message, or once at the top of the file)",
        f"{bad}:3: cases[0].message.text: give one of body, text or base64, not body and text",
        f"{bad}:11: cases[1].expect.crashes.fire: expected a list of payloads, one per event "
        "(write [x] for one), got a mapping",
        f"{bad}:12: cases[1].expect.valid-orders.reject: invalid regular expression '(': "
        "missing ), unterminated subpattern at position 0",
        f"{bad}:13: cases[1].dead_letter: expected nothing, dropped or {{reason: pattern}}, "
        "got a string",
    ]
    got = CliRunner().invoke(app, ["test", str(pipeline), str(bad)])
    assert got.exit_code == 2
    assert f"{bad}:13: cases[1].dead_letter" in got.stderr


def test_a_watcher_of_another_stream_is_named_as_such(pipeline: Path) -> None:
    bad = pipeline.with_name("other.yaml")
    bad.write_text(
        "stream: orders\ncases:\n  - name: x\n    message: {body: 1}\n"
        "    expect: {typed: nothing}\n"
    )
    with pytest.raises(ConfigError, match=r"other.yaml:5: cases\[0\]\.expect\.typed: watcher "):
        run_pipeline_tests(pipeline, bad)


def test_without_case_files_it_says_where_they_go(tmp_path: Path) -> None:
    config = tmp_path / "p.yaml"
    config.write_text(
        "streams: {s: {connector: memory, topics: [t]}}\nwatchers: [{name: w, stream: s}]\n"
    )
    got = CliRunner().invoke(app, ["test", str(config)])
    assert got.exit_code == 2
    assert "p.tests.yaml" in got.stderr
    (tmp_path / "p.tests").mkdir()
    (tmp_path / "p.tests" / "a.yaml").write_text(
        "cases: [{name: every message fires, message: {body: {a: 1}}, "
        "expect: {w: {fire: [{a: 1}]}}}]\n"
    )
    got = CliRunner().invoke(app, ["test", str(config)])
    assert got.exit_code == 0, got.output
    assert "a.yaml::every message fires PASSED" in got.stdout


def test_two_streams_on_one_topic_each_get_the_message(tmp_path: Path) -> None:
    """As two consumer groups of one Kafka topic: each stream's watchers see the
    message, and each stream's dead-letter destination gets only its own copies."""
    config = tmp_path / "two.yaml"
    config.write_text(
        textwrap.dedent(
            """\
            streams:
              a: {connector: memory, topics: [orders], group_id: ga, dead_letter: a.dlq}
              b: {connector: memory, topics: [orders], group_id: gb}
            watchers:
              - {name: wa, stream: a, filter: {reject: {body.bad: true}}}
              - {name: wb, stream: b}
            """
        )
    )
    (tmp_path / "two.tests.yaml").write_text(
        textwrap.dedent(
            """\
            cases:
              - name: on b
                stream: b
                message: {body: {bad: true}}
                expect: {wb: {fire: [{bad: true}]}}
                dead_letter: nothing
              - name: on a
                stream: a
                message: {body: {bad: true, n: 2}}
                expect: {wa: {reject: "body.bad eq true"}}
                dead_letter: {reason: "^watcher wa: "}
              - name: a good one on a
                stream: a
                message: {body: {bad: false}}
                expect: {wa: {fire: [{bad: false}]}}
                dead_letter: nothing
            """
        )
    )
    assert len(assert_pipeline_tests(config)) == 3


def test_a_reason_a_function_filter_gives_itself_is_that_watcher_s(tmp_path: Path) -> None:
    module = f"casereject_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            """\
            from acklane.core import reject_shared_stream_event

            def refuse_invalid(message):
                order = message.json()
                if order.get("valid") is False:
                    reject_shared_stream_event("invalid order")
                    return None
                return {"id": order["id"]}
            """
        )
    )
    config = tmp_path / "fn.yaml"
    config.write_text(
        "streams: {s: {connector: memory, topics: [t], dead_letter: t.dlq}}\n"
        "watchers:\n"
        "  - {name: plain, stream: s, filter: {emit: body.id}}\n"
        f"  - {{name: fn, stream: s, filter: {{function: '{module}:refuse_invalid'}}}}\n"
    )
    (tmp_path / "fn.tests.yaml").write_text(
        textwrap.dedent(
            """\
            cases:
              - name: refused by the function
                message: {body: {id: 3, valid: false}}
                expect: {plain: {fire: [3]}, fn: {reject: "^invalid order$"}}
                dead_letter: {reason: "invalid order"}
              - name: accepted
                message: {body: {id: 4}}
                expect: {plain: {fire: [4]}, fn: {fire: [{id: 4}]}}
                dead_letter: nothing
            """
        )
    )
    assert len(assert_pipeline_tests(config)) == 2


def test_a_case_not_resolved_in_time_fails_and_the_next_runs_afresh(tmp_path: Path) -> None:
    module = f"casehang_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            """\
            import asyncio

            async def hang_on_slow(message):
                if message.json().get("slow"):
                    await asyncio.sleep(3600)
                return message.json()
            """
        )
    )
    config = tmp_path / "slow.yaml"
    config.write_text(
        "engine: {ack_timeout: 600, shutdown_timeout: 1}\n"
        "streams: {s: {connector: memory, topics: [t]}}\n"
        f"watchers: [{{name: w, stream: s, filter: {{function: '{module}:hang_on_slow'}}}}]\n"
    )
    (tmp_path / "slow.tests.yaml").write_text(
        textwrap.dedent(
            """\
            cases:
              - name: slow
                message: {body: {slow: true}}
                expect: {w: nothing}
              - name: quick
                message: {body: {n: 1}}
                expect: {w: {fire: [{n: 1}]}}
            """
        )
    )
    slow, quick = run_pipeline_tests(config, within=0.5)
    assert not slow.passed
    assert slow.error is not None and "not resolved within 0.5s" in slow.error
    assert quick.passed, quick.failures
