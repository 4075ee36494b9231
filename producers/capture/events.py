"""The contract events of one intercepted call: CallCaptured, CallIncomplete, the RolloutEvent envelope.

Pure apart from the clock, the host name and fresh ids: no framework, no I/O. The
request is hashed as NeMo Gym does: its items (chat messages, Anthropic
messages, Responses input) prefixed by an envelope pseudo-turn carrying the
instructions and the tool schema when present, so that a changed system prompt
or tool set fails context verification without changing the lookup key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from producers.capture.trace_facts import TRACE_HEADER, agent_name, opening_text_digests, opening_user_items
from producers.engine.extract import EngineTokens
from schemas.hashing import FINGERPRINT_VERSION, FingerprintHasher, compute_digest, conversation_digest
from schemas.ids import new_event_id, new_model_call_id
from schemas.records import (
    CallCaptured,
    CallFacts,
    CallIncomplete,
    Dialect,
    ParentResolution,
    RolloutEvent,
)

__all__ = ["ENVELOPE_ROLE", "SAMPLING_FIELDS", "SESSION_HEADERS", "CallContext", "call_facts", "canonical_json",
           "captured_call", "default_source", "incomplete_call", "make_event", "request_items", "sent_max_tokens",
           "sha256_json", "with_sent_max_tokens"]

ENVELOPE_ROLE = "_ng_request_envelope"
SESSION_HEADERS = ("x-claude-code-session-id", "x-session-id", "session_id", "x-codex-session-id")
SAMPLING_FIELDS = (
    "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "seed", "stop", "max_tokens", "max_completion_tokens",
)


def default_source() -> str:
    return f"interceptor@{socket.gethostname()}:{os.getpid()}"


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sha256_json(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def request_items(messages: list[Any], *, instructions: Any = None, tools: Any = None) -> list[dict[str, Any]]:
    """The items a request is hashed as: an envelope pseudo-turn (when instructions/tools exist) + messages."""
    items: list[dict[str, Any]] = []
    if instructions or tools:
        envelope = json.dumps({"instructions": instructions, "tools": tools}, sort_keys=True, default=str)
        items.append({"role": ENVELOPE_ROLE, "content": envelope})
    items.extend(messages)
    return items


@dataclass(slots=True)
class CallContext:
    """Everything known about a call before the engine answers."""

    rollout_id: str
    route: str
    dialect: Dialect
    items: list[dict[str, Any]]
    facts: CallFacts
    model_call_id: str = field(default_factory=new_model_call_id)
    created_at: float = field(default_factory=time.time)
    request_fingerprint: str = ""
    # ``items`` hashed once: the continuation fingerprint then hashes only the answer's items.
    _fingerprint: FingerprintHasher = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._fingerprint = FingerprintHasher(self.items)
        self.request_fingerprint = self._fingerprint.hexdigest()

    def continuation_fingerprint(self, output_items: list[dict[str, Any]]) -> str:
        """``assistant_fingerprint(items + output_items)``, hashing ``output_items`` only."""
        return self._fingerprint.extended(output_items)


def call_facts(
    *, route: str, dialect: Dialect, body: dict[str, Any], upstream_body: dict[str, Any], headers: dict[str, str],
    system: Any, tools: Any, streamed: bool, logprobs_mode: str = "", max_tokens_clamped: bool = False,
) -> CallFacts:
    """Facts for later classification (side calls, staleness, traces); capture makes no decisions.

    ``headers`` are lower-cased. ``trace_declared`` is the ``x-tokentrail-trace`` value verbatim
    (admission refused a malformed one); ``agent_name`` and ``opening_text_digests`` follow
    ``producers.capture.trace_facts``, the digests from the harness's own ``body`` (the upstream chat
    ``messages`` when the body has neither ``messages`` nor ``input``).
    """
    opening = opening_user_items(body) or upstream_body.get("messages")
    sampling = {k: upstream_body[k] for k in SAMPLING_FIELDS if k in upstream_body}
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens", body.get("max_output_tokens")))
    return CallFacts(
        route=route,
        dialect=dialect,
        streamed=streamed,
        requested_model=str(body.get("model") or ""),
        tools_present=bool(tools),
        tool_schema_digest=sha256_json(tools) if tools else "",
        system_prompt_digest=sha256_json(system) if system else "",
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        sampling_json=canonical_json(sampling),
        user_agent=headers.get("user-agent", ""),
        harness_session_id=next((headers[h] for h in SESSION_HEADERS if h in headers), ""),
        max_tokens_sent=sent_max_tokens(upstream_body),
        max_tokens_clamped=max_tokens_clamped,
        logprobs_mode=logprobs_mode,
        trace_declared=headers.get(TRACE_HEADER, ""),
        agent_name=agent_name(headers),
        opening_text_digests=opening_text_digests(opening if isinstance(opening, list) else []),
    )


def with_sent_max_tokens(facts: CallFacts, upstream_body: dict[str, Any]) -> CallFacts:
    """``facts`` after the interceptor lowered the output budget in ``upstream_body`` (a clamp)."""
    sampling = {k: upstream_body[k] for k in SAMPLING_FIELDS if k in upstream_body}
    return dataclasses.replace(facts, max_tokens_sent=sent_max_tokens(upstream_body), max_tokens_clamped=True,
                               sampling_json=canonical_json(sampling))


def sent_max_tokens(upstream_body: dict[str, Any]) -> int | None:
    # vLLM reads max_completion_tokens first, then max_tokens.
    value = upstream_body.get("max_completion_tokens")
    if value is None:
        value = upstream_body.get("max_tokens")
    return value if isinstance(value, int) else None


def captured_call(
    ctx: CallContext,
    tokens: EngineTokens,
    output_items: list[dict[str, Any]],
    carrier: int,
    *,
    served_model: str,
    response_id: str,
    policy_version: str | None = None,
    policy_version_source: str = "",
    context_digest: str | None = None,
    finish_reason: str = "",
    **version_facts: Any,
) -> CallCaptured:
    """The CallCaptured of a served call (full prompt; the processor resolves and verifies the parent).

    ``version_facts``: the ``CallFacts`` version fields (``producers.capture.call_versions.version_facts``).
    """
    full = tokens.prompt_token_ids + tokens.generation_token_ids
    root = not ctx.request_fingerprint
    facts = ctx.facts
    facts = CallFacts(
        **{**_facts_dict(facts), "served_model": served_model, "response_id": response_id,
           "policy_version": policy_version, "policy_version_source": policy_version_source, **version_facts}
    )
    return CallCaptured(
        model_call_id=ctx.model_call_id,
        created_at=ctx.created_at,
        model=served_model,
        prompt_token_ids=tokens.prompt_token_ids,
        generation_token_ids=tokens.generation_token_ids,
        generation_log_probs=tokens.generation_log_probs,
        output_items_json=json.dumps(output_items, separators=(",", ":"), ensure_ascii=False),
        token_item_index=carrier,
        routed_experts_json=None if tokens.routed_experts is None else json.dumps(tokens.routed_experts),
        parent_resolution=ParentResolution.ROOT if root else ParentResolution.UNRESOLVED,
        parent_resolution_reason="" if root else "not_attempted",
        cum_len=len(full),
        digest=compute_digest(full),
        request_fingerprint=ctx.request_fingerprint,
        continuation_fingerprint=ctx.continuation_fingerprint(output_items),
        continuation_context_len=len(ctx.items),
        continuation_context_digest=context_digest if context_digest is not None else conversation_digest(ctx.items),
        fingerprint_version=FINGERPRINT_VERSION,
        finish_reason=finish_reason,
        facts=facts,
    )


def _facts_dict(facts: CallFacts) -> dict[str, Any]:
    return {name: getattr(facts, name) for name in facts.__dataclass_fields__}


def incomplete_call(
    call_id: str | None, reason: str, *, route: str, http_status: int | None = None, detail: str = ""
) -> CallIncomplete:
    return CallIncomplete(
        model_call_id=call_id,
        reason=reason,
        http_status=http_status,
        route=route,
        detail=detail[:2000],
        created_at=time.time(),
    )


def make_event(rollout_id: str, body: Any, source: str) -> RolloutEvent:
    return RolloutEvent(
        event_id=new_event_id(), rollout_id=rollout_id, emitted_at=time.time_ns() // 1000, source=source, body=body
    )
