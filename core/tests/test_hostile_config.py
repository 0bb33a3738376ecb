"""A configuration file as hostile input: it can neither hang the loader, nor exhaust its
memory, nor run code beside it unasked; every refusal is a ConfigError that names the file,
the line where there is one, and the limit."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import tracemalloc
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acklane.core.config import ConfigError, load_config, parse_config

#: The loader's limits as docs/security.md states them: 1 MiB, 100 levels, 100,000 values.
MAX_BYTES, MAX_DEPTH, MAX_VALUES = 1024 * 1024, 100, 100_000

VALID = """\
store:
  url: sqlite:///events.db
streams:
  orders:
    connector: memory
    broker: hostile-test
    topics: [orders]
watchers:
  - name: everything
    stream: orders
"""


def bounded(call: Callable[[], Any], *, seconds: float = 5.0, megabytes: int = 64) -> Any:
    """``call()``'s ConfigError, checked to come within ``seconds`` and ``megabytes``
    (tracemalloc's peak) of Python allocations."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(ConfigError) as info:
            call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < seconds
    assert peak < megabytes * 1024 * 1024, f"peak {peak / 1e6:.0f} MB"
    return info.value


# -- the YAML: aliases, nesting, size ------------------------------------------------------


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """A few hundred bytes that stand for ``width ** levels`` strings."""
    lines = ['a0: &a0 ["lol"]']
    for n in range(1, levels + 1):
        refs = ", ".join([f"*a{n - 1}"] * width)
        lines.append(f"a{n}: &a{n} [{refs}]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_quickly_naming_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    assert path.stat().st_size < 600
    error = bounded(lambda: load_config(path, env={}))
    [problem] = error.problems
    assert problem.source == str(path)
    assert problem.line is not None and problem.line > 1  # an entry that expands, not a0
    assert f"more than {MAX_VALUES} values" in problem.message


def test_deep_nesting_is_a_problem_at_its_line_not_a_recursion_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("a:\n  " + "[" * 500 + "]" * 500 + "\n")
    error = bounded(lambda: load_config(path, env={}))
    [problem] = error.problems
    assert (problem.source, problem.line) == (str(path), 2)
    assert f"more than {MAX_DEPTH} levels" in problem.message


def test_aliases_cannot_nest_deeper_than_the_limit() -> None:
    half = MAX_DEPTH // 2 + 5
    text = f"a: &a {'[' * half}1{']' * half}\nb: {'[' * half}*a{']' * half}\n"
    error = bounded(lambda: parse_config(text, source="deep.yaml"))
    assert f"more than {MAX_DEPTH} levels" in str(error)


def test_a_file_larger_than_the_limit_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(VALID + "#" * MAX_BYTES + "\n")
    error = bounded(lambda: load_config(path, env={}))
    assert str(error).endswith(
        f"{path}: the configuration is larger than {MAX_BYTES} bytes (the limit)"
    )


def test_a_device_is_refused_without_reading_it() -> None:
    error = bounded(lambda: load_config("/dev/zero", env={}))
    assert "/dev/zero: the configuration is not a regular file" in str(error)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "pipeline.yaml"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def load() -> None:
        try:
            load_config(fifo, env={})
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(5)
    if thread.is_alive():  # unblock the reader so the test process can end
        with open(fifo, "w"):
            pass
        pytest.fail("load_config blocked on a FIFO")
    [error] = outcome
    assert isinstance(error, ConfigError)
    assert "not a regular file" in str(error)


# -- the user's modules: beside the configuration, never in front of the installed ones ----


def marker_module(folder: Path, name: str) -> Path:
    """``name.py`` in ``folder``: importing it writes a marker file (returned) and
    defines a filter ``pick``."""
    marker = folder / f"{name}.imported"
    (folder / f"{name}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "def pick(message):\n    return True\n"
    )
    return marker


def acklane_validate(path: Path) -> subprocess.CompletedProcess[str]:
    """``acklane validate`` in a fresh process, from the configuration's folder."""
    script = Path(sys.executable).with_name("acklane")
    return subprocess.run(
        [str(script), "validate", str(path)],
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("valid", [True, False], ids=["valid", "invalid"])
def test_a_module_beside_the_config_does_not_replace_the_standard_library(
    tmp_path: Path, valid: bool
) -> None:
    markers = [marker_module(tmp_path, name) for name in ("colorsys", "json", "typing")]
    path = tmp_path / "pipeline.yaml"
    path.write_text(VALID if valid else VALID + "unknown_key: 1\n")
    result = acklane_validate(path)
    assert result.returncode == (0 if valid else 2), result.stderr
    assert [m.name for m in markers if m.exists()] == []


def test_a_filter_module_named_like_a_stdlib_module_is_refused_clearly(tmp_path: Path) -> None:
    marker = marker_module(tmp_path, "colorsys")
    path = tmp_path / "pipeline.yaml"
    path.write_text(VALID + "    filter:\n      function: colorsys:pick\n")
    error = str(bounded(lambda: load_config(path, env={})))
    assert f"{tmp_path / 'colorsys.py'} has the name of the standard library's module" in error
    assert "rename your module" in error
    assert not marker.exists()


def test_an_invalid_file_imports_none_of_its_modules(tmp_path: Path) -> None:
    marker = marker_module(tmp_path, "hostile_filters_invalid")
    path = tmp_path / "pipeline.yaml"
    text = VALID + "    filter:\n      function: hostile_filters_invalid:pick\n"
    path.write_text(text.replace("topics: [orders]", "topics: 7"))
    error = str(bounded(lambda: load_config(path, env={})))
    assert "streams.orders.topics" in error
    assert "hostile_filters_invalid" not in error  # neither imported nor complained about
    assert not marker.exists()


def test_a_valid_file_imports_its_filter_from_beside_it(tmp_path: Path) -> None:
    marker = marker_module(tmp_path, "hostile_filters_valid")
    path = tmp_path / "pipeline.yaml"
    path.write_text(VALID + "    filter:\n      function: hostile_filters_valid:pick\n")
    assert load_config(path, env={}).watchers[0].name == "everything"
    assert marker.exists()


# -- settings that work but expose what they carry: warned at their line -------------------

EXPOSED = """\
store:
  url: sqlite:///{db}
streams:
  orders:
    connector: memory
    topics: [orders]
watchers:
  - name: everything
    stream: orders
    asset: orders
    sinks: [airflow, hook, signed, local]
sinks:
  - name: airflow
    kind: airflow
    url: http://airflow.internal:8080
    username: acklane
    password: hunter2-hunter2
  - name: hook
    kind: webhook
    url: https://user:pw@hooks.example.com/in
    verify_tls: false
  - name: signed
    kind: webhook
    url: http://hooks.example.com/in
    secret: an-hmac-key-that-is-never-sent-000
    headers: {{X-Api-Key: abc}}
  - name: local
    kind: webhook
    url: http://user:pw@127.0.0.1:9/in
tracing:
  endpoint: http://collector.example.com:4318
  headers: {{x-team: abc}}
"""


def exposed(tmp_path: Path) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(EXPOSED.format(db=tmp_path / "events.db"))
    return path


def line_of(path: Path, needle: str) -> int:
    return next(i for i, t in enumerate(path.read_text().splitlines(), 1) if needle in t)


def test_exposing_settings_are_warned_at_their_file_line_and_field(tmp_path: Path) -> None:
    path = exposed(tmp_path)
    found = load_config(path, env={}).warnings
    assert {w.source for w in found} == {str(path)}
    assert [(w.line, w.path) for w in found] == [
        (line_of(path, "airflow.internal"), "sinks[0].url"),
        (line_of(path, "verify_tls"), "sinks[1].verify_tls"),
        (line_of(path, "http://hooks"), "sinks[2].url"),
        (line_of(path, "collector"), "tracing.endpoint"),
    ]  # https and the loopback interface are not warned
    messages = [w.message for w in found]
    assert "plain http:// while password goes with each request" in messages[0]
    assert "TLS certificate is not checked" in messages[1]
    assert "plain http:// while headers goes with each request" in messages[2]
    assert "plain http:// while headers goes with each request" in messages[3]
    assert "hunter2" not in repr(found) and "abc" not in repr(found)


def test_a_url_password_over_http_is_warned() -> None:
    text = VALID.replace(
        "everything\n    stream: orders\n", "e\n    stream: orders\n    sinks: [h]\n"
    )
    text += "sinks:\n  - {name: h, kind: webhook, url: 'http://u:secret-pw@hooks.example.com/'}\n"
    [warning] = parse_config(text, source="p.yaml").warnings
    assert (warning.line, warning.path) == (13, "sinks[0].url")
    assert "URL's password is sent over plain http://" in warning.message


def test_validate_prints_the_warnings_and_run_logs_them_once(tmp_path: Path) -> None:
    path = exposed(tmp_path)
    result = acklane_validate(path)
    assert result.returncode == 0, result.stderr
    shown = " ".join(result.stdout.split())
    assert f"warning {path}:{line_of(path, 'verify_tls')}: sinks[1].verify_tls: false" in shown
    script = Path(sys.executable).with_name("acklane")
    run = subprocess.Popen(
        [str(script), "run", str(path), "--no-sinks"],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "ACKLANE_LOG_FORMAT": "text", "COLUMNS": "200"},
    )
    assert run.stderr is not None
    try:
        seen = ""
        for line in run.stderr:
            seen += line
            if "Shared stream group started" in line or "Traceback" in line:
                break
        run.terminate()
        seen += run.communicate(timeout=30)[1]
    finally:
        if run.poll() is None:
            run.kill()
    assert seen.count("sinks[1].verify_tls") == 1, seen
    assert seen.count("tracing.endpoint") == 1, seen


# -- a bounded fuzz: any text is a configuration or a ConfigError, quickly ----------------

_KEYS = (
    "engine", "store", "state", "metrics", "tracing", "streams", "watchers", "sinks",
    "url", "connector", "topics", "dead_letter", "name", "stream", "asset", "filter",
    "match", "reject", "emit", "function", "kind", "verify_tls", "headers", "password",
    "token", "username", "endpoint", "enabled", "body.amount", "gt", "in", "<<", "x-a",
)  # fmt: skip
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.sampled_from(
        [
            "memory", "orders", "sqlite:///:memory:", "http://h.example/", "https://u:p@h/",
            "${SET}", "${UNSET}", "${UNSET:-d}", "$${x}", "no_such_mod_fz:f", "os:getcwd",
            "acklane", "webhook", "airflow", "function", "10s", "", "&", "*a", "[", "{",
        ]
    ),
    st.text(max_size=12),
)  # fmt: skip
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(_KEYS), st.text(max_size=6)), inner, max_size=5),
    ),
    max_leaves=25,
)
_SNIPPETS = st.one_of(
    st.text(alphabet="&*[]{}:-!|>#'\"\n %@$<,?ab01", max_size=30),
    st.sampled_from(
        [
            "x-a: &a [1, 2]\n", "x-b: *a\n", "x-c: &c {<<: *c}\n", "!!python/name:os.system\n",
            "x: !!binary AAA\n", "x: !!set {a}\n", "x: 1" + "0" * 5000 + "\n", "\t", "\x00",
            "---\n", "...\n", "%YAML 1.1\n", "? [a]\n: b\n", "x: " + "[" * 200 + "]" * 200,
        ]
    ),
)  # fmt: skip


def _texts() -> st.SearchStrategy[str]:
    dumped = _VALUES.map(lambda v: yaml.safe_dump(v, default_flow_style=None, allow_unicode=True))
    mutated = st.builds(
        lambda at, snippet: VALID[:at] + snippet + VALID[at:],
        st.integers(0, len(VALID)),
        _SNIPPETS,
    )
    return st.one_of(dumped, mutated, _SNIPPETS)


@settings(
    max_examples=150,
    derandomize=True,
    deadline=timedelta(seconds=2),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(_texts())
def test_any_text_is_a_configuration_or_a_config_error_within_bounds(text: str) -> None:
    tracemalloc.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # old names warned: allowed
            try:
                parse_config(text, source="fuzz.yaml", env={"SET": "1"})
            except ConfigError as exc:
                assert exc.problems and all(p.source == "fuzz.yaml" for p in exc.problems)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 * 1024, f"peak {peak / 1e6:.0f} MB"
