"""Errors of the task store and the asset store; each names the key and the problem.

Their base, :class:`StateStoreError`, is defined with acklane's other root errors in
:mod:`acklane.core.errors` and re-exported here.
"""

from __future__ import annotations

from ..errors import StateStoreError

__all__ = [
    "AssetInactiveError",
    "InvalidKeyError",
    "InvalidValueError",
    "OffloadedValueMissingError",
    "StateStoreError",
    "ValueTooLargeError",
    "ValueTypeError",
]


class InvalidKeyError(StateStoreError, ValueError):
    """A key that is empty, too long, or not storable text."""


class InvalidValueError(StateStoreError, ValueError):
    """A value refused for what it contains (None at top level, NaN, a cycle...)."""

    def __init__(self, key: str, path: str, problem: str) -> None:
        self.key = key
        self.path = path
        self.problem = problem
        where = "" if path == "$" else f" at {path}"
        super().__init__(f"state key {key!r}: value{where} refused: {problem}; nothing was written")


class ValueTooLargeError(InvalidValueError):
    """A value whose encoded JSON is over ``max_value_bytes`` and is not offloaded."""

    def __init__(self, key: str, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            key,
            "$",
            f"encoded JSON is {size} bytes, over max_value_bytes={limit} (store a reference "
            "to the data instead, or configure an offloading backend: state.offload_dir)",
        )


class ValueTypeError(StateStoreError, TypeError):
    """A value (or a part of it) whose type is not a JSON type."""

    def __init__(self, key: str, path: str, offending: object, hint: str) -> None:
        self.key = key
        self.path = path
        self.type_name = _type_name(offending)
        where = "" if path == "$" else f" at {path}"
        super().__init__(
            f"state key {key!r}: value{where} is a {self.type_name}, which is not JSON "
            f"(str, int, float, bool, list, dict with str keys, nested None); {hint}; "
            "nothing was written"
        )


class AssetInactiveError(StateStoreError, RuntimeError):
    """A write to an asset that was deactivated (its keys are being removed)."""

    def __init__(self, asset: str, key: str) -> None:
        self.asset = asset
        self.key = key
        super().__init__(
            f"asset {asset!r} is deactivated: state key {key!r} was not written (reactivate it "
            f"with `acklane store activate --asset {asset}` or StateBackend.activate_asset)"
        )


class OffloadedValueMissingError(StateStoreError, LookupError):
    """A row references an offloaded value that can no longer be read."""

    def __init__(self, key: str, ref: str, reason: str) -> None:
        self.key = key
        self.ref = ref
        super().__init__(f"state key {key!r}: offloaded value {ref!r} cannot be read: {reason}")


def _type_name(obj: object) -> str:
    t = type(obj)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
