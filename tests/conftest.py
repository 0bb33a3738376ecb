"""Fixtures for the cross-distribution tests.

- ``airflow_server``: one Apache Airflow API server for the test session
  (:class:`acklane.integration.airflow.AirflowServer`), its metadata database on
  SQLite in a temporary AIRFLOW_HOME, the DAGs of ``tests/airflow_dags`` stored (so
  their assets, ``orders`` and ``orders-by-uri``, exist). ``server.url``,
  ``server.admin`` / ``server.viewer`` (username, password), ``server.rest()`` for
  asset events and DAG runs through the REST API, ``server.start_component("scheduler")``
  when a test needs DAG runs. Skipped without Airflow (``uv sync --group airflow``).
- ``kit``: a broker kit (``acklane.integration.kits``) on the session's emulator of its
  broker, for every connector with a kit; ``kit_broker`` is the (connector, emulator)
  it is made for. A module that runs on fewer brokers names them with the
  ``kit_brokers`` marker (``pytestmark = pytest.mark.kit_brokers("kafka", "sqs")``).
- ``up``, ``manager``, ``stop_watchers``: the engine's scripted upstream, a manager and
  the watchers' clean-up, from core/tests' ``engine_harness`` (defined there, once).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from engine_harness import manager, stop_watchers, up  # noqa: F401 - fixtures, shared with core

from acklane.integration.airflow import AirflowNotInstalled, AirflowServer, airflow_executable
from acklane.integration.emulator import Emulator
from acklane.integration.kits import KITS, BrokerKit, kit_for

AIRFLOW_DAGS = Path(__file__).resolve().parent / "airflow_dags"


@pytest.fixture(scope="session")
def airflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowServer]:
    """A running Airflow API server, shared by the session's tests."""
    try:
        airflow_executable()
    except AirflowNotInstalled as exc:
        pytest.skip(str(exc))
    with AirflowServer(tmp_path_factory.mktemp("airflow-home"), AIRFLOW_DAGS) as server:
        yield server


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "kit_brokers(*names): the connectors `kit` runs on (default: every kit's)"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test using ``kit`` runs once per broker: every kit's, or its ``kit_brokers``."""
    if "kit_broker" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("kit_brokers")
        names = list(marker.args) if marker else sorted(KITS)
        metafunc.parametrize("kit_broker", names, indirect=True)


@pytest.fixture
def kit_broker(request: pytest.FixtureRequest) -> tuple[str, Emulator | None]:
    """A connector's name and the session's emulator of its broker (none for memory)."""
    name: str = request.param
    if name == "memory":
        return name, None
    emulator: Emulator = request.getfixturevalue(f"{name}_emulator")
    return name, emulator


@pytest.fixture
async def kit(kit_broker: tuple[str, Emulator | None]) -> AsyncIterator[BrokerKit]:
    async with kit_for(*kit_broker) as made:
        yield made
