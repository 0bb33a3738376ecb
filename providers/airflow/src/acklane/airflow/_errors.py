"""acklane-airflow's error (a module of its own: importing it does not load Airflow)."""

from __future__ import annotations

from acklane.core.errors import AcklaneError

__all__ = ["AirflowTriggerError"]


class AirflowTriggerError(AcklaneError, ValueError, TypeError):
    """An acklane trigger's arguments or its Airflow connection cannot be used.

    Also a ``TypeError``: Airflow's triggerer fails just the one trigger whose
    constructor raises a ``TypeError`` ("failed to inflate"); any other exception
    there ends the whole trigger runner, every other trigger with it.
    """
