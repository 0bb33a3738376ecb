"""Settings of the task store and the asset store (the YAML's top-level ``state:`` section)."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["StateStoreSettings"]


class StateStoreSettings(BaseModel):
    """How values are limited, kept and collected; the database URL lives in ``store.url``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_value_bytes: int = Field(
        default=65535,
        gt=0,
        description="Largest value kept in a row, in bytes of encoded JSON (UTF-8). A larger "
        "value is refused unless the backend offloads it.",
    )
    default_retention_days: float = Field(
        default=30,
        ge=0,
        description="Lifetime of a task-store key written without `retention`; 0 = never expires.",
    )
    clear_on_success: bool = Field(
        default=False,
        description="Clear a task instance's keys when the task is reported successful.",
    )
    cleanup_batch_size: int = Field(
        default=1000,
        gt=0,
        description="Rows removed per transaction by garbage collection.",
    )
    gc_interval: float = Field(
        default=3600.0,
        gt=0,
        description="Seconds between garbage collections in a long-running engine.",
    )
    offload_dir: str | None = Field(
        default=None,
        description="Directory where values over `offload_threshold_bytes` are written as "
        "files; the row keeps only a reference. Unset = no offloading.",
    )
    offload_threshold_bytes: int = Field(
        default=65535,
        gt=0,
        description="Values larger than this (encoded JSON bytes) are offloaded when "
        "`offload_dir` is set.",
    )
    orphan_grace_seconds: float = Field(
        default=3600.0,
        ge=0,
        description="Offloaded files no row references are removed by garbage collection once "
        "they are this old (a writer may be between writing the file and its row).",
    )
    backend: str | None = Field(
        default=None,
        description="Import path `module:Class` of a custom StateBackend, built with "
        "(url=..., settings=...). Unset = the metastore backend (or the file-offload "
        "backend when `offload_dir` is set).",
    )

    @model_validator(mode="after")
    def _threshold_within_limit(self) -> Self:
        if self.offload_dir is not None and self.offload_threshold_bytes > self.max_value_bytes:
            raise ValueError(
                f"offload_threshold_bytes ({self.offload_threshold_bytes}) is larger than "
                f"max_value_bytes ({self.max_value_bytes}): values in between would be refused "
                "instead of offloaded; lower offload_threshold_bytes"
            )
        return self
