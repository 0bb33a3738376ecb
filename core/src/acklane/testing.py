"""``acklane.testing``: run a pipeline's test cases from pytest, as ``acklane test`` does.

.. code-block:: python

    from acklane.testing import assert_pipeline_tests

    def test_orders_pipeline():
        assert_pipeline_tests("pipelines/orders.yaml")  # + orders.tests.yaml beside it

The short name of :mod:`acklane.core.testing` (docs/testing.md).
"""

from acklane.core.testing import (
    CLEAN,
    FAILED,
    UNCLAIMED,
    assert_pipeline_tests,
    eventually,
    rejected,
    run_pipeline_tests,
    run_pipeline_tests_async,
)

__all__ = [
    "CLEAN",
    "FAILED",
    "UNCLAIMED",
    "assert_pipeline_tests",
    "eventually",
    "rejected",
    "run_pipeline_tests",
    "run_pipeline_tests_async",
]
