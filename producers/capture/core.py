"""The capture core: runs one call, whatever the dialect, streaming or not, standalone or as vLLM middleware.

``CaptureCore`` is built whole before the interceptor serves (``producers.services``):
its writer, lineage index and engine catalog are never missing. It knows no HTTP
framework; ``producers.call.generation`` is the HTTP side of a call.

Per call, before dispatch: ``describe`` hashes the request and fits it to the
engine (the sampling pin, a model name the engine serves, an output budget
within its ``max_model_len``), touching no state of the core (a large request's
runs in a worker thread); ``begin`` then resolves its parent once; ``announce``
hands the call's CallStarted intent to the writer before anything is dispatched
and resolves once it is durable (the engine works meanwhile; the harness gets no
byte of an answer before it resolved True);
``upstream_body`` is what the engine gets (plus the fields capture needs and,
opt-in, the exact prompt ids as ``kv_transfer_params.prompt_token_ids``);
``complete`` turns the engine's answer into durable evidence.

Outcomes of ``complete``, each decided before anything is written, so a call
leaves exactly one record: CAPTURED (CallCaptured is durable), INCOMPLETE (the
engine answered but its tokens are missing or partial: CallIncomplete is
durable, the answer may still go back), ABORTED (the engine aborted the
generation, e.g. paused for a weight sync: CallIncomplete(aborted), the
harness is told to retry), ENGINE_FAILED (finish_reason "error":
CallIncomplete(upstream_error)), UNTRANSLATABLE (the answer cannot be put in
the harness's dialect: CallIncomplete(untranslatable_output)), PREFIX_FAILED
(supplied prompt ids were not used: the call fails, CallIncomplete is
durable), NOT_DURABLE (nothing could be made durable: the call must fail with
503).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from producers.capture.call_versions import cache_salt, version_facts
from producers.capture.durable import DurableWriter
from producers.capture.events import (
    CallContext,
    call_facts,
    captured_call,
    incomplete_call,
    make_event,
    request_items,
    with_sent_max_tokens,
)
from producers.capture.lineage_index import LineageIndex, Resolution
from producers.capture.version_clock import CallVersions, VersionClock
from producers.dialects.base import ParsedRequest
from producers.dialects.registry import DialectSpec
from producers.engine.extract import PartialTokenMetadata, chat_output_items, extract_chat_tokens
from producers.engine.info import EngineCatalog, EngineInfo, max_tokens_key
from producers.engine.prefix_supply import ends_with_stop
from producers.metrics import InterceptorMetrics
from producers.settings import InterceptorSettings
from schemas.codec import encode_event
from schemas.errors import DurabilityError
from schemas.hashing import compute_digest, conversation_prefix_digests
from schemas.kafka.topics import key_for
from schemas.records import (
    CallCaptured,
    CallStarted,
    IncompleteReason,
    ParentResolution,
    PrefixRoute,
    RolloutEvent,
)

__all__ = ["Call", "CaptureCore", "Described", "Outcome"]

log = logging.getLogger("tokentrail.interceptor")


_ABORTED_MEMORY = 65_536  # aborted calls remembered for their retry (a sync aborts every call in flight)


class Outcome(enum.Enum):
    CAPTURED = "captured"
    INCOMPLETE = "incomplete"
    ABORTED = "aborted"
    ENGINE_FAILED = "engine_failed"
    UNTRANSLATABLE = "untranslatable"
    PREFIX_FAILED = "prefix_failed"
    NOT_DURABLE = "not_durable"


@dataclass(slots=True)
class Call:
    """One call in flight: its context, its parent decision, what the engine must prove."""

    ctx: CallContext
    resolution: Resolution
    context_digest: str  # conversation_digest(ctx.items): the continuation context a capture records
    spec: DialectSpec  # the harness's dialect: its wire symbol and response-id prefix
    body: dict[str, Any] = field(default_factory=dict)  # the chat request fitted to the engine
    prefix_requested: bool = False  # prefix supply is on and the resolved parent's ids are known
    supplied_prefix: list[int] | None = None  # prompt ids sent; the engine must report exactly these
    prefix_route: str = PrefixRoute.NONE  # which engine route the supplied ids went to (recorded on the capture)
    started: float = 0.0
    answer: Any = None  # what ``complete``'s ``prepare`` built for the harness
    failure: str = ""  # the recorded detail when the call was not captured
    versions: CallVersions | None = None  # the announced version at dispatch, mid-stream, at completion
    continued: int = 0  # parts joined after engine aborts (abort_policy "continue")
    retry_of: str = ""  # the aborted call of this rollout this one repeats
    large: bool = False  # a large request body: its upstream encode runs off the loop too

    def part_ended(self, label: str | None, generated: int) -> None:
        """A part of a continued call ended (aborted) after ``generated`` tokens in all, ``label`` current."""
        if self.versions is not None:
            self.versions.part_ends.append((generated, label))

    @property
    def response_id(self) -> str:
        return self.spec.response_id(self.ctx.model_call_id)


@dataclass(slots=True)
class Described:
    """A request as ``CaptureCore.describe`` read it, before the core's state is consulted (``begin``)."""

    ctx: CallContext
    spec: DialectSpec
    prefixes: list[str]  # conversation_prefix_digests(ctx.items): one per prefix, the whole context's last
    body: dict[str, Any]  # the chat request fitted to the engine
    substituted: tuple[Any, Any] | None = None  # (requested, sent) model names when the model was replaced


class CaptureCore:
    """Decides and writes each call's one record; ``clock`` is the announced policy version (topic, admin route)."""

    def __init__(self, settings: InterceptorSettings, writer: DurableWriter, index: LineageIndex,
                 metrics: InterceptorMetrics, source: str, catalog: EngineCatalog | None = None) -> None:
        self.settings = settings
        self.writer = writer
        self.index = index
        self.metrics = metrics
        self.source = source
        self.clock = VersionClock()
        # Calls the engine aborted, by (rollout, request conversation digest): a later call with the
        # same request is their retry (CallFacts.retry_of). Bounded: the oldest are forgotten.
        self._aborted: OrderedDict[tuple[str, str], str] = OrderedDict()
        self.catalog = catalog if catalog is not None else EngineCatalog()

    # -- before dispatch ------------------------------------------------------------
    def describe(self, rollout_id: str, route: str, spec: DialectSpec, parsed: ParsedRequest,
                 body: dict[str, Any], headers: dict[str, str], engine: EngineInfo | None = None) -> Described:
        """A request's per-message work, before dispatch: its items, facts, fingerprint and context digests,
        and the chat body fitted to ``engine``. Reads the settings and its arguments only and writes no state
        of the core, so a large request's may run in a worker thread (``producers.call.large_bodies``)."""
        dialect = spec.wire
        upstream, clamped, substituted = self._fitted(parsed.chat_body, engine)
        ctx = CallContext(
            rollout_id=rollout_id,
            route=route,
            dialect=dialect,
            items=request_items(parsed.items, instructions=parsed.instructions, tools=parsed.tools),
            facts=call_facts(route=route, dialect=dialect, body={**body, **parsed.facts} if parsed.facts else body,
                             upstream_body=upstream, headers=headers,
                             system=parsed.system, tools=parsed.tools, streamed=parsed.stream,
                             logprobs_mode=self.settings.logprobs_mode, max_tokens_clamped=clamped),
        )
        return Described(ctx, spec, conversation_prefix_digests(ctx.items), upstream, substituted)

    def begin(self, described: Described, started: float | None = None) -> Call:
        """The call of a described request: its parent resolved once (the lineage index), and whether it
        retries an aborted call. Reads and writes the core's state: on the event loop only."""
        started = time.perf_counter() if started is None else started
        ctx, digests = described.ctx, described.prefixes
        if described.substituted is not None:
            self.catalog.note_substitution(*described.substituted)
        resolution = self.index.resolve(ctx.rollout_id, ctx.items, ctx.request_fingerprint, digests)
        # Only the whole context's digest is kept: a prefix digest per item would be held for the call's life.
        call = Call(ctx, resolution, digests[-1], described.spec, body=described.body, started=started)
        call.retry_of = self._aborted.pop((ctx.rollout_id, digests[-1]), "")
        parent = resolution.parent
        call.prefix_requested = bool(self.settings.prefix_supply and parent is not None
                                     and parent.cum_tokens is not None)
        return call

    async def announce(self, call: Call) -> asyncio.Task[bool]:
        """Hand the call's CallStarted intent to the writer now; the task resolves True once it is durable (as a
        capture is), False if it cannot be (the call must then fail with 503).

        Returns once the intent is the writer's (queued in the producer, or behind the spool's lock), so every
        later record of the call follows it on the partition; its ack is awaited while the engine works.
        """
        task = asyncio.ensure_future(self._intent(call))
        await asyncio.sleep(0)  # the task's first step: the record is handed to the producer
        return task

    async def _intent(self, call: Call) -> bool:
        ctx = call.ctx
        try:
            await self.write(ctx.rollout_id, CallStarted(model_call_id=ctx.model_call_id, route=ctx.route,
                                                         created_at=ctx.created_at))
        except DurabilityError as exc:
            log.error("intent of call %s (rollout %s) not durable: %s", ctx.model_call_id, ctx.rollout_id, exc)
            return False
        return True

    def upstream_body(self, call: Call) -> dict[str, Any]:
        """What the engine gets; called once, right before dispatch (the call's dispatch version is read here)."""
        if call.versions is None:
            call.versions = self.clock.start_call()
        out = dict(call.body)
        out["return_token_ids"] = True
        out["logprobs"] = True
        top = out.get("top_logprobs")
        if not isinstance(top, int) or top < 0:
            out["top_logprobs"] = 0
        out["include_reasoning"] = True  # vLLM hides token ids when reasoning is hidden
        out["return_weight_versions"] = True
        out["cache_salt"] = self.cache_salt(call)
        if call.supplied_prefix is not None:
            kv = out.get("kv_transfer_params")
            kv = dict(kv) if isinstance(kv, dict) else {}
            kv["prompt_token_ids"] = call.supplied_prefix
            out["kv_transfer_params"] = kv
            call.prefix_route = PrefixRoute.CHAT  # unless a streamed call is sent the 0.34 way (call.dispatch)
        return out

    def cache_salt(self, call: Call, *, part: int = 0) -> str:
        """``producers.capture.call_versions.cache_salt`` on this interceptor's clock."""
        return cache_salt(self.clock, call, part=part)

    def lower_max_tokens(self, call: Call, upstream_body: dict[str, Any], value: int) -> None:
        """Resend budget after the engine refused the first one for its context window (recorded as a clamp)."""
        key = max_tokens_key(upstream_body)
        upstream_body[key] = call.body[key] = value
        call.ctx.facts = with_sent_max_tokens(call.ctx.facts, upstream_body)

    def _fitted(self, chat_body: dict[str, Any], engine: EngineInfo | None) -> tuple[dict[str, Any], bool, Any]:
        """The chat body with the sampling pin, a model the engine serves and a budget it can take; whether
        the budget was clamped; (requested, sent) when the model was substituted (``begin`` logs it)."""
        out = dict(chat_body)
        out.update(self.settings.sampling_overrides)
        forced = self.settings.upstream_model
        if engine is None:
            if forced:
                out["model"] = forced
            return out, False, None
        requested = out.get("model")
        model, why = engine.choose(requested, forced)
        if model is not None:
            out["model"] = model
        substituted = (requested, model) if why == "substituted" else None
        limit = engine.max_model_len(model)
        key = max_tokens_key(out)
        asked = out.get(key)
        if limit and isinstance(asked, int) and not isinstance(asked, bool) and asked > limit:
            # It can never be served. vLLM then caps it at max_model_len - prompt itself
            # (get_max_tokens); an engine that refuses instead is retried with the exact rest.
            out[key] = limit
            return out, True, substituted
        return out, False, substituted

    # -- after the engine answered ---------------------------------------------------
    async def complete(self, call: Call, data: dict[str, Any], prepare: Callable[[], Any] | None = None) -> Outcome:
        """Decide the call's one record and make it durable; ``prepare`` builds the harness's answer.

        ``prepare`` runs after the finish-reason verdict and before anything is written, so an
        answer that cannot be put in the harness's dialect (ValueError) leaves
        CallIncomplete(untranslatable_output), never a capture the harness did not receive.
        """
        ctx = call.ctx
        choices = data.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        finish = choice.get("finish_reason")
        if finish == "abort":
            self._aborted[(ctx.rollout_id, call.context_digest)] = ctx.model_call_id
            while len(self._aborted) > _ABORTED_MEMORY:
                self._aborted.popitem(last=False)
            return await self._incomplete_outcome(
                call, IncompleteReason.ABORTED, "the engine aborted the generation (vLLM finish_reason 'abort': "
                "paused for a weight sync, or /abort_requests); the harness was told to retry", Outcome.ABORTED)
        if finish == "error":
            return await self._incomplete_outcome(
                call, IncompleteReason.UPSTREAM_ERROR, "the engine ended the generation with finish_reason 'error'",
                Outcome.ENGINE_FAILED)
        if prepare is not None:
            try:
                call.answer = prepare()
            except ValueError as exc:
                return await self._incomplete_outcome(
                    call, IncompleteReason.UNTRANSLATABLE_OUTPUT,
                    f"the engine's answer cannot be expressed in the {ctx.dialect.value} dialect: {exc}",
                    Outcome.UNTRANSLATABLE)
        try:
            tokens = extract_chat_tokens(data)
        except PartialTokenMetadata as exc:
            return await self._incomplete_outcome(call, IncompleteReason.PARTIAL_TOKEN_METADATA, str(exc))
        if tokens is None:
            return await self._incomplete_outcome(
                call, IncompleteReason.MISSING_TOKEN_IDS, "engine returned no token ids (is it vLLM with return_token_ids?)")
        prefix_supplied = False
        if call.supplied_prefix is not None:
            if tokens.prompt_token_ids != call.supplied_prefix:
                how = (f"as the token_ids of POST {call.prefix_route}" if call.prefix_route == PrefixRoute.GENERATE
                       else "as kv_transfer_params.prompt_token_ids")
                return await self._incomplete_outcome(
                    call, IncompleteReason.PREFIX_NOT_APPLIED,
                    f"the engine reported {len(tokens.prompt_token_ids)} prompt ids, not the "
                    f"{len(call.supplied_prefix)} supplied {how}; serve with vLLM >= 0.32 (which honours them) "
                    "or turn prefix supply off", Outcome.PREFIX_FAILED)
            prefix_supplied = True
        message = choice.get("message") or {}
        items, carrier = chat_output_items(message)
        try:
            versions = version_facts(self.clock, call, choice, len(tokens.generation_token_ids))
        except ValueError as exc:
            return await self._incomplete_outcome(call, IncompleteReason.PARTIAL_TOKEN_METADATA,
                                                  f"the engine's weight_versions cannot be used: {exc}")
        captured = captured_call(
            ctx, tokens, items, carrier, served_model=str(data.get("model") or ""), response_id=call.response_id,
            context_digest=call.context_digest, finish_reason=str(finish or ""), **versions,
        )
        captured = self._with_lineage(call, captured, tokens.prompt_token_ids, prefix_supplied)
        try:
            await self.write(ctx.rollout_id, captured)
        except DurabilityError as exc:
            log.error("capture of call %s (rollout %s) not durable: %s", ctx.model_call_id, ctx.rollout_id, exc)
            return Outcome.NOT_DURABLE
        # A generation that ended on its stop token, or was cut short, can be spliced into a
        # child's prompt (prefix_supply.splice); one cut by a stop string cannot (its text and
        # ids disagree), so only the others are worth their index budget.
        on_stop = ends_with_stop(finish, choice.get("stop_reason"))
        keep = self.index.keep_tokens and (on_stop or finish == "length")
        self.index.record(
            ctx.rollout_id, call_id=ctx.model_call_id, continuation_fingerprint=captured.continuation_fingerprint,
            cum_len=captured.cum_len, digest=captured.digest, context_len=captured.continuation_context_len,
            context_digest=captured.continuation_context_digest,
            cum_tokens=(tokens.prompt_token_ids + tokens.generation_token_ids) if keep else None,
            ends_on_stop=on_stop,
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
        updates: dict[str, Any] = {"prefix_requested": call.prefix_requested,
                                   "prefix_supplied": prefix_supplied,
                                   "prefix_route": str(call.prefix_route) if prefix_supplied else ""}
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

    async def _incomplete_outcome(self, call: Call, reason: str, detail: str,
                                  outcome: Outcome = Outcome.INCOMPLETE) -> Outcome:
        call.failure = detail
        ok = await self.incomplete(call.ctx.rollout_id, call.ctx.model_call_id, reason, call.ctx.route, 200, detail)
        return outcome if ok else Outcome.NOT_DURABLE

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
        """Return once the event is durable (Kafka's ack, or the fsynced spool); DurabilityError otherwise."""
        event = make_event(rollout_id, body, self.source)
        with self.metrics.publish_seconds.time():
            where = await self.writer.write(self.settings.topics.rollout_events, key_for(rollout_id),
                                            encode_event(event))
        if where == "spool":
            self.metrics.spooled.inc()
        return event


def _replace(record: Any, updates: dict[str, Any]) -> Any:
    import dataclasses

    return dataclasses.replace(record, **updates)
