"""The Kafka record filters receive: fields read lazily from the client's message.

The real-broker checks are in integration/tests/test_kafka_producer.py; these pin the
lazy fields' edge cases (tombstones, missing keys and timestamps, repeated headers).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_NOT_AVAILABLE

from acklane.connectors.kafka import KafkaDelivery, KafkaMessage, message_id_of
from acklane.connectors.kafka._message import id_prefix
from acklane.core.message import MAX_JSON_DEPTH, BodyDecodeError, RawMessage


class Native:
    """What confluent-kafka's Message answers, with counters for the lazy reads."""

    def __init__(
        self,
        value: bytes | None,
        key: bytes | None = None,
        headers: list[tuple[str, bytes | None]] | None = None,
        timestamp: tuple[int, int] = (TIMESTAMP_CREATE_TIME, 1_700_000_000_000),
    ) -> None:
        self._value, self._key, self._headers, self._timestamp = value, key, headers, timestamp
        self.header_reads = 0

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        self.header_reads += 1
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return self._timestamp


PREFIX = id_prefix("c-1", "orders", "T0pic1d", 2)


def record(native: Any, offset: int = 7) -> KafkaMessage:
    return KafkaMessage(native, 3, ("orders", 2), offset, PREFIX)


def test_a_record_is_a_raw_message_and_its_own_broker_payload() -> None:
    r = record(Native(b'{"n": 1}', key=b"k-1"))
    assert isinstance(r, RawMessage)
    assert KafkaDelivery is KafkaMessage
    assert (r.topic, r.partition, r.offset) == ("orders", 2, 7)
    assert (r.lane, r.generation) == (("orders", 2), 3)
    assert r.message_id == "kafka:c-1/orders:T0pic1d/2/7"
    assert (r.body, r.key, r.key_bytes, r.source) == (b'{"n": 1}', "k-1", b"k-1", "orders")
    assert r.json() == {"n": 1}
    assert r.native is r.message
    assert r.delivery_attempt is None
    assert r.timestamp == r.publish_time == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)


def test_headers_are_decoded_once_the_last_repeated_one_winning() -> None:
    native = Native(b"x", headers=[("a", b"1"), ("a", b"2"), ("b", None), ("c", b"\xff")])
    r = record(native)
    assert native.header_reads == 0  # nothing is read before a filter asks
    assert r.attributes == {"a": "2", "b": "", "c": "\ufffd"}
    assert r.attributes is r.attributes and native.header_reads == 1
    assert r.headers == (("a", b"1"), ("a", b"2"), ("b", None), ("c", b"\xff"))


def test_a_tombstone_without_key_headers_or_timestamp() -> None:
    r = record(Native(None, timestamp=(TIMESTAMP_NOT_AVAILABLE, 0)))
    assert r.tombstone and r.body == b""
    assert (r.key, r.key_bytes, r.attributes, r.headers, r.timestamp) == (None, None, {}, (), None)
    with pytest.raises(BodyDecodeError, match="kafka:c-1/orders:T0pic1d/2/7 body is not JSON"):
        r.json()


def test_a_value_nested_too_deep_is_a_body_decode_error_not_a_recursion_error() -> None:
    # the record decodes its value itself (msgspec, then RawMessage.json's fallback)
    assert record(Native(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH)).json() is not None
    for depth in (MAX_JSON_DEPTH + 1, 5000):
        deep = record(Native(b"[" * depth + b"]" * depth))
        with pytest.raises(BodyDecodeError, match="2/7 body is JSON nested deeper than 128"):
            deep.json()


def test_repr_and_equality_follow_the_record() -> None:
    native = Native(b"hello")
    assert repr(record(native)) == "KafkaMessage('kafka:c-1/orders:T0pic1d/2/7', body=b'hello')"
    assert record(native) == record(native)
    assert record(native) != record(native, offset=8)


def test_the_record_is_read_only_and_copies() -> None:
    import copy

    r = record(Native(b"hello", headers=[("a", b"1")]))
    for name in ("offset", "lane", "generation", "message", "body", "message_id"):
        with pytest.raises(AttributeError):
            setattr(r, name, None)  # a filter must not change what gets committed
    for twin in (copy.copy(r), copy.deepcopy(r)):
        assert twin == r and twin is not r
        assert (twin.message_id, twin.attributes, twin.native) == (
            "kafka:c-1/orders:T0pic1d/2/7",
            {"a": "1"},
            r.native,
        )


class Located(Native):
    def topic(self) -> str:
        return "orders"

    def partition(self) -> int:
        return 2

    def offset(self) -> int:
        return 7


def test_the_message_id_names_the_cluster_and_the_topic_id_where_there_is_one() -> None:
    native = Located(b"x")
    assert message_id_of(native, "c-1", "T0pic1d") == "kafka:c-1/orders:T0pic1d/2/7"
    assert message_id_of(native, "c-1") == "kafka:c-1/orders/2/7"  # a broker without topic ids
    assert message_id_of(native, "c-1", "T0pic1d") == record(native).message_id


def test_the_same_position_on_another_cluster_or_topic_life_is_another_message() -> None:
    records = [
        KafkaMessage(Native(b"x"), 1, ("orders", 2), 7, id_prefix(cluster, "orders", tid, 2))
        for cluster, tid in [("c-1", "A"), ("c-2", "A"), ("c-1", "B"), ("c-1", None)]
    ]
    assert len({r.message_id for r in records}) == 4


def test_json_is_the_standard_librarys_verdict_on_what_msgspec_refuses() -> None:
    import math

    assert math.isnan(record(Native(b'{"a": NaN}')).json()["a"])  # not strict JSON
    assert record(Native(b"12345678901234567890123")).json() == 12345678901234567890123
    with pytest.raises(BodyDecodeError, match="is not JSON"):
        record(Native(b"{nope")).json()
    with pytest.raises(BodyDecodeError, match="not UTF-8"):
        record(Native(b'"\xff"')).json()
