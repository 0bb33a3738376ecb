"""Fixtures for the cross-distribution tests.

- ``airflow_server``: one Apache Airflow API server for the test session
  (:class:`acklane.integration.airflow.AirflowServer`), its metadata database on
  SQLite in a temporary AIRFLOW_HOME, the DAGs of ``tests/airflow_dags`` stored (so
  their assets, ``orders`` and ``orders-by-uri``, exist). ``server.url``,
  ``server.admin`` / ``server.viewer`` (username, password), ``server.rest()`` for
  asset events and DAG runs through the REST API, ``server.start_component("scheduler")``
  when a test needs DAG runs. Skipped without Airflow (``uv sync --group airflow``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from acklane.integration.airflow import AirflowNotInstalled, AirflowServer, airflow_executable

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
