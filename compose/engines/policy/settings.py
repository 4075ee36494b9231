"""Settings of the reference policy server, validated before anything is served.

Guarantees: unknown settings are refused (``extra="forbid"``), every value is checked
against its range here, and a settings object is immutable once built (the weight
version the server starts with is copied into mutable server state; the weight routes
change that state, never the settings).

Defaults follow a vLLM 0.34 server (``vllm_release``; 0.33 answers as 0.33 and the 0.32 CPU
build do, for the live contract test) started as ``vllm serve M --served-model-name NAME
--enable-auto-tool-choice --tool-call-parser hermes`` with ``VLLM_SERVER_DEV_MODE=1``
(``--reasoning`` adds ``--reasoning-parser qwen3``): unknown model names are refused
with 404, weight versions are opaque labels that start at ``"default"``, and the
dev-mode routes (``/pause``, ``/resume``, ``/update_weight_version``, ...) exist.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Fault = Literal["5xx", "no_token_ids", "stall", "drift", "repetition"]
Release = Literal["0.33", "0.34"]
RELEASES: tuple[str, ...] = ("0.33", "0.34")
FAULTS: tuple[str, ...] = ("5xx", "no_token_ids", "stall", "drift", "repetition")
DEFAULT_WEIGHT_VERSION = "default"  # vLLM's engine label before a trainer names one (vllm/v1/engine/core.py)


class PolicySettings(BaseModel):
    """Everything ``create_app`` and ``tokentrail policy`` accept."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535, description="0 picks a free port")
    served_model_name: str = Field("tokentrail-policy", min_length=1)
    strict_model: bool = Field(
        True, description="refuse unknown model names with vLLM's 404 (False: answer any name, unlike vLLM)"
    )

    reasoning: bool = Field(
        False, description="run as with a reasoning parser: emit <think>...</think> first by default, "
                           "report completion_tokens_details.reasoning_tokens"
    )
    honour_prefix: bool = Field(
        False, description="DEPRECATED, ignored: vLLM has no required_prefix_token_ids; supply prompt ids "
                           "with kv_transfer_params.prompt_token_ids instead"
    )
    drop_reasoning_in_history: bool = Field(
        False, description="template ignores reasoning in echoed assistant turns (drift)"
    )
    weight_version: str = Field(
        DEFAULT_WEIGHT_VERSION, min_length=1, max_length=256,
        description="the weight version label the server starts with (an integer is taken as its decimal label)",
    )
    vllm_release: Release = Field(
        "0.34", description="whose shapes and rules: 0.34 (the production target: message.annotations and "
                            "usage.prompt_tokens_details left out when None, tools: [] taken as no tools, the "
                            "render route's parse_context) or 0.33 (as 0.33 and the 0.32 CPU build answer)"
    )
    sleep_mode: bool = Field(
        False, description="as vLLM 0.34 with --enable-sleep-mode: serve /checkpoint/prepare?mode=, "
                           "/checkpoint/restore and /checkpoint/status"
    )
    dev_mode: bool = Field(
        True, description="serve vLLM's VLLM_SERVER_DEV_MODE routes: /pause, /resume, /is_paused, "
                          "/update_weight_version, /weight_info"
    )
    forced_tool_format: Literal["json", "markup"] = Field(
        "json", description="what a forced tool_choice (required or named) makes the model emit: vLLM's "
                            "grammar-constrained JSON (0.33), or the native <tool_call> markup (hermes under "
                            "VLLM_ENFORCE_STRICT_TOOL_CALLING structural tags)"
    )
    seed: int = Field(0, ge=0, lt=2**32, description="seeds the log-prob table")
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits"] = Field(
        "raw_logprobs", description="vLLM's --logprobs-mode: what the reported logprob values are (the *_logits "
                                    "modes put logits there; processed_* are after temperature, top-k, top-p)"
    )

    faults: frozenset[Fault] = Field(
        frozenset(), description="server-wide faults: 5xx, no_token_ids, stall, drift, repetition"
    )
    stall_seconds: float | None = Field(
        None, gt=0, description="a stalled stream aborts after this; None hangs until disconnect"
    )
    stall_after_chunks: int = Field(3, ge=0, description="chunks a stalled stream still sends")

    decode_ms_per_token: float = Field(
        0.0, ge=0, le=1000,
        description="emulated GPU decode time per generated token (awaited, not computed): gives benchmarks "
                    "the request durations of a real engine, and /pause something in flight to abort",
    )
    default_tool_calls: int = Field(2, ge=0, description="K when no #tool-calls=K directive")
    max_model_len: int = Field(32768, ge=16)
    max_logprobs: int = Field(20, ge=0, le=20)

    table_rows: int = Field(1024, ge=1, le=65536, description="rows of the log-prob table")
    logit_scale: float = Field(2.5, gt=0, le=50, description="spread of the table's logits")
    vocab_words: int | None = Field(
        None, ge=50, description="use only the first N words of the built-in word list"
    )

    @field_validator("host")
    @classmethod
    def _host_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("host must not be blank")
        return value

    @model_validator(mode="after")
    def _checkpoint_routes_are_0_34(self) -> PolicySettings:
        if self.sleep_mode and self.vllm_release == "0.33":
            raise ValueError("sleep_mode: the /checkpoint routes are new in vLLM 0.34; use vllm_release 0.34")
        return self

    @field_validator("weight_version", mode="before")
    @classmethod
    def _integer_is_its_label(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 0:
                raise ValueError("an integer weight version must be non-negative")
            return str(value)
        return value
