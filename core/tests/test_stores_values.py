"""What may be stored: JSON values and keys; everything else refused, nothing written."""

from __future__ import annotations

import datetime as dt
import decimal
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stores_helpers import BackendFactory, row_counts

from acklane.core.stores import (
    AssetStore,
    InvalidKeyError,
    InvalidValueError,
    JsonValue,
    TaskScope,
    TaskStore,
    ValueTooLargeError,
    ValueTypeError,
    encode_value,
    validate_key,
)

SCOPE = TaskScope("dag", "run", "task")


def _cycle() -> list[Any]:
    items: list[Any] = [1]
    items.append(items)
    return items


def _deep(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


REFUSED: dict[str, tuple[object, type[Exception], str]] = {
    "none at top level": (None, InvalidValueError, "None cannot be stored"),
    "datetime": (dt.datetime(2026, 1, 1), ValueTypeError, "datetime"),
    "date nested": ({"at": dt.date(2026, 1, 1)}, ValueTypeError, "$.at"),
    "bytes": (b"raw", ValueTypeError, "bytes"),
    "set": ({1, 2}, ValueTypeError, "set"),
    "tuple": ((1, 2), ValueTypeError, "tuple"),
    "tuple nested in list": ([1, (2, 3)], ValueTypeError, "$[1]"),
    "decimal": (decimal.Decimal("1.5"), ValueTypeError, "Decimal"),
    "object": (object(), ValueTypeError, "object"),
    "nan": (math.nan, InvalidValueError, "nan"),
    "infinity nested": ({"a": [1, {"b": math.inf}]}, InvalidValueError, "$.a[1].b"),
    "minus infinity": ([-math.inf], InvalidValueError, "-inf"),
    "non-string dict key": ({1: "x"}, ValueTypeError, "dict key 1"),
    "non-string nested dict key": ({"a": {None: 1}}, ValueTypeError, "$.a"),
    "reference cycle": (_cycle(), InvalidValueError, "cycle"),
    "too deep": (_deep(500), InvalidValueError, "nested deeper"),
    "lone surrogate": ("\ud800", InvalidValueError, "not valid Unicode"),
    "over max_value_bytes": ("x" * 70_000, ValueTooLargeError, "max_value_bytes=65535"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_value_names_the_key_and_the_problem(case: str) -> None:
    value, error, fragment = REFUSED[case]
    with pytest.raises(error) as caught:
        encode_value("the-key", value, max_bytes=65535)
    message = str(caught.value)
    assert "'the-key'" in message
    assert fragment in message
    assert "nothing was written" in message


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_value_leaves_both_stores_unchanged(
    make_backend: BackendFactory, db_url: str, case: str
) -> None:
    value, error, _ = REFUSED[case]
    backend = make_backend()
    task, asset = TaskStore(SCOPE, backend=backend), AssetStore("orders", backend=backend)
    for store in (task, asset):
        store.set("k", "before")
        store.set("other", [1])
    before = row_counts(db_url)

    with pytest.raises(error):
        task.set("k", value)  # type: ignore[arg-type]
    with pytest.raises(error):
        task.set("new", value)  # type: ignore[arg-type]
    with pytest.raises(error):
        asset.set("k", value)  # type: ignore[arg-type]

    for store in (task, asset):
        assert store.get("k") == "before"
        assert store.keys() == ["k", "other"]
    assert row_counts(db_url) == before


def test_value_types_are_refused_as_type_errors_and_bad_contents_as_value_errors() -> None:
    with pytest.raises(TypeError):
        encode_value("k", (1,), max_bytes=None)
    with pytest.raises(ValueError):
        encode_value("k", math.nan, max_bytes=None)
    with pytest.raises(ValueError):
        encode_value("k", None, max_bytes=None)


def test_json_values_are_accepted_including_nested_none() -> None:
    value = {"s": "é", "i": 10**30, "f": 0.1, "b": True, "n": None, "l": [None, [], {}]}
    encoded = encode_value("k", value, max_bytes=None)
    assert encoded.value == value
    assert encoded.text == '{"s":"é","i":1000000000000000000000000000000,"f":0.1,"b":true,' + (
        '"n":null,"l":[null,[],{}]}'
    )


def test_size_is_counted_in_utf8_bytes_of_the_encoded_json() -> None:
    assert encode_value("k", "é", max_bytes=None).nbytes == 4  # two quotes + 2 bytes
    encode_value("k", "x" * 65533, max_bytes=65535)  # 65535 bytes with the quotes
    with pytest.raises(ValueTooLargeError) as caught:
        encode_value("k", "é" * 32767, max_bytes=65535)
    assert caught.value.size == 65536


def test_value_of_exactly_max_value_bytes_is_stored_and_one_more_byte_is_refused(
    make_backend: BackendFactory,
) -> None:
    store = TaskStore(SCOPE, backend=make_backend(max_value_bytes=100))
    store.set("fits", "x" * 98)
    with pytest.raises(ValueTooLargeError, match="101 bytes, over max_value_bytes=100"):
        store.set("too-big", "x" * 99)
    assert store.keys() == ["fits"]


@pytest.mark.parametrize(
    ("key", "error", "fragment"),
    [
        ("", InvalidKeyError, "must not be empty"),
        ("k" * 513, InvalidKeyError, "513 characters"),
        ("a\x00b", InvalidKeyError, "NUL"),
        ("\udc80", InvalidKeyError, "not valid Unicode"),
        (42, TypeError, "must be a str, got int"),
    ],
)
def test_bad_keys_are_refused(key: Any, error: type[Exception], fragment: str) -> None:
    with pytest.raises(error, match=fragment):
        validate_key(key)


def test_bad_key_is_refused_by_every_operation(make_backend: BackendFactory) -> None:
    store = TaskStore(SCOPE, backend=make_backend())
    for operation in (
        lambda: store.set("", 1),
        lambda: store.get(""),
        lambda: store.delete(""),
    ):
        with pytest.raises(InvalidKeyError):
            operation()


def test_key_of_512_characters_is_stored(make_backend: BackendFactory) -> None:
    key = "k" * 512
    store = AssetStore("orders", backend=make_backend())
    store.set(key, 1)
    assert store.get(key) == 1
    assert store.keys() == [key]


json_values: st.SearchStrategy[JsonValue] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
).filter(lambda v: v is not None)


def test_any_json_value_comes_back_exactly(make_backend: BackendFactory) -> None:
    store = TaskStore(SCOPE, backend=make_backend())

    @settings(max_examples=40, deadline=None)
    @given(value=json_values)
    def round_trip(value: JsonValue) -> None:
        store.set("k", value)
        back = store.get("k")
        assert back == value
        assert encode_value("k", back, max_bytes=None).text == (
            encode_value("k", value, max_bytes=None).text
        )

    round_trip()
