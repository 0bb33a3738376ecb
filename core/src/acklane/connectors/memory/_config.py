"""The ``connector: memory`` stream block."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from acklane.core.pipeline.poison import DEFAULT_MAX_ATTEMPTS, MaxAttempts

__all__ = ["MemoryConfig"]


class MemoryConfig(BaseModel):
    """The ``connector: memory`` stream block."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    broker: str = Field(default="default", min_length=1)
    topics: list[str] = Field(min_length=1)
    group_id: str = Field(default="acklane", min_length=1)
    partitions: int = Field(default=3, ge=1, le=10_000)
    dlq_topic: str | None = Field(default=None, min_length=1)
    batch_size: int = Field(default=256, ge=1, le=1_000_000)
    poll_interval: float = Field(default=1.0, gt=0)
    #: Failed attempts (a filter raised, an ack timeout) after which a redelivered
    #: message is dead-lettered instead of given to the watchers again.
    max_attempts: MaxAttempts = DEFAULT_MAX_ATTEMPTS

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
    def _dlq_is_elsewhere(self) -> MemoryConfig:
        if self.dlq_topic is not None and self.dlq_topic in self.topics:
            raise ValueError(
                f"dlq_topic {self.dlq_topic!r} is also consumed (topics); dead-lettered "
                "messages would come straight back"
            )
        return self
