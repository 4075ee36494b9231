"""InterceptorSettings: the one typed settings model of the interceptor process.

Validated before any I/O (unknown keys are errors, so a typo never silently
disables capture). Secrets come from the environment, never from flags.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    SecretStr,
    WithJsonSchema,
    field_validator,
)

from schemas.errors import ConfigError
from schemas.kafka.security import KafkaSecurity, kafka_security_of
from schemas.kafka.topics import TopicNames, check_bootstrap
from schemas.rollout_tokens import check_secret

Bootstrap = Annotated[str, AfterValidator(check_bootstrap)]
# The process's Kafka security (schemas.kafka.security): a client config file path, parsed once, validated here.
KafkaClient = Annotated[KafkaSecurity, PlainValidator(kafka_security_of), PlainSerializer(KafkaSecurity.describe),
                        WithJsonSchema({"type": "string", "description": "client config file (--kafka-config)"})]


class InterceptorSettings(BaseModel):
    # hide_input_in_errors: a refused secret (rollout_secret too short) is never echoed into a log.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    upstream_url: str = Field(description="OpenAI-compatible model server, e.g. http://127.0.0.1:8000")
    bootstrap: Bootstrap = Field(description="Kafka bootstrap servers, host:port[,host:port]")
    kafka: KafkaClient = Field(KafkaSecurity(), description="TLS / SASL of every Kafka client of the process: "
                               "--kafka-config FILE or env TOKENTRAIL_KAFKA_CONFIG (schemas.kafka.security)")
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
    engine_timeout_s: float = Field(
        1800.0, description="Longest an engine call may take, streaming or not (a 32k-token generation at ~20 "
                            "tokens/s takes 1600 s); then CallIncomplete(engine_timeout), a 504 or an error event"
    )
    stream_idle_timeout_s: float = Field(
        300.0, description="Longest silence of an engine stream: before its first chunk (prefill of a long prompt "
                           "on a busy engine) and between two chunks; then CallIncomplete(engine_timeout)"
    )
    publish_timeout_ms: int = Field(
        5_000, description="How long an event may wait for Kafka's ack before it goes to the spool instead"
    )
    linger_ms: float = Field(0.0, description="librdkafka linger: 0 sends each capture at once (latency first)")
    spool_dir: Path | None = Field(
        None, description="Local fsynced spool for when Kafka is down (one directory per process); None: 503 instead"
    )
    delta_records: bool = Field(True, description="Store only the prompt suffix after a verified parent")
    prefix_supply: bool = Field(
        False, description="Send the verified parent's exact ids as the prompt prefix (vLLM kv_transfer_params."
                           "prompt_token_ids); checked against the engine at startup"
    )
    upstream_model: str | None = Field(
        None, description="Model name always sent to the engine; by default the engine's served model replaces a "
                          "name it does not serve (the harness's requested name is kept as a fact)"
    )
    upstream_api_key: SecretStr | None = Field(
        None, description="The engine's only credential, sent as 'Authorization: Bearer <key>' (env "
                          "TOKENTRAIL_UPSTREAM_API_KEY, vLLM --api-key); a harness's own key is never forwarded"
    )
    logprobs_mode: str = Field(
        "raw_logprobs", description="What the engine's logprob values mean (vLLM --logprobs-mode), recorded on "
                                    "every call: raw_logprobs (vLLM's default) or processed_logprobs"
    )
    rollout_secret: SecretStr | None = Field(
        None, description="With it, every request under /ng-rollout/<id>/ must present that rollout's token "
                          "(schemas.rollout_tokens.rollout_token; `tokentrail token <id>`) as its API key (Bearer or "
                          "x-api-key), else a 401; without it any caller may act for any rollout (trusted network). "
                          "env TOKENTRAIL_ROLLOUT_SECRET or --rollout-secret-file"
    )
    max_body_bytes: int = Field(
        16 * 1024 * 1024, gt=0,
        description="Largest request body accepted (a 413 above it, nothing recorded or forwarded): 16 MiB, "
                    "about 16x the JSON of a full 128k-token text context, with room for a few images"
    )
    forward_unknown_routes: bool = Field(
        False, description="Forward routes the route table does not list, on bare paths only (a trusted engine); "
                           "under /ng-rollout/ the table always holds (producers.http.route_policy)"
    )
    abort_policy: Literal["mask", "continue"] = Field(
        "mask", description="A generation the engine aborts (paused for a weight update, /pause?mode=abort): "
                            "'mask' records it aborted and tells the harness to retry (the rollout masks "
                            "aborted_by_update unless the retry is captured); 'continue' resubmits the prompt plus "
                            "the partial generation as prompt ids once the engine takes requests again and "
                            "answers the harness once, token-exact (producers.engine.continuation)"
    )
    follow_versions: bool = Field(
        False, description="Follow the policy-versions topic (the trainer's announcements) for the version each "
                           "token is recorded under; `tokentrail intercept` and the vLLM middleware turn it on "
                           "(--no-follow-versions, TOKENTRAIL_FOLLOW_VERSIONS=0 turn it off)"
    )
    max_continuations: int = Field(8, ge=1, description="Aborts one call may be continued across (abort_policy "
                                                        "continue); one more aborts it as under 'mask'")
    index_max_rollouts: int = Field(65_536, ge=1, description="Rollouts the lineage index keeps; the oldest is "
                                                            "evicted first (a later call of it is unresolved, and "
                                                            "the processor still verifies its parent)")
    index_max_tokens: int = Field(16_000_000, description="Token budget of the lineage index (prefix supply only)")
    finished_max_rollouts: int = Field(
        65_536, ge=1, description="Rollouts whose finish this interceptor acknowledged that it remembers (about 230 "
                                  "bytes each), to answer 409 to their further calls and to a conflicting finish "
                                  "(producers.http.finished); the oldest is forgotten first"
    )

    @field_validator("upstream_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"upstream_url must be an http(s) URL, got {value!r} (e.g. http://127.0.0.1:8000)")
        return value.rstrip("/")

    @field_validator("engine_timeout_s", "stream_idle_timeout_s")
    @classmethod
    def _positive_seconds(cls, value: float, info: Any) -> float:
        if not 0 < value < float("inf"):
            raise ValueError(f"{info.field_name}={value!r} must be a positive, finite number of seconds (defaults: "
                             "engine_timeout_s 1800, stream_idle_timeout_s 300)")
        return value

    @field_validator("rollout_secret")
    @classmethod
    def _long_enough_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            try:
                check_secret(value.get_secret_value())
            except ConfigError as exc:  # the value is not echoed: it is a secret
                raise ValueError(f"rollout_secret: {exc}") from None
        return value

    @field_validator("logprobs_mode")
    @classmethod
    def _logprobs_not_logits(cls, value: str) -> str:
        if value in LOGIT_MODES:
            raise ValueError(
                f"logprobs_mode={value!r}: in that mode vLLM puts logits, not log-probabilities, in the logprob "
                "field, and a trainer cannot use them as the sampling policy's log-probs; serve with vLLM "
                "--logprobs-mode raw_logprobs (the default) or processed_logprobs and declare the same here")
        if value not in LOGPROB_MODES:
            raise ValueError(f"logprobs_mode={value!r} is not a vLLM --logprobs-mode; allowed: "
                             f"{', '.join(LOGPROB_MODES)}")
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


# vLLM --logprobs-mode values (vllm/config/model.py): the *_logprobs ones are log-probabilities
# (raw: before temperature/top-p/top-k, processed: after); the *_logits ones are not.
LOGPROB_MODES = ("raw_logprobs", "processed_logprobs")
LOGIT_MODES = ("raw_logits", "processed_logits")

SAMPLING_KEYS = frozenset(
    {
        "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
        "repetition_penalty", "seed", "max_tokens",
    }
)
