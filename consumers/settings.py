"""ConsumerSettings: the one typed settings model of the rebuild consumer, validated before any I/O."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from consumers.rebuild.rules import RebuildRules
from schemas.errors import ConfigError
from schemas.kafka.config import DEFAULT_FETCH_WAIT_MS
from schemas.kafka.security import KafkaSecurity, kafka_security_of
from schemas.kafka.topics import DEFAULT_TOPIC_WAIT_S, TopicNames, check_bootstrap

Bootstrap = Annotated[str, AfterValidator(check_bootstrap)]
# The process's Kafka security (schemas.kafka.security): a client config file path, parsed once, validated here.
KafkaClient = Annotated[KafkaSecurity, PlainValidator(kafka_security_of), PlainSerializer(KafkaSecurity.describe),
                        WithJsonSchema({"type": "string", "description": "client config file (--kafka-config)"})]


class ConsumerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    bootstrap: Bootstrap
    kafka: KafkaClient = Field(KafkaSecurity(), description="TLS / SASL of every Kafka client of the process: "
                               "--kafka-config FILE or env TOKENTRAIL_KAFKA_CONFIG (schemas.kafka.security)")
    group_id: str = "tokentrail-consumer"
    topics: TopicNames = TopicNames()
    sink: str = Field("jsonl", description="'jsonl', 'kafka' or module:Class of a TrainerSink")
    sink_kwargs: dict[str, Any] = Field(default_factory=dict)
    project_response: bool = Field(True, description="Also build NeMo RL's response.output projection")
    rules: dict[str, Any] = Field(default_factory=dict, description="RebuildRules fields (see consumers.rebuild.rules)")
    retire: bool = Field(True, description="Publish RetireRequested after durable delivery")
    max_mask_fraction: float | None = Field(None, ge=0.0, le=1.0,
                                            description="Stop when more than this fraction of rebuilt rollouts is masked")
    mask_fraction_min_samples: int = Field(50, ge=1, description="Rollouts rebuilt before max_mask_fraction applies")
    max_in_flight: int | None = Field(None, ge=1, description="Deliveries pending at once (default: the sink's own)")
    shutdown_grace_s: float = Field(10.0, ge=0.0, description="How long stop waits for pending deliveries")
    poll_timeout_s: float = 0.5
    fetch_wait_ms: int = Field(DEFAULT_FETCH_WAIT_MS, ge=1, description="Longest fetch long-poll at the broker: "
                               "bounds how late a snapshot of a partition left out of the fetch in flight is read")
    session_timeout_ms: int = 10_000
    topic_wait_s: float = Field(DEFAULT_TOPIC_WAIT_S, ge=0.0, description="How long startup waits for the broker "
                                "and for the topics the consumer reads and writes to exist before it gives up")
    max_staleness: int | None = Field(None, ge=0, description="Mask (or drop, stale_action) a rollout whose oldest "
                                      "generated token is more than this many policy versions behind the current one "
                                      "(consumers.rebuild.staleness); needs the policy-versions topic")
    stale_action: Literal["mask", "drop"] = Field("mask", description="What max_staleness does to a stale rollout: "
                                                  "'mask' (delivered masked stale_policy) or 'drop' (not delivered; "
                                                  "retired and committed like a delivered one)")
    metrics_port: int | None = Field(None, ge=0, le=65535, description="Serve Prometheus /metrics on this port "
                                     "(0: a free one; None: no endpoint)")
    metrics_host: str = "127.0.0.1"

    @model_validator(mode="after")
    def _stale_action_needs_a_bound(self) -> ConsumerSettings:
        if self.stale_action == "drop" and self.max_staleness is None:
            raise ValueError("stale_action='drop' needs max_staleness (the bound a rollout is dropped beyond): "
                             "set max_staleness, or leave stale_action at 'mask'")
        return self

    @field_validator("rules")
    @classmethod
    def _rules(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            RebuildRules.from_mapping({k: v for k, v in value.items() if k != "project_response"})
        except (ConfigError, TypeError) as exc:
            raise ValueError(str(exc)) from exc
        return value

    def rebuild_rules(self) -> RebuildRules:
        """The rebuild rules these settings name (``project_response`` from its own field)."""
        return RebuildRules.from_mapping({**self.rules, "project_response": self.project_response})
