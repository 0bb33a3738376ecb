"""Fixtures shared by the engine's tests (core/tests), each defined once.

The database URLs (``sqlite_url``, ``pg_url``, ``db_url``) come from the workspace's
conftest. Here:

- ``broker``: an in-process broker of the test's own, topic ``orders`` with one
  partition; a module or test names other topics with the ``topics`` marker
  (``pytestmark = pytest.mark.topics(orders=2)``).
- ``filter_path``: the runner's two paths for a synchronous filter (apply it with
  ``runner_harness.both_filter_paths``).
- ``up``, ``manager``, ``stop_watchers``: the engine's scripted upstream, a manager
  and the watchers' clean-up, defined beside their harness (``engine_harness``) because
  the cross-distribution tests use them too.
- ``make_backend``, ``amake_backend``: state-store backends on ``db_url``, closed after.
- ``forget_secrets``, ``tracing_off``: undo what a test left in a process-wide registry
  (the secrets redaction knows, the installed tracer); a module opts in with
  ``pytestmark = pytest.mark.usefixtures(...)``.
- ``sink_received``: what ``sink_functions``' sinks received, emptied before the test.
- ``write_module``: writes a module of the test's own (filter or sink functions) into
  its tmp_path under a unique name, forgotten by ``sys.modules`` after.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from engine_harness import manager, stop_watchers, up  # noqa: F401 - fixtures, shared with tests/
from sink_functions import RECEIVED, RECEIVED_OTHER
from stores_helpers import BackendFactory, backend_factory

from acklane.connectors.memory import MemoryBroker
from acklane.core.observe import redact, tracing
from acklane.core.pipeline import runner as runner_module
from acklane.core.stores import MetastoreBackend

#: The ``broker`` fixture's topics (name: partitions) when no ``topics`` marker says.
DEFAULT_TOPICS = {"orders": 1}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "topics(**partitions): the topics of the `broker` fixture (default orders=1)"
    )


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> Iterator[MemoryBroker]:
    """An in-process broker under a unique name, so no test sees another's messages."""
    marker = request.node.get_closest_marker("topics")
    topics: dict[str, int] = marker.kwargs if marker else DEFAULT_TOPICS
    made = MemoryBroker.get(f"b-{uuid.uuid4().hex[:8]}")
    for topic, partitions in topics.items():
        made.create_topic(topic, partitions)
    yield made
    MemoryBroker.remove(made.name)


@pytest.fixture(params=["generator", "inline"])
def filter_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The runner's two paths for a synchronous filter: evaluated inline by the group
    (the default) or run as a generator in a task of its own (``engine.inline_filters:
    false``); a test using this fixture runs on both."""
    if request.param == "generator":
        # a private seam: the YAML switch would mean rewriting every test's configuration
        monkeypatch.setattr(runner_module._Cohort, "_watch_inline", runner_module._Cohort._watch)
    yield request.param


@pytest.fixture
def make_backend(db_url: str, tmp_path: Path) -> Iterator[BackendFactory]:
    """Build backends on the test's database (settings overrides as keywords); closed after."""
    made: list[MetastoreBackend] = []
    yield backend_factory(db_url, made, tmp_path)
    for backend in made:
        backend.close()


@pytest.fixture
async def amake_backend(db_url: str, tmp_path: Path) -> AsyncIterator[BackendFactory]:
    """Like ``make_backend``, closed inside the test's event loop (async engines)."""
    made: list[MetastoreBackend] = []
    yield backend_factory(db_url, made, tmp_path)
    for backend in made:
        await backend.aclose()


@pytest.fixture
def forget_secrets() -> Iterator[None]:
    """The secrets a test's configuration or sinks registered for redaction, forgotten
    after it (the registry is process-wide)."""
    yield
    redact.forget_all()


@pytest.fixture
def tracing_off(forget_secrets: None) -> Iterator[None]:
    """The tracer a test installed, uninstalled after it (then its secrets forgotten)."""
    yield
    tracing.install(None)


@pytest.fixture
def sink_received() -> None:
    """What the function sinks of ``sink_functions`` received in earlier tests, emptied."""
    RECEIVED.clear()
    RECEIVED_OTHER.clear()


@pytest.fixture
def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., str]]:
    """``write_module(prefix, source)`` writes ``<prefix>_<unique>.py`` into tmp_path and
    returns its name, importable (tmp_path on sys.path) unless ``importable=False``: for
    code that finds the folder itself, whose change to sys.path is then undone."""
    written: list[str] = []

    def write(prefix: str, source: str, *, importable: bool = True) -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{name}.py").write_text(source)
        written.append(name)
        if importable:
            monkeypatch.syspath_prepend(str(tmp_path))
        else:
            monkeypatch.setattr(sys, "path", list(sys.path))
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)
