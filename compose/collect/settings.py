"""CollectSettings: the one typed settings model of ``tokentrail collect``, validated before any I/O.

Every option of the command is a field here (the CLI only parses); a combination that
cannot work (``--harness remote`` without ``--agent-url``, stack addresses missing without
``--local``) is refused here, before a broker is started or a harness is run.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from consumers.settings import KafkaClient
from schemas.kafka.security import KafkaSecurity
from schemas.kafka.topics import check_bootstrap

__all__ = ["CollectSettings", "HARNESSES", "RUN_ID_RULE", "DEFAULT_MODELS"]

HARNESSES = ("claude-code", "codex", "gemini-cli", "openai-sdk", "anthropic-sdk", "remote")
Harness = Literal["claude-code", "codex", "gemini-cli", "openai-sdk", "anthropic-sdk", "remote"]
# A run id prefixes every rollout id of the run (``<run>.<task>-<sample>``): the rollout-id
# alphabet, short enough that the longest task id (64) still fits the 200-character rule.
RUN_ID_RULE = "^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$"
_RUN_ID = re.compile(RUN_ID_RULE)

#: The model name each harness asks for unless --model says otherwise: what its wire format
#: expects. The engine behind the interceptor serves its own name; the interceptor's
#: --served-model rewrite (or the engine's aliases) decide what reaches it.
DEFAULT_MODELS: dict[str, str | None] = {
    "claude-code": None,  # the CLI's own default model name
    "codex": "tokentrail-policy",
    "gemini-cli": "tokentrail-policy",
    "openai-sdk": "tokentrail-policy",
    "anthropic-sdk": "claude-opus-5-5",
    "remote": "tokentrail-policy",
}


def _run_id(value: str | None) -> str | None:
    if value is not None and not _RUN_ID.fullmatch(value):
        raise ValueError(f"run_id {value!r} must match {RUN_ID_RULE} (letters, digits, '_' or '-', at most 40; "
                         "no '.', which separates the run from the task in rollout ids): e.g. 'run7'")
    return value


def _bootstrap(value: str | None) -> str | None:
    return None if value is None else check_bootstrap(value)


class CollectSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tasks: Path = Field(description="JSONL task file: id, prompt, answer (or NeMo Gym rows)")
    harness: Harness
    out: Path = Field(description="results JSONL; its journal, failures and trajectories live beside it")
    samples: int = Field(1, ge=1, le=1000, description="rollouts per task (one GRPO group per task)")
    concurrency: int = Field(4, ge=1, le=256, description="rollouts running at once")
    limit: int | None = Field(None, ge=1, description="only the first N tasks of the file")
    run_id: Annotated[str | None, AfterValidator(_run_id)] = None
    max_attempts: int = Field(3, ge=1, le=100, description="attempts per rollout, counted over re-runs")
    # where the stack is
    local: bool = Field(False, description="bring a local stack up for the run (broker, engine, pipeline)")
    engine: Literal["reference", "vllm"] = Field("reference", description="--local: the engine behind the interceptor")
    bootstrap: Annotated[str | None, AfterValidator(_bootstrap)] = None
    # Parsed and checked here, before any I/O (schemas.kafka.security); the collector's own clients and
    # every process --local starts get it.
    kafka: KafkaClient = Field(KafkaSecurity(), description="TLS / SASL of every Kafka client of the run: "
                               "--kafka-config FILE or env TOKENTRAIL_KAFKA_CONFIG (schemas.kafka.security)")
    interceptor_url: str | None = Field(None, description="the interceptor's base URL (http://host:port)")
    topic_prefix: str = ""
    rollout_secret: str | None = Field(None, repr=False, description="the interceptor's TOKENTRAIL_ROLLOUT_SECRET")
    wait_records: bool = Field(True, description="wait for each rebuilt record on the rebuilt topic")
    # the harness
    model: str | None = None
    agent_url: str | None = Field(None, description="--harness remote: the agent service's base URL")
    max_steps: int = Field(16, ge=1, le=1000, description="remote: agent-service steps; SDK harnesses: model turns")
    max_turns: int = Field(10, ge=1, le=1000,
                           description="claude-code: --max-turns; gemini-cli: model.maxSessionTurns (model calls)")
    allowed_tools: tuple[str, ...] = Field(("Bash",), description="claude-code: --allowedTools rules")
    system_prompt: str | None = Field(None, description="openai-sdk / anthropic-sdk: the system message")
    # deadlines
    call_timeout_s: float = Field(300.0, gt=0, description="one model call (or one agent-service request)")
    rollout_timeout_s: float = Field(900.0, gt=0, description="one whole attempt, harness start to final answer")
    record_timeout_s: float = Field(180.0, gt=0, description="finish to rebuilt record")
    keep_workdirs: bool = Field(False, description="keep each attempt's working directory")
    progress: bool = Field(True, description="show a progress bar on stderr")

    @model_validator(mode="after")
    def _combination(self) -> CollectSettings:
        if self.harness == "remote" and not self.agent_url:
            raise ValueError("harness 'remote' needs agent_url (--agent-url http://host:port of a service "
                             "speaking POST /v1/responses)")
        if self.harness != "remote" and self.agent_url:
            raise ValueError(f"agent_url is only for --harness remote (harness is {self.harness!r})")
        if not self.local:
            missing = [name for name in ("bootstrap", "interceptor_url") if getattr(self, name) is None]
            if missing:
                raise ValueError(f"{' and '.join(missing)} missing: give the stack's addresses (--bootstrap, "
                                 "--interceptor-url) or pass --local to bring a local stack up for the run")
        elif self.interceptor_url is not None:
            raise ValueError("--local starts its own interceptor: drop --interceptor-url (a --bootstrap is used "
                             "as the broker instead of starting one)")
        elif self.bootstrap is None and self.kafka.secured:
            raise ValueError(f"kafka ({self.kafka.source or 'the client config file'}: {self.kafka.describe()}) "
                             "with --local but no --bootstrap: the broker --local starts is PLAINTEXT; give the "
                             "secured broker's --bootstrap, or drop --kafka-config")
        if self.engine != "reference" and not self.local:
            raise ValueError("engine is a --local option: without --local the interceptor's upstream is the engine")
        return self

    @property
    def harness_model(self) -> str | None:
        return self.model if self.model is not None else DEFAULT_MODELS[self.harness]

    # -- the files of a run, beside --out ---------------------------------------------
    def _beside(self, suffix: str) -> Path:
        return self.out.with_name(self.out.stem + suffix)

    @property
    def journal_path(self) -> Path:
        return self._beside(".journal.jsonl")

    @property
    def failures_path(self) -> Path:
        return self._beside(".failures.jsonl")

    @property
    def trajectories_dir(self) -> Path:
        return self._beside(".trajectories")

    @property
    def work_dir(self) -> Path:
        return self._beside(".work")
