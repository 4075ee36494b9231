"""Settings of the reference policy server, validated before anything is served.

Guarantees: unknown settings are refused (``extra="forbid"``), every value is checked
against its range here, and a settings object is immutable once built (the weight
version the server starts with is copied into mutable server state; the admin route
changes that state, never the settings).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Fault = Literal["5xx", "no_token_ids", "stall", "drift"]
FAULTS: tuple[str, ...] = ("5xx", "no_token_ids", "stall", "drift")


class PolicySettings(BaseModel):
    """Everything ``create_app`` and ``tokentrail policy`` accept."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535, description="0 picks a free port")
    served_model_name: str = Field("tokentrail-policy", min_length=1)
    strict_model: bool = Field(False, description="refuse unknown model names with 404")

    reasoning: bool = Field(False, description="emit <think>...</think> before the output")
    honour_prefix: bool = Field(
        False, description="honour the request field required_prefix_token_ids"
    )
    drop_reasoning_in_history: bool = Field(
        False, description="template ignores reasoning in echoed assistant turns (drift)"
    )
    weight_version: int = Field(0, ge=0, lt=2**31)
    seed: int = Field(0, ge=0, lt=2**32, description="seeds the log-prob table")

    faults: frozenset[Fault] = Field(
        frozenset(), description="server-wide faults: 5xx, no_token_ids, stall, drift"
    )
    stall_seconds: float | None = Field(
        None, gt=0, description="a stalled stream aborts after this; None hangs until disconnect"
    )
    stall_after_chunks: int = Field(3, ge=0, description="chunks a stalled stream still sends")

    decode_ms_per_token: float = Field(
        0.0, ge=0, le=1000,
        description="emulated GPU decode time per generated token (awaited, not computed): gives benchmarks "
                    "the request durations of a real engine instead of a CPU table lookup",
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
