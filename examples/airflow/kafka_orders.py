"""Kafka -> Airflow: a DAG run per batch of order events, rejected orders dead-lettered.

Two watchers read the same topic through one consumer group: in Airflow's
triggerer they share one poll (same connection, topics and group). The
connection ``acklane_kafka`` holds the client settings (Airflow's Kafka
connection: librdkafka properties in its extra, ``bootstrap.servers`` ...).
"""

from __future__ import annotations

import os

from airflow.sdk import DAG, Asset, AssetWatcher, task

from acklane.airflow.kafka import KafkaEventTrigger

TOPIC = os.environ.get("ACKLANE_EXAMPLE_KAFKA_TOPIC", "orders")
GROUP = os.environ.get("ACKLANE_EXAMPLE_KAFKA_GROUP", "airflow-orders")
DLQ = os.environ.get("ACKLANE_EXAMPLE_KAFKA_DLQ", "orders-dlq")

shared = {"conn_id": "acklane_kafka", "topics": [TOPIC], "group_id": GROUP, "dead_letter": DLQ}

orders = Asset(
    "kafka_orders",
    watchers=[
        AssetWatcher(
            name="kafka_orders",
            trigger=KafkaEventTrigger(
                **shared,
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
audit = Asset(
    "kafka_audit",
    watchers=[
        AssetWatcher(
            name="kafka_audit",
            trigger=KafkaEventTrigger(**shared, name="audit", filter="acklane_filters:audit"),
        )
    ],
)

with DAG(dag_id="acklane_kafka_orders", schedule=[orders], is_paused_upon_creation=False):

    @task
    def handle_orders(triggering_asset_events=None):  # type: ignore[no-untyped-def]
        for event in (triggering_asset_events or {}).get(orders, []):
            print("order", event.extra)

    handle_orders()

with DAG(dag_id="acklane_kafka_audit", schedule=[audit], is_paused_upon_creation=False):

    @task
    def handle_audit():  # type: ignore[no-untyped-def]
        print("audited")

    handle_audit()
