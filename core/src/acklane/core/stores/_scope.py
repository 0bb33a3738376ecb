"""Scopes (what a key belongs to), the retention sentinel and the writer kinds."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import timedelta
from typing import Final, Literal, TypeAlias

__all__ = [
    "MAX_ASSET_LENGTH",
    "MAX_ID_LENGTH",
    "NEVER_EXPIRE",
    "AssetScope",
    "NeverExpire",
    "Retention",
    "Scope",
    "TaskScope",
    "WriterKind",
]

MAX_ID_LENGTH = 250
MAX_ASSET_LENGTH = 1500

WriterKind: TypeAlias = Literal["task", "watcher", "api"]
WRITER_KINDS: Final = ("task", "watcher", "api")


class NeverExpire(enum.Enum):
    """Type of :data:`NEVER_EXPIRE`."""

    NEVER_EXPIRE = "NEVER_EXPIRE"

    def __repr__(self) -> str:
        return "NEVER_EXPIRE"


NEVER_EXPIRE: Final = NeverExpire.NEVER_EXPIRE
"""Pass as ``retention=`` to keep a task-store key until it is deleted or cleared."""

Retention: TypeAlias = timedelta | Literal[NeverExpire.NEVER_EXPIRE] | None


def _check_text(field: str, value: object, limit: int) -> None:
    if type(value) is not str:
        raise TypeError(f"{field} must be a str, got {type(value).__name__}: {value!r}")
    if not value:
        raise ValueError(f"{field} must not be empty")
    if len(value) > limit:
        raise ValueError(f"{field} {value[:40]!r}... is {len(value)} characters; at most {limit}")
    if "\x00" in value:
        raise ValueError(f"{field} {value!r} contains a NUL character")


@dataclass(frozen=True, slots=True)
class TaskScope:
    """One task instance. Every attempt (retry) of the instance shares this scope."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1

    def __post_init__(self) -> None:
        _check_text("dag_id", self.dag_id, MAX_ID_LENGTH)
        _check_text("run_id", self.run_id, MAX_ID_LENGTH)
        _check_text("task_id", self.task_id, MAX_ID_LENGTH)
        if type(self.map_index) is not int:
            raise TypeError(f"map_index must be an int, got {type(self.map_index).__name__}")
        if self.map_index < -1:
            raise ValueError(f"map_index must be -1 (unmapped) or >= 0, got {self.map_index}")

    @classmethod
    def parse(cls, text: str) -> TaskScope:
        """Parse ``DAG/RUN/TASK`` or ``DAG/RUN/TASK/MAP`` (the CLI's ``--task``)."""
        parts = text.split("/")
        if len(parts) == 3:
            return cls(parts[0], parts[1], parts[2])
        if len(parts) == 4:
            dag_id, run_id, task_id, map_text = parts
            try:
                map_index = int(map_text)
            except ValueError:
                raise ValueError(
                    f"task scope {text!r}: MAP must be an integer, got {map_text!r}"
                ) from None
            return cls(dag_id, run_id, task_id, map_index)
        raise ValueError(
            f"task scope {text!r}: expected DAG/RUN/TASK or DAG/RUN/TASK/MAP "
            "(ids containing '/' cannot be named this way)"
        )

    def __str__(self) -> str:
        base = f"{self.dag_id}/{self.run_id}/{self.task_id}"
        return base if self.map_index == -1 else f"{base}/{self.map_index}"


@dataclass(frozen=True, slots=True)
class AssetScope:
    """One asset, named by its name or, when it has none, by its URI."""

    asset: str

    def __post_init__(self) -> None:
        _check_text("asset", self.asset, MAX_ASSET_LENGTH)

    def __str__(self) -> str:
        return self.asset


Scope: TypeAlias = TaskScope | AssetScope
