"""ConsumerSettings: the one typed settings model of the rebuild consumer, validated before any I/O."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from schemas.topics import TopicNames


class ConsumerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    bootstrap: str
    group_id: str = "tokentrail-consumer"
    topics: TopicNames = TopicNames()
    sink: str = Field("jsonl", description="'jsonl' or module:Class of a TrainerSink")
    sink_kwargs: dict[str, Any] = Field(default_factory=dict)
    project_response: bool = Field(True, description="Also build NeMo RL's response.output projection")
    retire: bool = Field(True, description="Publish RetireRequested after durable delivery")
    poll_timeout_s: float = 0.5
    session_timeout_ms: int = 10_000

    @field_validator("bootstrap")
    @classmethod
    def _bootstrap(cls, value: str) -> str:
        if not value or any(":" not in part for part in value.split(",")):
            raise ValueError(f"bootstrap must be host:port[,host:port], got {value!r}")
        return value
