"""Service Bus -> Airflow: a DAG run per batch of order events, rejected orders to the
queue's own dead-letter queue with acklane's reason.

The connection ``acklane_servicebus`` is an Airflow Azure Service Bus connection
whose "Connection String" field holds the namespace's connection string.
"""

from __future__ import annotations

import os

from airflow.sdk import DAG, Asset, AssetWatcher, task

from acklane.airflow.servicebus import ServiceBusEventTrigger

QUEUE = os.environ.get("ACKLANE_EXAMPLE_SERVICEBUS_QUEUE", "orders")

orders = Asset(
    "servicebus_orders",
    watchers=[
        AssetWatcher(
            name="servicebus_orders",
            trigger=ServiceBusEventTrigger(
                conn_id="acklane_servicebus",
                queue=QUEUE,
                max_wait_time=1,
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

with DAG(dag_id="acklane_servicebus_orders", schedule=[orders], is_paused_upon_creation=False):

    @task
    def handle_orders():  # type: ignore[no-untyped-def]
        print("orders arrived")

    handle_orders()
