"""The ``connector: memory`` stream block."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pydantic import Field, field_validator, model_validator

from acklane.core.connectors import StreamSettings

__all__ = ["MemoryConfig"]


class MemoryConfig(StreamSettings):
    """The ``connector: memory`` stream block.

    ``dead_letter`` is a topic of the same broker; ``max_attempts`` as on every broker.
    """

    renamed: ClassVar[Mapping[str, str]] = {"dlq_topic": "dead_letter"}

    broker: str = Field(default="default", min_length=1)
    topics: list[str] = Field(min_length=1)
    group_id: str = Field(default="acklane", min_length=1)
    partitions: int = Field(default=3, ge=1, le=10_000)
    batch_size: int = Field(default=256, ge=1, le=1_000_000)
    poll_interval: float = Field(default=1.0, gt=0)

    @field_validator("topics")
    @classmethod
    def _topics_named(cls, topics: list[str]) -> list[str]:
        for topic in topics:
            if not topic:
                raise ValueError("topic names must not be empty")
        duplicates = sorted({t for t in topics if topics.count(t) > 1})
        if duplicates:
            raise ValueError(f"topics listed twice: {', '.join(duplicates)}")
        return topics

    @model_validator(mode="after")
    def _dead_letter_is_elsewhere(self) -> MemoryConfig:
        if self.dead_letter is not None and self.dead_letter in self.topics:
            raise ValueError(
                f"dead_letter {self.dead_letter!r} is also consumed (topics); dead-lettered "
                "messages would come straight back"
            )
        return self
