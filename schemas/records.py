"""Record types of the wire contract, mirroring the ``.avsc`` files in ``schemas/avro``.

Records are frozen dataclasses whose field names equal the Avro field names (a
test checks that they stay equal). Invariants that span fields are checked at
construction, so an invalid record cannot be built, encoded or folded:

- one log-prob per generated token;
- RESOLVED has a parent id, ROOT and UNRESOLVED have none;
- a delta prompt is relative to a RESOLVED parent;
- ``cum_len`` covers at least the arrays the record carries.

Version constants: a reader refuses a record whose ``schema_version`` is newer
than it supports (``schemas.codec``). Additive optional fields do not bump the
version; a changed meaning does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from schemas.errors import ContractError

EVENT_SCHEMA_VERSION = 1
SNAPSHOT_SCHEMA_VERSION = 1
REBUILT_SCHEMA_VERSION = 1

_FROZEN = dict(frozen=True, slots=True, kw_only=True)


class ParentResolution(StrEnum):
    ROOT = "ROOT"
    RESOLVED = "RESOLVED"
    UNRESOLVED = "UNRESOLVED"


class Dialect(StrEnum):
    CHAT_COMPLETIONS = "CHAT_COMPLETIONS"
    ANTHROPIC_MESSAGES = "ANTHROPIC_MESSAGES"
    RESPONSES = "RESPONSES"
    UNKNOWN = "UNKNOWN"
    # Appended after UNKNOWN (the Avro symbol order is the wire index): Gemini's generateContent.
    GOOGLE_GENERATE_CONTENT = "GOOGLE_GENERATE_CONTENT"


class IncompleteReason(StrEnum):
    """Every reason a ``CallIncomplete`` marker carries: the one home of those codes.

    Each member says who emits it. The wire field ``CallIncomplete.reason`` stays a plain
    string, so a reader accepts a reason it does not know (one from a newer writer, or a
    retired one); values are wire strings and never change.
    """

    # --- producers (the capture interceptor) ---
    UPSTREAM_ERROR = "upstream_error"
    MISSING_TOKEN_IDS = "missing_token_ids"
    PARTIAL_TOKEN_METADATA = "partial_token_metadata"
    UNKNOWN_ROUTE = "unknown_route"
    # A generating call this build cannot capture (producers.http.app): forwarded uncaptured and
    # the rollout marked incomplete (fail closed).
    CAPTURE_UNSUPPORTED = "capture_unsupported"
    STREAM_INTERRUPTED = "stream_interrupted"
    CAPTURE_EXCEPTION = "capture_exception"
    PREFIX_NOT_APPLIED = "prefix_not_applied"
    # The engine refused the request (HTTP 4xx: context too long, unknown model, ...); detail
    # carries its message, so the mask reason says why.
    ENGINE_REJECTED = "engine_rejected"
    # The engine aborted the generation (vLLM finish_reason "abort": a pause for a weight
    # sync, /abort_requests); the harness was told to retry.
    ABORTED = "aborted"
    # The engine answered, but its answer cannot be expressed in the harness's dialect
    # (e.g. tool arguments that are not a JSON object for Anthropic); the harness got a 502.
    UNTRANSLATABLE_OUTPUT = "untranslatable_output"
    # The engine did not answer within engine_timeout_s, or its stream was silent for
    # stream_idle_timeout_s (producers.call.dispatch); detail names which and how long.
    ENGINE_TIMEOUT = "engine_timeout"
    # The harness went away before its stream's terminal event (producers.call.stream): the
    # engine stream was closed and the generation is not captured; detail says what it got.
    CLIENT_DISCONNECTED = "client_disconnected"

    # --- processors (fold and snapshot assembly): markers a snapshot carries, never on rollout-events ---
    # Two CallCaptured records with one model_call_id and different payloads (processors.fold).
    CONFLICTING_PAYLOAD = "conflicting_payload"
    # A CallStarted intent with no capture when the rollout froze (processors.snapshot, derived).
    INTENT_WITHOUT_CAPTURE = "intent_without_capture"
    # The assembled snapshot exceeds the snapshots topic's message size; its calls are left out.
    SNAPSHOT_TOO_LARGE = "snapshot_too_large"
    # An event keyed to this rollout was dead-lettered (undecodable or invalid; detail says why):
    # its evidence (a call, a marker, a finish) is lost, so the rollout cannot be trusted (processors.fold).
    INVALID_EVENT = "invalid_event"

    # --- consumers (the NeMo Gym adapters) ---
    # A call the gym harness marked incomplete itself (consumers.gym.adapters mark_incomplete).
    MARKED_INCOMPLETE = "marked_incomplete"


class MaskCode(StrEnum):
    """Every ``MaskReason.code`` a rebuilt rollout can carry: the one home of those codes.

    The wire field ``MaskReason.code`` is a plain string (readers accept unknown codes);
    values are wire strings and never change. ``tests/unit/schemas/test_rule_codes.py``
    proves no module builds a ``MaskReason`` (or a ``CallIncomplete``) from a bare string.
    """

    # --- the snapshot (consumers.rebuild.builder) ---
    CAPTURE_INCOMPLETE = "capture_incomplete"
    LATE_WRITE = "late_write"
    NO_CALLS = "no_calls"
    BUILD_ERROR = "build_error"
    # --- no policy call (gym mode, or nothing live) ---
    ALL_SIDE_CALLS = "all_side_calls"
    NO_GENERATED_TOKENS = "no_generated_tokens"
    # --- lineage of the delivered chain ---
    UNRESOLVED_PARENT = "unresolved_parent"
    UNRESOLVED_RETRY = "unresolved_retry"
    MULTIPLE_ROOTS = "multiple_roots"
    MULTIPLE_CHAINS = "multiple_chains"
    # --- terminal attribution (consumers.rebuild.terminal) ---
    NO_TERMINAL = "no_terminal"
    TERMINAL_NOT_CAPTURED = "terminal_not_captured"
    TERMINAL_EMPTY = "terminal_empty"
    TERMINAL_IS_SIDE_CALL = "terminal_is_side_call"
    TERMINAL_AMBIGUOUS = "terminal_ambiguous"
    # --- traces (consumers.rebuild.traces; delivery_mode "traces") ---
    # A root whose kind no evidence decides (not declared, no Agent/Task call, no summary it carries).
    TRACE_UNCLASSIFIED = "trace_unclassified"
    # Evidence points at more than one parent (two Agent/Task calls, two summaries): nothing is guessed.
    TRACE_AMBIGUOUS = "trace_ambiguous"
    # The rollout is masked because a trace whose kind masks the rollout (rules.mask_rollout_kinds) is.
    TRACE_MASKED = "trace_masked"
    # --- record content (consumers.rebuild.validity, consumers.rebuild.trajectory) ---
    INVALID_RESULT = "invalid_result"
    NON_FINITE_LOG_PROB = "non_finite_log_prob"
    NON_FINITE_VALUE = "non_finite_value"
    INVALID_RECORD = "invalid_record"
    # --- sinks ---
    # The record exceeds the Kafka sink topic's message size (consumers.sinks.kafka).
    RECORD_TOO_LARGE = "record_too_large"
    # A finish group that cannot be grouped; yielded as a group of one (consumers.sinks.stream).
    INVALID_GROUP = "invalid_group"
    # --- policy versions (consumers.rebuild.builder, consumers.staleness) ---
    # The engine aborted a call's generation (a weight-update pause) and no captured retry names it.
    ABORTED_BY_UPDATE = "aborted_by_update"
    # The oldest generated token's version is more than max_staleness versions behind the current one.
    STALE_POLICY = "stale_policy"
    # A loss-bearing token's version is not known (an "" span: consumers.rebuild.staleness.unknown_version_reason),
    # or max_staleness is set and a generated token's version was never announced.
    UNKNOWN_POLICY_VERSION = "unknown_policy_version"


@dataclass(**_FROZEN)
class VersionSpan:
    """Tokens ``[start, end)`` were sampled under weight version ``version``; ``""``: not known.

    In ``CallFacts`` positions are over the call's ``generation_token_ids``; in ``CallSpan`` over the
    trajectory's ``token_ids``. Spans are run-length: adjacent spans never share a version, and a
    non-empty list covers every generated token of its call exactly once, in order.
    """

    version: str
    start: int
    end: int


class VersionSource(StrEnum):
    """Where a call's per-token versions come from (``CallFacts.version_spans_source``; wire strings)."""

    ENGINE = "engine"  # the engine's own weight_versions spans (vLLM 0.33 return_weight_versions)
    OBSERVED = "observed"  # the interceptor split the stream where the announced version changed
    BRACKET = "bracket"  # the announced version at dispatch and at completion (no token index)
    NONE = ""  # nothing named a version


class PrefixRoute(StrEnum):
    """Which engine route generated from supplied prompt ids (``CallCaptured.prefix_route``; wire strings).

    The wire field stays a plain string, so a reader accepts a route it does not know (a newer writer's).
    """

    CHAT = "/v1/chat/completions"  # kv_transfer_params.prompt_token_ids on the chat request (vLLM >= 0.32)
    GENERATE = "/inference/v1/generate"  # the render's GenerateRequest, stream + output_mode derender (vLLM >= 0.34)
    NONE = ""  # no ids were supplied


@dataclass(**_FROZEN)
class CallFacts:
    route: str
    dialect: Dialect = Dialect.UNKNOWN
    streamed: bool = False
    requested_model: str = ""
    served_model: str = ""
    tools_present: bool = False
    tool_schema_digest: str = ""
    system_prompt_digest: str = ""
    max_tokens: int | None = None
    sampling_json: str = "{}"
    user_agent: str = ""
    harness_session_id: str = ""
    policy_version: str | None = None
    policy_version_source: str = ""
    response_id: str = ""
    max_tokens_sent: int | None = None
    max_tokens_clamped: bool = False
    logprobs_mode: str = ""
    trace_declared: str = ""
    agent_name: str = ""
    opening_text_digests: list[str] = field(default_factory=list)
    version_spans: list[VersionSpan] = field(default_factory=list)
    version_spans_source: str = ""
    dispatch_version: str | None = None
    completion_version: str | None = None
    retry_of: str = ""
    continued: int = 0


@dataclass(**_FROZEN)
class CallCaptured:
    model_call_id: str
    created_at: float
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    parent_resolution: ParentResolution
    cum_len: int
    digest: str
    facts: CallFacts
    parent_digest: str = ""
    model: str = ""
    prompt_is_delta: bool = False
    output_items_json: str = "[]"
    token_item_index: int | None = None
    routed_experts_json: str | None = None
    parent_call_id: str | None = None
    parent_resolution_reason: str = ""
    request_fingerprint: str = ""
    continuation_fingerprint: str = ""
    continuation_context_len: int = 0
    continuation_context_digest: str = ""
    fingerprint_version: int = 1
    prefix_requested: bool = False
    prefix_supplied: bool = False
    finish_reason: str = ""
    prefix_route: str = ""  # PrefixRoute: which engine route took the supplied ids ("" when none were)

    def __post_init__(self) -> None:
        n_gen = len(self.generation_token_ids)
        if len(self.generation_log_probs) != n_gen:
            raise ContractError(
                f"call {self.model_call_id}: generation_log_probs has {len(self.generation_log_probs)} "
                f"values for {n_gen} generation_token_ids; the engine must return one log-prob per token"
            )
        resolved = self.parent_resolution is ParentResolution.RESOLVED
        if resolved != (self.parent_call_id is not None):
            raise ContractError(
                f"call {self.model_call_id}: parent_resolution={self.parent_resolution} with "
                f"parent_call_id={self.parent_call_id!r}; RESOLVED needs a parent id, ROOT/UNRESOLVED must have none"
            )
        if self.prompt_is_delta and not resolved:
            raise ContractError(
                f"call {self.model_call_id}: prompt_is_delta needs a RESOLVED parent "
                f"(got {self.parent_resolution}); store the full prompt instead"
            )
        carried = len(self.prompt_token_ids) + n_gen
        if self.cum_len < carried or (not self.prompt_is_delta and self.cum_len != carried):
            raise ContractError(
                f"call {self.model_call_id}: cum_len={self.cum_len} but the record carries {carried} tokens "
                f"(prompt_is_delta={self.prompt_is_delta}); cum_len is the FULL prompt+generation length"
            )

    @property
    def prompt_len(self) -> int:
        """Length of the full prompt (also for delta records)."""
        return self.cum_len - len(self.generation_token_ids)

    @property
    def output_items(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = json.loads(self.output_items_json)
        return items


@dataclass(**_FROZEN)
class CallIncomplete:
    reason: str
    model_call_id: str | None = None
    http_status: int | None = None
    route: str = ""
    detail: str = ""
    created_at: float = 0.0


@dataclass(**_FROZEN)
class RolloutFinished:
    attempt: int = 0
    result_json: str = "{}"
    final_response_id: str | None = None
    final_text: str | None = None

    @property
    def result(self) -> Any:
        return json.loads(self.result_json)


@dataclass(**_FROZEN)
class RetireRequested:
    snapshot_id: str
    version: int
    consumer: str = ""


@dataclass(**_FROZEN)
class CallStarted:
    """A pre-dispatch intent (Gym's ``begin_call``): without a matching CallCaptured the rollout is incomplete."""

    model_call_id: str
    route: str = ""
    created_at: float = 0.0


Body = CallCaptured | CallIncomplete | RolloutFinished | RetireRequested | CallStarted


@dataclass(**_FROZEN)
class RolloutEvent:
    event_id: str
    rollout_id: str
    emitted_at: int
    source: str
    body: Body
    schema_version: int = EVENT_SCHEMA_VERSION


@dataclass(**_FROZEN)
class SnapshotCall:
    seq: int
    call: CallCaptured
    late: bool = False
    lineage_note: str = ""


@dataclass(**_FROZEN)
class Snapshot:
    rollout_id: str
    snapshot_id: str
    version: int
    frozen_at: int
    calls: list[SnapshotCall]
    incomplete: bool
    incomplete_markers: list[CallIncomplete]
    finished: RolloutFinished
    conflicting_call_ids: list[str] = field(default_factory=list)
    late_writes: int = 0
    schema_version: int = SNAPSHOT_SCHEMA_VERSION


@dataclass(**_FROZEN)
class MaskReason:
    code: str
    detail: str = ""
    call_ids: list[str] = field(default_factory=list)


@dataclass(**_FROZEN)
class CallSpan:
    model_call_id: str
    start: int
    generation_start: int
    end: int
    policy_version: str | None = None
    version_spans: list[VersionSpan] = field(default_factory=list)
    version_source: str = ""
    dispatch_version: str | None = None


@dataclass(**_FROZEN)
class Trajectory:
    token_ids: list[int]
    loss_mask: bytes
    log_probs: list[float]
    prompt_len: int
    spans: list[CallSpan]

    def __post_init__(self) -> None:
        if len(self.loss_mask) != len(self.token_ids):
            raise ContractError(
                f"trajectory loss_mask has {len(self.loss_mask)} entries for {len(self.token_ids)} tokens"
            )
        generated = self.loss_mask.count(1)
        if generated != len(self.log_probs):
            raise ContractError(
                f"trajectory has {generated} generated tokens but {len(self.log_probs)} log-probs"
            )


class TraceKind(StrEnum):
    """What one delivered trace of a rollout is (``Trace.kind``; wire strings, never changed)."""

    MAIN = "main"  # the harness's own conversation, up to its final answer (compaction segment 0)
    SUBAGENT = "subagent"  # a conversation the harness started for a sub-agent (Agent/Task tool, named agent)
    COMPACTION = "compaction"  # segment k >= 1 of a conversation that restarted from a summary
    SIDE = "side"  # side calls (title, quota probe, small model): reported, never loss-bearing
    OTHER = "other"  # a fork inside a trace's tree, or a root nothing could classify (with a reason)


@dataclass(**_FROZEN)
class TraceAttachment:
    """Where a trace hangs off its parent trace: the parent's call that led to it and, for a
    sub-agent, the tool call whose result carries the sub-agent's answer."""

    call_id: str
    tool_call_id: str | None = None


@dataclass(**_FROZEN)
class Trace:
    """One contiguous token-exact trajectory of a rollout's forest (``delivery_mode="traces"``).

    Compact tree form: the trace's tokens are ``traces[prefix_trace]``'s first ``prefix_len``
    tokens followed by ``trajectory.token_ids`` (``prefix_trace`` -1: no shared prefix, and
    ``prefix_len`` 0). ``trajectory`` holds only this trace's own tokens; its spans are this
    trace's own calls at positions in the whole trace (the first starts at ``prefix_len``),
    its loss mask is 1 exactly on the tokens this trace trains on, and ``prompt_len`` is the
    position of its first own generated token. The shared prefix is context: never
    loss-bearing here. ``parent_trace`` is identity (which trace started this one), not
    token sharing.
    """

    kind: str
    label: str
    segment: int = 0
    parent_trace: int = -1
    attachment: TraceAttachment | None = None
    classified_by: str = ""
    prefix_trace: int = -1
    prefix_len: int = 0
    trajectory: Trajectory | None = None
    response_json: str | None = None
    call_ids: list[str] = field(default_factory=list)
    loss_tokens: int = 0
    mask_sample: bool = False
    mask_reasons: list[MaskReason] = field(default_factory=list)


@dataclass(**_FROZEN)
class TerminalAttribution:
    chain: str | None = None
    method: str = "none"
    call_id: str | None = None


@dataclass(**_FROZEN)
class CaptureMetrics:
    n_calls: int
    roots: int
    chains: int
    delivered_fraction: float
    quarantined_calls: int
    quarantined_fraction: float
    empty_generation_calls: int
    unresolved_parent_calls: int
    parent_link_failures: dict[str, int]
    generated_tokens_captured: int
    generated_tokens_delivered: int
    capture_incomplete: bool
    terminal_attribution: TerminalAttribution
    side_calls_excluded: int = 0
    error: str | None = None
    detail_json: str = "{}"


@dataclass(**_FROZEN)
class RebuiltRollout:
    rollout_id: str
    snapshot_id: str
    version: int
    mask_sample: bool
    mask_reasons: list[MaskReason]
    trajectory: Trajectory | None
    metrics: CaptureMetrics
    response_json: str | None = None
    result_json: str = "{}"
    schema_version: int = REBUILT_SCHEMA_VERSION
    traces: list[Trace] = field(default_factory=list)
