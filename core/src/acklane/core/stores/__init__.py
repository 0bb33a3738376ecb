"""The task store and the asset store: key/value state that outlives one attempt.

A :class:`TaskStore` belongs to one task instance (``dag_id, run_id, task_id,
map_index``) and is shared by its retries: keep there the id of an external job
before polling it. An :class:`AssetStore` belongs to one asset, across runs: keep
there a watermark or an incremental-load cursor. Both store JSON values through a
:class:`StateBackend` (SQL tables by default, SQLite or PostgreSQL).
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_names
from ._errors import (
    AssetInactiveError,
    InvalidKeyError,
    InvalidValueError,
    OffloadedValueMissingError,
    StateStoreError,
    ValueTooLargeError,
    ValueTypeError,
)
from ._scope import NEVER_EXPIRE, AssetScope, NeverExpire, Retention, Scope, TaskScope, WriterKind
from ._values import (
    MAX_KEY_LENGTH,
    EncodedValue,
    JsonInput,
    JsonValue,
    encode_value,
    validate_key,
)
from .backend import GcReport, StateBackend, StateEntry, StateWrite
from .settings import StateStoreSettings

if TYPE_CHECKING:
    from ._accessors import (
        AssetStore,
        TaskStore,
        default_backend,
        open_backend,
        set_default_backend,
    )
    from .metastore import MetastoreBackend
    from .offload import FileOffloadBackend

#: The SQL backends (SQLAlchemy), imported when first asked for: the configuration's
#: validation needs StateStoreSettings only.
__getattr__ = lazy_names(
    __name__,
    {
        "_accessors": (
            "AssetStore",
            "TaskStore",
            "default_backend",
            "open_backend",
            "set_default_backend",
        ),
        "metastore": ("MetastoreBackend",),
        "offload": ("FileOffloadBackend",),
    },
)

__all__ = [
    "MAX_KEY_LENGTH",
    "NEVER_EXPIRE",
    "AssetInactiveError",
    "AssetScope",
    "AssetStore",
    "EncodedValue",
    "FileOffloadBackend",
    "GcReport",
    "InvalidKeyError",
    "InvalidValueError",
    "JsonInput",
    "JsonValue",
    "MetastoreBackend",
    "NeverExpire",
    "OffloadedValueMissingError",
    "Retention",
    "Scope",
    "StateBackend",
    "StateEntry",
    "StateStoreError",
    "StateStoreSettings",
    "StateWrite",
    "TaskScope",
    "TaskStore",
    "ValueTooLargeError",
    "ValueTypeError",
    "WriterKind",
    "default_backend",
    "encode_value",
    "open_backend",
    "set_default_backend",
    "validate_key",
]
