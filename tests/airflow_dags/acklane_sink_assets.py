"""DAGs for the tests that run a real Airflow API server (tests/conftest.py's
``airflow_server``): each schedules on an asset, so that the asset exists (and is
active) once ``airflow dags reserialize`` has stored it. Their one task is an
EmptyOperator, which the scheduler marks done without an executor, so that a DAG run
per asset event costs next to nothing when a test starts the scheduler.
"""

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset

#: The asset a watcher named ``orders`` feeds (the sink's default asset).
ORDERS = Asset("orders")
#: An asset the sink names by URI.
ORDERS_BY_URI = Asset(name="orders-by-uri", uri="s3://acklane-tests/orders.csv")
#: The asset of examples/sinks/kafka-airflow.yaml.
BIG_ORDERS = Asset("big_orders")

for dag_id, asset in (
    ("acklane_sink_orders", ORDERS),
    ("acklane_sink_orders_by_uri", ORDERS_BY_URI),
    ("acklane_sink_big_orders", BIG_ORDERS),
):
    with DAG(
        dag_id, schedule=[asset], catchup=False, is_paused_upon_creation=False, tags=["acklane"]
    ):
        EmptyOperator(task_id="received")
