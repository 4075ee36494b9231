"""InterceptorSettings: the one typed settings model of the interceptor process.

Validated before any I/O (unknown keys are errors, so a typo never silently
disables capture). Secrets come from the environment, never from flags.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from schemas.topics import TopicNames


class InterceptorSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    upstream_url: str = Field(description="OpenAI-compatible model server, e.g. http://127.0.0.1:8000")
    bootstrap: str = Field(description="Kafka bootstrap servers, host:port[,host:port]")
    host: str = "127.0.0.1"
    port: int = 8080
    topics: TopicNames = TopicNames()
    source: str = Field("", description="Writer identity on events; default interceptor@<host>:<pid>")
    control_token: SecretStr | None = Field(
        None, description="Bearer token for /rollouts/<id>/finish and admin routes (env TOKENTRAIL_CONTROL_TOKEN)"
    )
    sampling_overrides: dict[str, Any] = Field(
        default_factory=dict, description="Values that replace the harness's sampling parameters (temperature, top_p, ...)"
    )
    upstream_timeout_s: float = 600.0
    publish_timeout_ms: int = Field(30_000, description="How long a capture may wait for Kafka before it counts as failed")
    linger_ms: float = 1.0

    @field_validator("upstream_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"upstream_url must be an http(s) URL, got {value!r} (e.g. http://127.0.0.1:8000)")
        return value.rstrip("/")

    @field_validator("bootstrap")
    @classmethod
    def _bootstrap(cls, value: str) -> str:
        if not value or any(":" not in part for part in value.split(",")):
            raise ValueError(f"bootstrap must be host:port[,host:port], got {value!r}")
        return value

    @field_validator("sampling_overrides")
    @classmethod
    def _known_sampling_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = set(value) - SAMPLING_KEYS
        if unknown:
            raise ValueError(
                f"unknown sampling override(s) {sorted(unknown)}; allowed: {sorted(SAMPLING_KEYS)}"
            )
        return value


SAMPLING_KEYS = frozenset(
    {
        "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
        "repetition_penalty", "seed", "max_tokens",
    }
)
