"""SQS -> Airflow: a DAG run per batch of order events, rejected orders to the DLQ.

The connection ``acklane_sqs`` is an Airflow AWS connection (login / password:
the access keys; extra: ``region_name``, ``endpoint_url``).
"""

from __future__ import annotations

import os

from airflow.sdk import DAG, Asset, AssetWatcher, task

from acklane.airflow.sqs import SqsEventTrigger

QUEUE_URL = os.environ.get(
    "ACKLANE_EXAMPLE_SQS_QUEUE_URL", "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"
)
DLQ_URL = os.environ.get(
    "ACKLANE_EXAMPLE_SQS_DLQ_URL", "https://sqs.eu-west-1.amazonaws.com/123456789012/orders-dlq"
)

orders = Asset(
    "sqs_orders",
    watchers=[
        AssetWatcher(
            name="sqs_orders",
            trigger=SqsEventTrigger(
                conn_id="acklane_sqs",
                queue_url=QUEUE_URL,
                dead_letter=DLQ_URL,
                wait_time_seconds=1,
                name="orders",
                filter={
                    "match": {"body.type": "order"},
                    "reject": {"body.amount": {"lt": 0}},
                    "emit": {"id": "body.id", "amount": "body.amount"},
                },
            ),
        )
    ],
)

with DAG(dag_id="acklane_sqs_orders", schedule=[orders], is_paused_upon_creation=False):

    @task
    def handle_orders():  # type: ignore[no-untyped-def]
        print("orders arrived")

    handle_orders()
