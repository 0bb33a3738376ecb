"""Pub/Sub -> Airflow: a DAG run per batch of order events, rejected orders dead-lettered.

The connection ``acklane_pubsub`` is an Airflow Google Cloud connection (extra:
``project``, ``key_path``; or acklane's ``emulator_host`` for an emulator).
"""

from __future__ import annotations

import os

from airflow.sdk import DAG, Asset, AssetWatcher, task

from acklane.airflow.pubsub import PubSubEventTrigger

SUBSCRIPTION = os.environ.get("ACKLANE_EXAMPLE_PUBSUB_SUBSCRIPTION", "orders-airflow")
DEAD_LETTER_TOPIC = os.environ.get("ACKLANE_EXAMPLE_PUBSUB_DLQ", "orders-dlq")

orders = Asset(
    "pubsub_orders",
    watchers=[
        AssetWatcher(
            name="pubsub_orders",
            trigger=PubSubEventTrigger(
                conn_id="acklane_pubsub",
                subscription=SUBSCRIPTION,
                dead_letter=DEAD_LETTER_TOPIC,
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

with DAG(dag_id="acklane_pubsub_orders", schedule=[orders], is_paused_upon_creation=False):

    @task
    def handle_orders():  # type: ignore[no-untyped-def]
        print("orders arrived")

    handle_orders()
