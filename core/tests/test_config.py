"""The YAML configuration: every error names the file, the line and the field."""

from __future__ import annotations

import sys
import textwrap
import uuid
import warnings
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from acklane.connectors.memory import (
    MemoryBroker,
    MemoryConfig,
    MemoryConnector,
    MemoryStreamProducer,
)
from acklane.core.config import AcklaneConfig, ConfigError, load_config, parse_config
from acklane.core.message import RawMessage
from acklane.core.pipeline.watcher import WatcherTrigger, build_watchers
from acklane.core.stores.settings import StateStoreSettings
from acklane.core.trigger import TriggerEvent

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipeline.yaml"

VALID = """\
engine:
  ack_timeout: 60
store:
  url: sqlite:///events.db
streams:
  orders:
    connector: memory
    broker: cfg-test
    topics: [orders]
    dead_letter: orders.dlq
watchers:
  - name: big-orders
    stream: orders
    asset: big_orders
    filter:
      match:
        body.amount: {gt: 100}
  - name: everything
    stream: orders
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def line(path: Path, needle: str, occurrence: int = 1) -> int:
    """The 1-based number of the line holding ``needle`` (its n-th occurrence)."""
    hits = [i for i, text in enumerate(path.read_text().splitlines(), 1) if needle in text]
    return hits[occurrence - 1]


def error(path: Path, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, env=env or {})
    return str(info.value)


def with_watchers(watchers: str) -> str:
    head = VALID.split("watchers:")[0]
    return head + "watchers:\n" + textwrap.indent(textwrap.dedent(watchers), "  ")


# -- a valid file -----------------------------------------------------------------------


def test_a_valid_file_gives_engine_store_streams_and_watchers(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, VALID), env={})
    assert config.engine.ack_timeout == 60
    assert config.engine.subscriber_queue_size == 1024
    # a relative SQLite path is read from the configuration's folder
    assert config.store.url == f"sqlite:///{tmp_path.resolve() / 'events.db'}"
    assert config.metrics.port is None
    assert isinstance(config.state, StateStoreSettings)
    stream = config.streams["orders"]
    assert stream.connector is MemoryConnector
    assert isinstance(stream.config, MemoryConfig)
    assert stream.config.dead_letter == "orders.dlq"
    assert stream.key == ("acklane", "memory", "cfg-test", ("orders",), "acklane")
    assert [w.name for w in config.watchers] == ["big-orders", "everything"]
    assert config.watcher("big-orders").asset == "big_orders"
    assert config.watcher("everything").filter is None


def test_defaults_fill_the_optional_sections() -> None:
    config = parse_config(
        VALID.split("engine:")[0] + VALID.split("  url: sqlite:///events.db\n")[1]
    )
    assert config.engine.ack_timeout == 300
    assert config.engine.restart_backoff_max == 60
    assert config.store.url == "sqlite:///acklane.db"
    assert config.store.commit_interval_ms == 2


def test_the_example_pipeline_is_valid() -> None:
    config = load_config(EXAMPLE, env={})
    assert len(config.watchers) >= 2
    assert {s.connector_name for s in config.streams.values()} == {"memory"}


# -- each kind of error names file, line and field --------------------------------------


def test_a_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        streams:
          orders:
            connector: memory
            topics: [orders
        watchers: []
        """,
    )
    message = error(path)
    assert message.startswith(f"{path}:{line(path, 'watchers')}: YAML syntax error:")


def test_a_forbidden_character_names_its_line() -> None:
    with pytest.raises(ConfigError, match=r"^p\.yaml:2: YAML syntax error: special characters"):
        parse_config("a: 1\nb: \x07\n", source="p.yaml")


def test_an_unknown_field_is_named_with_a_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, VALID.replace("ack_timeout: 60", "ack_timout: 60"))
    message = error(path)
    assert f"{path}:{line(path, 'ack_timout')}: engine.ack_timout: unknown field" in message
    assert "did you mean 'ack_timeout'?" in message


def test_a_wrong_type_says_what_was_expected(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        with_watchers(
            """\
            - name: a
              stream: orders
            - name: b
              stream: orders
            - name: c
              stream: orders
              filter:
                match:
                  - body.type
            """
        ),
    )
    message = error(path)
    assert (
        f"{path}:{line(path, 'match:')}: watchers[2].filter.match: expected a mapping, got a list"
        in message
    )


def test_a_number_out_of_range_says_the_bound(tmp_path: Path) -> None:
    path = write(tmp_path, VALID.replace("ack_timeout: 60", "ack_timeout: -5"))
    assert (
        f"{path}:{line(path, 'ack_timeout')}: engine.ack_timeout: expected a number greater "
        "than 0, got the number -5" in error(path)
    )


def test_a_missing_required_field_is_reported_at_its_parent(tmp_path: Path) -> None:
    path = write(tmp_path, with_watchers("- name: lonely\n  asset: x\n"))
    assert f"{path}:{line(path, 'lonely')}: watchers[0].stream: required field is missing" in error(
        path
    )


def test_a_missing_section_is_reported(tmp_path: Path) -> None:
    path = write(tmp_path, VALID.split("watchers:")[0])
    assert f"{path}:1: watchers: required field is missing" in error(path)


def test_a_watcher_on_an_unknown_stream_lists_the_known_ones(tmp_path: Path) -> None:
    path = write(tmp_path, with_watchers("- name: a\n  stream: ordres\n"))
    message = error(path)
    assert f"{path}:{line(path, 'ordres')}: watchers[0].stream: unknown stream 'ordres'" in message
    assert "did you mean 'orders'? known streams: orders" in message


def test_two_watchers_with_one_name_are_refused(tmp_path: Path) -> None:
    path = write(
        tmp_path, with_watchers("- name: a\n  stream: orders\n- name: a\n  stream: orders\n")
    )
    assert (
        f"{path}:{line(path, 'name: a', 2)}: watchers[1].name: duplicate watcher name 'a' "
        f"(first at line {line(path, 'name: a')})" in error(path)
    )


def test_an_unknown_connector_names_the_stream_and_the_installed_ones(tmp_path: Path) -> None:
    path = write(tmp_path, VALID.replace("connector: memory", "connector: rabbit"))
    message = error(path)
    assert (
        f"{path}:{line(path, 'rabbit')}: streams.orders.connector: stream 'orders' uses "
        "connector 'rabbit', which is not installed" in message
    )
    assert "memory" in message


def test_a_known_connector_that_is_not_installed_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an extra acklane ships, but not installed here (whichever real ones are installed)
    # a known extra that is not installed cannot be made otherwise: patch the list
    from acklane.core.config import _streams

    monkeypatch.setattr(_streams, "_KNOWN_EXTRAS", (*_streams._KNOWN_EXTRAS, "nosuchbroker"))
    path = write(tmp_path, VALID.replace("connector: memory", "connector: nosuchbroker"))
    assert 'pip install "acklane[nosuchbroker]"' in error(path)


def test_connector_field_errors_map_back_to_their_line(tmp_path: Path) -> None:
    path = write(
        tmp_path, VALID.replace("topics: [orders]", "topics: [orders]\n    partitions: zero")
    )
    assert (
        f"{path}:{line(path, 'partitions')}: streams.orders.partitions: expected an integer, "
        "got the string 'zero'" in error(path)
    )


def test_an_unknown_connector_field_lists_the_connectors_fields(tmp_path: Path) -> None:
    path = write(tmp_path, VALID.replace("dead_letter:", "dead_letter_topics:"))
    message = error(path)
    assert (
        f"{path}:{line(path, 'dead_letter_topics')}: streams.orders.dead_letter_topics: "
        "unknown field" in message
    )
    assert "'dead_letter'" in message


def test_a_connector_model_check_is_reported_at_the_stream(tmp_path: Path) -> None:
    path = write(tmp_path, VALID.replace("dead_letter: orders.dlq", "dead_letter: orders"))
    assert (
        f"{path}:{line(path, '  orders:')}: streams.orders: dead_letter 'orders' is also consumed"
        in error(path)
    )


def test_a_missing_environment_variable_is_named(tmp_path: Path) -> None:
    path = write(
        tmp_path, VALID.replace("sqlite:///events.db", "postgresql://u:${PG_PASSWORD}@db/x")
    )
    assert (
        f"{path}:{line(path, 'PG_PASSWORD')}: store.url: "
        "environment variable PG_PASSWORD is not set" in error(path)
    )


def test_a_bad_filter_import_path_names_the_module(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        with_watchers(
            """\
            - name: a
              stream: orders
              filter:
                function: no_such_pkg_abc.filters:pick
            """
        ),
    )
    assert (
        f"{path}:{line(path, 'function:')}: watchers[0].filter.function: cannot import module "
        "'no_such_pkg_abc.filters'" in error(path)
    )


def test_a_bad_filter_operator_is_reported_at_its_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        with_watchers(
            """\
            - name: a
              stream: orders
              filter:
                match:
                  body.amount: {gtt: 100}
            """
        ),
    )
    assert (
        f'{path}:{line(path, "gtt")}: watchers[0].filter.match["body.amount"].gtt: unknown '
        "operator 'gtt'" in error(path)
    )


def test_a_bad_state_setting_is_reported(tmp_path: Path) -> None:
    path = write(tmp_path, VALID + "state:\n  max_value_bytes: 0\n")
    assert (
        f"{path}:{line(path, 'max_value_bytes')}: state.max_value_bytes: "
        "expected a number greater than 0" in error(path)
    )


def test_a_duplicate_key_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, VALID.replace("ack_timeout: 60", "ack_timeout: 60\n  ack_timeout: 61"))
    assert (
        f"{path}:{line(path, 'ack_timeout: 61')}: engine.ack_timeout: duplicate key 'ack_timeout' "
        f"(first at line {line(path, 'ack_timeout: 60')})" in error(path)
    )


def test_all_problems_are_listed_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        VALID.replace("ack_timeout: 60", "ack_timeout: nope").replace(
            "stream: orders", "stream: x"
        ),
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert len(info.value.problems) == 3
    assert str(info.value).startswith(f"3 problems in {path}:")


def test_an_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    assert str(missing) in error(missing)


def test_an_empty_file_is_a_config_error(tmp_path: Path) -> None:
    assert "the configuration is empty" in error(write(tmp_path, ""))


def test_a_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"<string>:1: expected a mapping"):
        parse_config("- just\n- a list\n")


# -- old names of settings --------------------------------------------------------------


def test_an_old_setting_name_still_loads_with_a_warning_at_its_file_and_line(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, VALID.replace("dead_letter:", "dlq_topic:"))
    with pytest.warns(FutureWarning) as caught:
        config = load_config(path, env={})
    assert config.streams["orders"].config.dead_letter == "orders.dlq"  # type: ignore[attr-defined]
    [warning] = [w for w in caught if "dlq_topic" in str(w.message)]
    assert (warning.filename, warning.lineno) == (str(path), line(path, "dlq_topic"))
    assert str(warning.message) == (
        "streams.orders.dlq_topic is deprecated, now called dead_letter; the old name still "
        "works for now"
    )
    [note] = config.deprecations
    assert str(note) == (
        f"{path}:{line(path, 'dlq_topic')}: streams.orders.dlq_topic: deprecated, now called "
        "dead_letter; the old name still works for now"
    )


def test_the_watchers_carry_the_new_name_of_an_old_setting(tmp_path: Path) -> None:
    path = write(tmp_path, VALID.replace("dead_letter:", "dlq_topic:"))
    with pytest.warns(FutureWarning):
        config = load_config(path, env={})
    assert config.streams["orders"].options["dead_letter"] == "orders.dlq"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # building the watchers warns no more
        _, kwargs = build_watchers(config)[0].serialize()
    assert "dlq_topic" not in kwargs["connector_config"]


def test_an_old_name_beside_its_new_one_is_a_problem_at_the_old_ones_line(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, VALID.replace("dead_letter:", "dlq_topic: a\n    dead_letter:"))
    with pytest.warns(FutureWarning):
        text = error(path)
    assert (
        f"{path}:{line(path, 'dlq_topic')}: streams.orders.dlq_topic: dlq_topic is the old name "
        "of dead_letter: give only dead_letter" in text
    )


def test_a_bad_value_under_an_old_name_is_reported_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, VALID.replace("dead_letter: orders.dlq", "dlq_topic: orders"))
    with pytest.warns(FutureWarning):
        text = error(path)
    assert f"{path}:{line(path, '  orders:')}: streams.orders: dead_letter 'orders'" in text


def test_a_file_with_the_new_names_warns_nothing(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = load_config(write(tmp_path, VALID), env={})
    assert config.deprecations == ()


# -- environment variables --------------------------------------------------------------


def test_variables_are_substituted_in_strings() -> None:
    text = VALID.replace("sqlite:///events.db", "postgresql://app:${PG_PASSWORD}@${PG_HOST}/db")
    config = parse_config(text, env={"PG_PASSWORD": "s3cret", "PG_HOST": "db.local"})
    assert config.store.url == "postgresql://app:s3cret@db.local/db"


def test_a_default_applies_when_the_variable_is_unset_or_empty() -> None:
    text = VALID.replace("sqlite:///events.db", "${STORE_URL:-sqlite:///fallback.db}")
    assert parse_config(text, env={}).store.url == "sqlite:///fallback.db"
    assert parse_config(text, env={"STORE_URL": ""}).store.url == "sqlite:///fallback.db"


def test_substituted_values_are_converted_to_the_fields_type() -> None:
    text = VALID.replace("ack_timeout: 60", "ack_timeout: ${ACK_TIMEOUT}")
    assert parse_config(text, env={"ACK_TIMEOUT": "42"}).engine.ack_timeout == 42


def test_a_doubled_dollar_writes_a_literal_reference() -> None:
    text = VALID.replace("asset: big_orders", "asset: $${NOT_A_VAR}")
    assert parse_config(text, env={}).watcher("big-orders").asset == "${NOT_A_VAR}"


def test_extension_keys_hold_anchors_that_streams_merge() -> None:
    text = """\
x-memory: &memory
  connector: memory
  broker: cfg-test
  topics: [default]
streams:
  orders: {<<: *memory, topics: [orders]}
watchers:
  - {name: a, stream: orders}
"""
    stream = parse_config(text, env={}).streams["orders"]
    assert stream.options == {"broker": "cfg-test", "topics": ["orders"]}
    assert stream.config.topics == ["orders"]  # type: ignore[attr-defined]


# -- watchers for the runner ------------------------------------------------------------


@pytest.fixture
def config() -> AcklaneConfig:
    return parse_config(VALID, env={})


def test_build_watchers_gives_one_trigger_per_watcher_sharing_the_streams_key(
    config: AcklaneConfig,
) -> None:
    triggers = build_watchers(config)
    assert [t.trigger_id for t in triggers] == ["big-orders", "everything"]
    keys = {t.shared_stream_key() for t in triggers}
    assert keys == {("acklane", "memory", "cfg-test", ("orders",), "acklane")}
    assert WatcherTrigger.uses_ack_channel()


def test_a_trigger_serializes_to_json_kwargs_that_rebuild_it(config: AcklaneConfig) -> None:
    trigger = build_watchers(config)[0]
    trigger.asset_store = object()  # set by the runner; never serialized
    classpath, kwargs = trigger.serialize()
    assert classpath == "acklane.core.pipeline.watcher.WatcherTrigger"
    assert kwargs == {
        "name": "big-orders",
        "stream": "orders",
        "connector": "memory",
        "connector_config": {
            "broker": "cfg-test",
            "topics": ["orders"],
            "dead_letter": "orders.dlq",
        },
        "filter_spec": {"match": {"body.amount": {"gt": 100}}},
        "asset": "big_orders",
    }
    rebuilt = WatcherTrigger(**kwargs)
    assert rebuilt.shared_stream_key() == trigger.shared_stream_key()


def test_the_producer_is_built_from_the_first_subscribers_kwargs(config: AcklaneConfig) -> None:
    _, kwargs = build_watchers(config)[0].serialize()
    producer = WatcherTrigger.create_shared_stream_producer(kwargs)
    assert isinstance(producer, MemoryStreamProducer)
    assert producer.config.dead_letter == "orders.dlq"


async def test_a_triggers_filter_turns_raw_messages_into_trigger_events(
    config: AcklaneConfig,
) -> None:
    async def raw() -> AsyncIterator[RawMessage]:
        yield RawMessage(body=b'{"amount": 500}')
        yield RawMessage(body=b'{"amount": 5}')

    trigger = build_watchers(config)[0]
    events = [e async for e in trigger.filter_shared_stream(raw())]
    assert events == [TriggerEvent({"amount": 500})]


@pytest.fixture
def filter_module(write_module: Callable[..., str]) -> str:
    return write_module("acklane_cfg_filters", "def pick(message):\n    return message.json()\n")


def test_a_function_filter_is_imported_at_load(filter_module: str) -> None:
    text = with_watchers(
        f"- name: f\n  stream: orders\n  filter:\n    function: {filter_module}:pick\n"
    )
    config = parse_config(text, env={})
    assert config.watcher("f").compiled_filter.evaluate(RawMessage(body=b'{"a": 1}')) == [{"a": 1}]


def test_streams_over_one_upstream_with_different_settings_are_refused(tmp_path: Path) -> None:
    text = VALID.replace(
        "watchers:",
        "  again:\n    connector: memory\n    broker: cfg-test\n    topics: [orders]\n"
        "    batch_size: 5\nwatchers:",
    )
    path = write(tmp_path, text)
    assert (
        f"{path}:{line(path, 'again:')}: streams.again: reads the same upstream as stream 'orders'"
        in error(path)
    )


def teardown_module() -> None:
    MemoryBroker.remove("cfg-test")


# -- every problem once -------------------------------------------------------------------


KAFKA = """\
streams:
  events:
    connector: kafka
    bootstrap_servers: localhost:9092
    topics: [events]
    group_id: g
    client:
      Bad.Key: 1
      fetch.min.bytes: 1
      other_Bad: 2
      enable.auto.commit: true
watchers:
  - {name: w, stream: events}
"""


def test_every_bad_key_of_a_client_block_is_reported_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, KAFKA)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    problems = info.value.problems
    assert [(p.line, p.path) for p in problems] == [
        (line(path, "Bad.Key"), 'streams.events.client["Bad.Key"]'),
        (line(path, "other_Bad"), "streams.events.client.other_Bad"),
        (line(path, "enable.auto.commit"), 'streams.events.client["enable.auto.commit"]'),
    ]
    assert "'Bad.Key' is not a librdkafka property name" in problems[0].message
    assert "'other_Bad' is not a librdkafka property name" in problems[1].message


def test_a_missing_variable_is_one_problem_not_two(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        VALID.replace("ack_timeout: 60", "ack_timeout: ${ACK_TIMEOUT}").replace(
            "dead_letter: orders.dlq", "dead_letter: ${DLQ}\n    partitions: ${PARTS}"
        ),
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    messages = [p.message for p in info.value.problems]
    assert len(messages) == 3, messages
    assert all("is not set" in m for m in messages)


def test_a_value_no_union_member_accepts_is_one_problem(tmp_path: Path) -> None:
    path = write(tmp_path, KAFKA.replace("Bad.Key: 1", "fetch.max.bytes: [1, 2]"))
    text = error(path)
    assert (
        f'{path}:{line(path, "fetch.max.bytes")}: streams.events.client["fetch.max.bytes"]: '
        "expected true or false, an integer or a string, got a list" in text
    )
    assert '["fetch.max.bytes"].int' not in text


def test_two_fields_with_one_wrong_value_stay_two_problems(tmp_path: Path) -> None:
    path = write(
        tmp_path, VALID.replace("dead_letter: orders.dlq", "dead_letter: 5\n    group_id: 5")
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert [p.path for p in info.value.problems] == [
        "streams.orders.dead_letter",
        "streams.orders.group_id",
    ]


# -- secrets ------------------------------------------------------------------------------


def test_no_problem_message_holds_a_secret(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        VALID.replace("ack_timeout: 60", "ack_timeout: ${DB_PASSWORD}").replace(
            "url: sqlite:///events.db", 'url: "postgresql://u:${DB_PASSWORD}@h/db"'
        ),
    )
    text = error(path, env={"DB_PASSWORD": "hunter2-but-longer"})
    assert "hunter2" not in text
    assert "engine.ack_timeout: expected a number, got the string '***'" in text


def test_a_loaded_configuration_knows_its_secrets() -> None:
    text = VALID.replace("url: sqlite:///events.db", 'url: "postgresql://u:${PGPASS}@h/db"')
    text = text.replace("broker: cfg-test", "broker: ${BROKER_TOKEN}")
    config = parse_config(text, env={"PGPASS": "pg-secret-1", "BROKER_TOKEN": "broker-secret-2"})
    assert {"pg-secret-1", "broker-secret-2"} <= config.secrets
    assert "pg-secret-1" not in repr(config.store)
    assert "u:***@h/db" in repr(config.store)


# -- the store section alone --------------------------------------------------------------


def test_the_store_section_loads_without_the_streams_variables(tmp_path: Path) -> None:
    from acklane.core.config import load_store_config

    path = write(
        tmp_path,
        VALID.replace("broker: cfg-test", "broker: ${UNSET_BROKER}") + "state: {gc_interval: 5}\n",
    )
    with pytest.raises(ConfigError):
        load_config(path, env={})
    loaded = load_store_config(path, env={})
    assert loaded.store.url == f"sqlite:///{tmp_path.resolve() / 'events.db'}"
    assert loaded.state.gc_interval == 5


def test_the_store_section_reports_its_own_problems(tmp_path: Path) -> None:
    from acklane.core.config import load_store_config

    path = write(tmp_path, VALID.replace("url: sqlite:///events.db", "url: ${NO_DB}"))
    with pytest.raises(ConfigError) as info:
        load_store_config(path, env={})
    assert [p.path for p in info.value.problems] == ["store.url"]


def test_the_error_sample_in_the_docs_is_the_real_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/configuration.md's sample file and ``acklane validate`` output agree."""
    import re

    from typer.testing import CliRunner

    from acklane.core.cli.app import app

    docs = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    section = docs[docs.index("## Errors") : docs.index("## Environment variables")]
    yaml_text = re.search(r"```yaml\n(.*?)```", section, re.S)
    console = re.search(r"```console\n\$ acklane validate pipeline.yaml\n(.*?)```", section, re.S)
    assert yaml_text is not None and console is not None
    (tmp_path / "pipeline.yaml").write_text(yaml_text.group(1))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    result = CliRunner().invoke(app, ["validate", "pipeline.yaml"])
    assert result.exit_code == 2
    assert result.stderr == console.group(1)


def _pipeline_with_its_own_filter(tmp_path: Path) -> tuple[Path, str]:
    """A pipeline folder: the YAML and, beside it, the module of its function filter."""
    package = f"mypipeline_{uuid.uuid4().hex[:8]}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "filters.py").write_text(
        "def big_orders(message):\n    return message.json() if message.json()['n'] > 1 else None\n"
    )
    yaml = VALID.replace(
        "      match:\n        body.amount: {gt: 100}",
        f"      function: {package}.filters:big_orders",
    )
    return write(tmp_path, yaml), package


def test_a_function_filter_is_imported_from_the_configuration_files_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, package = _pipeline_with_its_own_filter(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    config = load_config(path, env={})
    [big, _] = build_watchers(config)
    assert big.compiled_filter.evaluate(RawMessage(b'{"n": 2}')) == [{"n": 2}]
    sys.modules.pop(f"{package}.filters", None)
    sys.modules.pop(package, None)


def test_acklane_validate_finds_a_filter_beside_the_yaml_from_another_directory(
    tmp_path: Path,
) -> None:
    import subprocess

    path, _ = _pipeline_with_its_own_filter(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "acklane.core.cli", "validate", str(path)],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No module named" not in done.stdout + done.stderr
