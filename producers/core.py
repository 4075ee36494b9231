"""The capture core shared by every dialect, by streaming and not, standalone or as vLLM middleware.

Per call: ``begin`` hashes the request and resolves its parent once, before
dispatch; ``upstream_body`` is what the engine gets (the sampling pin, the
fields capture needs, and — opt-in — the parent's exact ids as a required
prefix); ``complete`` turns the engine's answer into durable evidence.

Outcomes of ``complete``: CAPTURED (CallCaptured is durable), INCOMPLETE (the
engine answered but its tokens are missing or partial: CallIncomplete is
durable, the answer may still go back), PREFIX_FAILED (a supplied prefix was
not applied: the call fails, CallIncomplete is durable), NOT_DURABLE (nothing
could be made durable: the call must fail with 503).
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from producers.capture import CallContext, call_facts, captured_call, incomplete_call, make_event, request_items
from producers.durable import DurableWriter
from producers.extract import PartialTokenMetadata, chat_output_items, extract_chat_tokens
from producers.lineage_index import LineageIndex, Resolution
from producers.metrics import InterceptorMetrics
from producers.settings import InterceptorSettings
from schemas.codec import encode_event
from schemas.errors import DurabilityError
from schemas.hashing import compute_digest, conversation_prefix_digests
from schemas.ids import response_id_for
from schemas.records import CallCaptured, Dialect, IncompleteReason, ParentResolution, RolloutEvent
from schemas.topics import key_for

log = logging.getLogger("tokentrail.interceptor")


class Outcome(enum.Enum):
    CAPTURED = "captured"
    INCOMPLETE = "incomplete"
    PREFIX_FAILED = "prefix_failed"
    NOT_DURABLE = "not_durable"


@dataclass(slots=True)
class ParsedRequest:
    """A harness request in chat-completions terms, plus what lineage hashes."""

    chat_body: dict[str, Any]
    items: list[dict[str, Any]]
    instructions: Any = None
    tools: Any = None
    system: Any = None
    stream: bool = False
    keep_logprobs: bool = False
    original: dict[str, Any] = field(default_factory=dict)  # the harness's own request body


@dataclass(slots=True)
class Call:
    """One call in flight: its context, its parent decision, what the engine must prove."""

    ctx: CallContext
    resolution: Resolution
    context_digests: list[str]
    id_kind: str
    required_prefix: list[int] | None = None
    started: float = 0.0

    @property
    def response_id(self) -> str:
        return response_id_for(self.id_kind, self.ctx.model_call_id)


class CaptureCore:
    def __init__(self, settings: InterceptorSettings, writer: DurableWriter, index: LineageIndex,
                 metrics: InterceptorMetrics, source: str) -> None:
        self.settings = settings
        self.writer = writer
        self.index = index
        self.metrics = metrics
        self.source = source
        self.admin_policy_version: str | None = None

    # -- before dispatch ------------------------------------------------------------
    def begin(self, rollout_id: str, route: str, dialect: Dialect, id_kind: str, parsed: ParsedRequest,
              body: dict[str, Any], headers: dict[str, str], started: float | None = None) -> Call:
        started = time.perf_counter() if started is None else started
        upstream = self._pinned(parsed.chat_body)
        ctx = CallContext(
            rollout_id=rollout_id,
            route=route,
            dialect=dialect,
            items=request_items(parsed.items, instructions=parsed.instructions, tools=parsed.tools),
            facts=call_facts(route=route, dialect=dialect, body=body, upstream_body=upstream, headers=headers,
                             system=parsed.system, tools=parsed.tools, streamed=parsed.stream),
        )
        digests = conversation_prefix_digests(ctx.items)
        resolution = self.index.resolve(rollout_id, ctx.items, ctx.request_fingerprint)
        call = Call(ctx, resolution, digests, id_kind, started=started)
        parent = resolution.parent
        if self.settings.prefix_supply and parent is not None and parent.cum_tokens is not None:
            call.required_prefix = list(parent.cum_tokens)
        return call

    def upstream_body(self, call: Call, chat_body: dict[str, Any]) -> dict[str, Any]:
        out = self._pinned(chat_body)
        out["return_token_ids"] = True
        out["logprobs"] = True
        top = chat_body.get("top_logprobs")
        if not isinstance(top, int) or top < 0:
            out["top_logprobs"] = 0
        out["include_reasoning"] = True  # vLLM hides token ids when reasoning is hidden
        out["return_weight_versions"] = True
        if call.required_prefix is not None:
            out["required_prefix_token_ids"] = call.required_prefix
        return out

    def _pinned(self, chat_body: dict[str, Any]) -> dict[str, Any]:
        out = dict(chat_body)
        out.update(self.settings.sampling_overrides)
        if self.settings.upstream_model:
            # Harnesses ask for their own model names (claude-...); the engine serves one policy.
            out["model"] = self.settings.upstream_model
        return out

    # -- after the engine answered ---------------------------------------------------
    async def complete(self, call: Call, data: dict[str, Any]) -> Outcome:
        ctx = call.ctx
        try:
            tokens = extract_chat_tokens(data)
        except PartialTokenMetadata as exc:
            return await self._incomplete_outcome(call, IncompleteReason.PARTIAL_TOKEN_METADATA, str(exc))
        if tokens is None:
            return await self._incomplete_outcome(
                call, IncompleteReason.MISSING_TOKEN_IDS, "engine returned no token ids (is it vLLM with return_token_ids?)")
        prefix_supplied = False
        if call.required_prefix is not None:
            prefix = call.required_prefix
            if tokens.prompt_token_ids[: len(prefix)] != prefix:
                outcome = await self._incomplete_outcome(
                    call, IncompleteReason.PREFIX_NOT_APPLIED,
                    "the engine did not generate from the supplied parent prefix (required_prefix_token_ids); "
                    "serve with a backend that honours it or turn prefix supply off")
                return Outcome.PREFIX_FAILED if outcome is Outcome.INCOMPLETE else outcome
            prefix_supplied = True
        message = data["choices"][0].get("message") or {}
        items, carrier = chat_output_items(message)
        version, source = self.policy_version_of(data)
        captured = captured_call(
            ctx, tokens, items, carrier, served_model=str(data.get("model") or ""), response_id=call.response_id,
            policy_version=version, policy_version_source=source, context_digest=call.context_digests[-1],
        )
        captured = self._with_lineage(call, captured, tokens.prompt_token_ids, prefix_supplied)
        try:
            await self.write(ctx.rollout_id, captured)
        except DurabilityError as exc:
            log.error("capture of call %s (rollout %s) not durable: %s", ctx.model_call_id, ctx.rollout_id, exc)
            return Outcome.NOT_DURABLE
        self.index.record(
            ctx.rollout_id, call_id=ctx.model_call_id, continuation_fingerprint=captured.continuation_fingerprint,
            cum_len=captured.cum_len, digest=captured.digest, context_len=captured.continuation_context_len,
            context_digest=captured.continuation_context_digest,
            cum_tokens=(tokens.prompt_token_ids + tokens.generation_token_ids) if self.index.keep_tokens else None,
        )
        self.metrics.captured.inc()
        log.info("call captured", extra={
            "rollout_id": ctx.rollout_id, "model_call_id": ctx.model_call_id, "outcome": "captured",
            "dialect": ctx.dialect.value, "streamed": ctx.facts.streamed, "parent": captured.parent_call_id,
            "resolution": captured.parent_resolution.value, "delta": captured.prompt_is_delta,
            "prompt_tokens": captured.prompt_len, "generated_tokens": len(captured.generation_token_ids)})
        return Outcome.CAPTURED

    def _with_lineage(self, call: Call, captured: CallCaptured, prompt: list[int], prefix_supplied: bool) -> CallCaptured:
        """Stamp the request-time decision; store only the new prompt tokens when the parent is verified."""
        res = call.resolution
        updates: dict[str, Any] = {"prefix_requested": call.required_prefix is not None,
                                   "prefix_supplied": prefix_supplied}
        if res.status is ParentResolution.RESOLVED and res.parent is not None:
            parent = res.parent
            updates.update(parent_resolution=ParentResolution.RESOLVED, parent_call_id=parent.call_id,
                           parent_resolution_reason="", parent_digest=parent.digest)
            if (self.settings.delta_records and len(prompt) >= parent.cum_len
                    and compute_digest(prompt[: parent.cum_len]) == parent.digest):
                updates.update(prompt_token_ids=prompt[parent.cum_len :], prompt_is_delta=True)
        elif res.status is ParentResolution.UNRESOLVED:
            updates.update(parent_resolution=ParentResolution.UNRESOLVED, parent_call_id=None,
                           parent_resolution_reason=res.reason)
        return _replace(captured, updates)

    async def _incomplete_outcome(self, call: Call, reason: str, detail: str) -> Outcome:
        ok = await self.incomplete(call.ctx.rollout_id, call.ctx.model_call_id, reason, call.ctx.route, 200, detail)
        return Outcome.INCOMPLETE if ok else Outcome.NOT_DURABLE

    # -- evidence ------------------------------------------------------------------
    async def incomplete(self, rollout_id: str, call_id: str | None, reason: str, route: str,
                         status: int | None, detail: str) -> bool:
        """Make a CallIncomplete durable; False when it could not be."""
        marker = incomplete_call(call_id, str(reason), route=route, http_status=status, detail=detail)
        try:
            await self.write(rollout_id, marker)
        except DurabilityError as exc:
            log.error("incomplete marker (%s) for rollout %s not durable: %s", reason, rollout_id, exc)
            return False
        self.metrics.incomplete.labels(reason=str(reason)).inc()
        log.warning("call incomplete", extra={"rollout_id": rollout_id, "model_call_id": call_id,
                                              "outcome": "incomplete", "reason": str(reason), "route": route,
                                              "http_status": status, "detail": detail[:300]})
        return True

    async def write(self, rollout_id: str, body: Any) -> RolloutEvent:
        event = make_event(rollout_id, body, self.source)
        await self.write_event(event)
        return event

    async def write_event(self, event: RolloutEvent) -> None:
        """Return once the event is durable (Kafka ack or fsynced spool); DurabilityError otherwise."""
        with self.metrics.publish_seconds.time():
            where = await self.writer.write(self.settings.topics.rollout_events, key_for(event.rollout_id),
                                            encode_event(event))
        if where == "spool":
            self.metrics.spooled.inc()

    def policy_version_of(self, data: dict[str, Any]) -> tuple[str | None, str]:
        """The engine's weight version when it reports one, else the one the trainer set via the admin route."""
        for choice in data.get("choices") or ():
            spans = choice.get("weight_versions") if isinstance(choice, dict) else None
            if spans:
                versions = list(dict.fromkeys(str(s.get("version")) for s in spans if isinstance(s, dict)))
                if versions:
                    # Several versions: the weights changed during generation; keep them all, in order.
                    return ",".join(versions), "engine"
        if self.admin_policy_version is not None:
            return self.admin_policy_version, "admin"
        return None, ""


def _replace(record: Any, updates: dict[str, Any]) -> Any:
    import dataclasses

    return dataclasses.replace(record, **updates)
