"""NeMo Gym interop: ``TokenSink``, ``TokenSource`` and a lineage resolver over tokentrail's topics.

A NeMo Gym model server can use tokentrail as its framework-owned transport:
the adapters have Gym's method shapes (``put``, ``mark_incomplete``, ``close``;
``freeze``, ``drop``, ``close``; ``resolve``, ``is_process_shared``, ``close``) and
take or return Gym ``TokenEntry``-shaped records (a mapping, or any object with
``model_dump()``; ``entry_factory`` turns returned dicts into Gym's class).

- ``put`` publishes a ``CallCaptured`` on ``tokentrail.rollout-events`` and
  returns once Kafka acknowledged it (``acks=all``): durable, and visible to any
  reader of the rollout's partition. A byte-identical re-put is a no-op for the
  fold; a conflicting one marks the rollout incomplete.
- ``mark_incomplete`` publishes a ``CallIncomplete``; it changes the version.
- ``freeze`` publishes ``RolloutFinished`` and answers with the processor's
  decision: it reads the rollout's events back (``consumers.replay.eventlog``) and runs
  the same pure fold (``processors.fold``) through its own finish event. The
  fold is deterministic, so this equals the live processor's snapshot: same
  ``snapshot_id``, same ``version``, same incomplete flag. Freezing an unchanged
  rollout again answers the snapshot its first freeze emitted (the fold emits
  no second record for it).
- ``drop`` publishes ``RetireRequested(snapshot_id, version)`` and reads back
  whether the fold retired the rollout: False when the state changed since.

- ``begin_call`` (Gym's optional intent) publishes a ``CallStarted`` before the
  call is dispatched; a freeze with an intent and no ``put`` for that call is
  incomplete (``intent_without_capture``).

Not supported: delta entries whose parent was not put through this process and
cannot be found in the log.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from consumers.replay.eventlog import EventLog
from processors.replay import MemoryState, Replayed, RolloutHeader, replay
from schemas.codec import encode_event
from schemas.errors import ContractError
from schemas.hashing import FINGERPRINT_VERSION, assistant_fingerprint, compute_digest
from schemas.ids import new_event_id, validate_model_call_id, validate_rollout_id
from schemas.kafka.bridge import AckedProducer
from schemas.kafka.config import producer_config
from schemas.kafka.topics import ROLLOUT_EVENTS, key_for
from schemas.lineage_rules import published_candidates, select_parent
from schemas.records import (
    CallCaptured,
    CallFacts,
    CallIncomplete,
    CallStarted,
    IncompleteReason,
    ParentResolution,
    RetireRequested,
    RolloutEvent,
    RolloutFinished,
)

GYM_SCHEMA_VERSION = 5
GYM_ROUTE = "/gym/token-capture"
MARKED_INCOMPLETE = IncompleteReason.MARKED_INCOMPLETE  # alias; the member is its one home


@dataclass(frozen=True, slots=True)
class TokenCaptureSnapshot:
    rollout_id: str
    entries: tuple[Any, ...]
    incomplete: bool
    snapshot_id: str
    version: int


@dataclass(frozen=True, slots=True)
class LineageMatch:
    model_call_id: str
    cumulative_token_ids: list[int]
    cum_len: int
    digest: str


@dataclass(frozen=True, slots=True)
class LineageResolution:
    status: str  # "root" | "resolved" | "unresolved"
    match: LineageMatch | None = None
    reason: str = ""


def entry_dict(entry: Any) -> dict[str, Any]:
    if isinstance(entry, Mapping):
        return dict(entry)
    if hasattr(entry, "model_dump"):
        return entry.model_dump()
    raise ContractError(f"a Gym token entry must be a mapping or a pydantic model, got {type(entry).__name__}")


def entry_to_call(entry: Mapping[str, Any], parent_digest: str = "") -> CallCaptured:
    """The CallCaptured a Gym TokenEntry (schema v3-v5) is published as."""
    version = int(entry.get("schema_version", GYM_SCHEMA_VERSION))
    if not 3 <= version <= GYM_SCHEMA_VERSION:
        raise ContractError(f"Gym token entry schema_version {version}: this adapter reads versions 3..5")
    resolution_name = entry.get("parent_resolution")
    if resolution_name is None:
        raise ContractError("Gym token entry without parent_resolution (pre-v3 records are refused)")
    resolution = ParentResolution(str(getattr(resolution_name, "value", resolution_name)).upper())
    prompt, generation = list(entry["prompt_token_ids"]), list(entry["generation_token_ids"])
    delta = bool(entry.get("prompt_is_delta", False))
    cum_len, digest = entry.get("cum_len"), entry.get("digest")
    if cum_len is None or digest is None:
        if delta:
            raise ContractError("a delta Gym entry must carry cum_len and digest")
        cum_len, digest = len(prompt) + len(generation), compute_digest(prompt + generation)
    routed = entry.get("routed_experts")
    return CallCaptured(
        model_call_id=str(entry["model_call_id"]), created_at=float(entry.get("created_at", 0.0)),
        model=str(entry.get("model", "")), prompt_token_ids=prompt, prompt_is_delta=delta,
        generation_token_ids=generation, generation_log_probs=[float(x) for x in entry["generation_log_probs"]],
        output_items_json=json.dumps(entry.get("output_items", []), separators=(",", ":"), ensure_ascii=False),
        token_item_index=entry.get("token_item_index"),
        routed_experts_json=None if routed is None else json.dumps(routed, separators=(",", ":")),
        parent_call_id=entry.get("parent_call_id"), parent_resolution=resolution,
        parent_resolution_reason=str(entry.get("parent_resolution_reason", "")),
        cum_len=int(cum_len), digest=str(digest), parent_digest=parent_digest,
        # Gym entries carry no request fingerprint; the fold keeps an UNRESOLVED one unresolved.
        continuation_fingerprint=str(entry.get("continuation_fingerprint", "")),
        continuation_context_len=int(entry.get("continuation_context_len", 0)),
        continuation_context_digest=str(entry.get("continuation_context_digest", "")),
        fingerprint_version=int(entry.get("fingerprint_version") or FINGERPRINT_VERSION),
        prefix_requested=bool(entry.get("prefix_requested", False)),
        prefix_supplied=bool(entry.get("prefix_supplied", False)),
        facts=CallFacts(route=GYM_ROUTE, requested_model=str(entry.get("model", "")),
                        served_model=str(entry.get("model", ""))),
    )


def call_to_entry(rollout_id: str, call: CallCaptured) -> dict[str, Any]:
    """The Gym TokenEntry (v5) fields of a published call: ``entry_to_call``'s inverse."""
    return {
        "schema_version": GYM_SCHEMA_VERSION, "rollout_id": rollout_id, "model_call_id": call.model_call_id,
        "model": call.model, "prompt_token_ids": list(call.prompt_token_ids),
        "generation_token_ids": list(call.generation_token_ids),
        "generation_log_probs": list(call.generation_log_probs),
        "routed_experts": None if call.routed_experts_json is None else json.loads(call.routed_experts_json),
        "output_items": json.loads(call.output_items_json), "token_item_index": call.token_item_index,
        "created_at": call.created_at, "parent_call_id": call.parent_call_id, "cum_len": call.cum_len,
        "digest": call.digest, "parent_resolution": call.parent_resolution.value.lower(),
        "continuation_fingerprint": call.continuation_fingerprint,
        "continuation_context_len": call.continuation_context_len,
        "continuation_context_digest": call.continuation_context_digest,
        "parent_resolution_reason": call.parent_resolution_reason, "fingerprint_version": call.fingerprint_version,
        "prompt_is_delta": call.prompt_is_delta, "prefix_requested": call.prefix_requested,
        "prefix_supplied": call.prefix_supplied,
    }


class _Client:
    """Shared plumbing: one acked producer and one event-log reader per adapter instance."""

    def __init__(self, bootstrap: str, topic: str, source: str) -> None:
        self.bootstrap, self.topic, self.source = bootstrap, topic, source
        self._producer: AckedProducer | None = None
        self._log: EventLog | None = None
        self._log_lock = asyncio.Lock()

    async def publish(self, rollout_id: str, body: Any) -> str:
        validate_rollout_id(rollout_id)
        call_id = getattr(body, "model_call_id", None)
        if call_id is not None:
            # The processor would dead-letter it; the Gym caller hears it here, before anything is published.
            validate_model_call_id(call_id, field=f"{type(body).__name__}.model_call_id")
        if self._producer is None:
            self._producer = AckedProducer(producer_config(self.bootstrap))
        event = RolloutEvent(event_id=new_event_id(), rollout_id=rollout_id, emitted_at=time.time_ns() // 1000,
                             source=self.source, body=body)
        await self._producer.produce(self.topic, key_for(rollout_id), encode_event(event))
        return event.event_id

    async def read(self, fn: Callable[[Iterator[Any]], Any], rollout_id: str) -> Any:
        """Run ``fn`` over the rollout's logged records in a worker thread (one read at a time)."""
        async with self._log_lock:
            if self._log is None:
                self._log = await asyncio.to_thread(EventLog, self.bootstrap, self.topic)
            log = self._log
            return await asyncio.to_thread(lambda: fn(log.rollout_events(rollout_id)))

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.close()
        async with self._log_lock:
            if self._log is not None:
                await asyncio.to_thread(self._log.close)
                self._log = None


def _calls_in(records: Iterator[Any]) -> dict[str, CallCaptured]:
    """First published body per call id (what the fold keeps), in log order."""
    calls: dict[str, CallCaptured] = {}
    for _ in _decoded(records, calls):
        pass
    return calls


def _decoded(records: Iterator[Any], calls: dict[str, CallCaptured]) -> Iterator[Any]:
    """The records, each call's first body kept in ``calls``; an undecodable record passes through as it is.

    The fold dead-letters an undecodable record and marks its rollout incomplete, as the live
    processor does, so a freeze answers what the processor decided instead of raising.
    """
    for record in records:
        try:
            body = record.decode().body
        except ContractError:
            body = None
        if isinstance(body, CallCaptured):
            calls.setdefault(body.model_call_id, body)
        yield record


class TokenSink:
    """Gym ``TokenSink`` over ``tokentrail.rollout-events``."""

    def __init__(self, bootstrap: str, *, topic: str = ROLLOUT_EVENTS, source: str = "gym-token-sink") -> None:
        self._client = _Client(bootstrap, topic, source)
        self._digests: dict[tuple[str, str], str] = {}  # (rollout, call) -> digest, for delta entries

    async def put(self, entry: Any) -> None:
        data = entry_dict(entry)
        rollout_id = str(data["rollout_id"])
        parent_digest = ""
        if data.get("prompt_is_delta"):
            parent_digest = await self._parent_digest(rollout_id, str(data.get("parent_call_id")))
        call = entry_to_call(data, parent_digest)
        await self._client.publish(rollout_id, call)
        self._digests[(rollout_id, call.model_call_id)] = call.digest

    async def _parent_digest(self, rollout_id: str, parent_id: str) -> str:
        known = self._digests.get((rollout_id, parent_id))
        if known is None:
            calls = await self._client.read(_calls_in, rollout_id)
            parent = calls.get(parent_id)
            if parent is None:
                raise ContractError(f"delta entry of rollout {rollout_id!r} names parent {parent_id!r}, which was "
                                    "never put: put the parent first, or put the full prompt")
            known = parent.digest
        return known

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        """Gym's optional pre-dispatch intent: durable when it returns; raises (failing the call) otherwise."""
        await self._client.publish(rollout_id, CallStarted(model_call_id=model_call_id, created_at=time.time()))

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        marker = CallIncomplete(reason=MARKED_INCOMPLETE, model_call_id=model_call_id or None,
                                detail="marked incomplete by a NeMo Gym TokenSink client", created_at=time.time())
        await self._client.publish(rollout_id, marker)

    async def close(self) -> None:
        await self._client.close()


class TokenSource:
    """Gym ``TokenSource`` whose answers are the processor's fold, re-run over the rollout's log."""

    def __init__(self, bootstrap: str, *, topic: str = ROLLOUT_EVENTS, source: str = "gym-token-source",
                 entry_factory: Callable[[dict[str, Any]], Any] | None = None) -> None:
        self._client = _Client(bootstrap, topic, source)
        self._entry_factory = entry_factory or (lambda d: d)

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        event_id = await self._client.publish(rollout_id, RolloutFinished())
        snapshot, calls = await self._client.read(lambda rs: _fold_until(rs, rollout_id, event_id), rollout_id)
        entries = tuple(self._entry_factory(call_to_entry(rollout_id, calls[sc.call.model_call_id]))
                        for sc in snapshot.calls)
        return TokenCaptureSnapshot(rollout_id=rollout_id, entries=entries, incomplete=snapshot.incomplete,
                                    snapshot_id=snapshot.snapshot_id, version=snapshot.version)

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        event_id = await self._client.publish(rollout_id, RetireRequested(snapshot_id=snapshot_id, version=version,
                                                                          consumer="gym-token-source"))
        header = await self._client.read(lambda rs: _header_after(rs, rollout_id, event_id), rollout_id)
        return header is not None and header.retired and header.snapshot_id == snapshot_id and header.version == version

    async def close(self) -> None:
        await self._client.close()


def _fold_until(records: Iterator[Any], rollout_id: str, event_id: str) -> tuple[Any, dict[str, CallCaptured]]:
    calls: dict[str, CallCaptured] = {}
    state = MemoryState()
    step = _replay_through(_decoded(records, calls), rollout_id, event_id, state, "finish")
    if step.snapshots:
        return step.snapshots[-1], calls
    # A freeze of an unchanged, frozen rollout emits nothing (one record per attempt): its answer is
    # the snapshot that rollout's freeze already emitted, the same identity.
    frozen = state.frozen_snapshot(rollout_id)
    if frozen is None:
        raise ContractError(f"rollout {rollout_id!r} did not freeze: it was retired earlier")
    return frozen, calls


def _header_after(records: Iterator[Any], rollout_id: str, event_id: str) -> RolloutHeader | None:
    state = MemoryState()
    _replay_through(_decoded(records, {}), rollout_id, event_id, state, "retire")
    return state.header(rollout_id)


def _replay_through(records: Iterator[Any], rollout_id: str, event_id: str, state: MemoryState,
                    what: str) -> Replayed:
    """The fold's step of this adapter's own event, the rollout's log folded up to it into ``state``."""
    # Fold the whole log up to the event; keep only its last step.
    last = deque(replay(records, state=state, key=key_for(rollout_id), stop_after=event_id), maxlen=1)
    step = last[0] if last else None
    if step is None or step.event_id != event_id:
        raise ContractError(f"the {what} event of rollout {rollout_id!r} is not in the log")
    return step


class TokenLineage:
    """Gym ``LineageStore``: resolves a request against the rollout's published calls (never guesses)."""

    def __init__(self, bootstrap: str, *, topic: str = ROLLOUT_EVENTS) -> None:
        self._client = _Client(bootstrap, topic, "gym-lineage")

    def is_process_shared(self) -> bool:
        return True  # the log is the shared backend: every worker reads the same partition

    async def resolve(self, rollout_id: str, request_items: list[dict[str, Any]]) -> LineageResolution:
        fingerprint = assistant_fingerprint(request_items)
        if not fingerprint:
            return LineageResolution("root")
        calls = await self._client.read(_calls_in, rollout_id)
        # The interceptor's request-time rule, over every published call instead of one worker's index.
        chosen = select_parent(fingerprint, request_items, lambda: published_candidates(calls.values(), fingerprint))
        if chosen.parent is None:
            return LineageResolution(chosen.status.value.lower(), reason=chosen.reason)
        match = chosen.parent.call
        tokens = _cumulative(match, calls)
        if tokens is None:
            return LineageResolution("unresolved", reason="delta_chain_unreconstructable")
        return LineageResolution("resolved", LineageMatch(match.model_call_id, tokens, match.cum_len, match.digest))

    async def close(self) -> None:
        await self._client.close()


def _cumulative(call: CallCaptured, calls: dict[str, CallCaptured]) -> list[int] | None:
    """Full prompt + generation of a call, following delta parents; None when unverifiable."""
    parts: list[list[int]] = []
    cur = call
    while True:
        parts.append(cur.prompt_token_ids + cur.generation_token_ids)
        if not cur.prompt_is_delta:
            break
        parent = calls.get(cur.parent_call_id or "")
        if parent is None or len(parts) > len(calls):
            return None  # a missing parent, or a cycle
        cur = parent
    tokens = [t for part in reversed(parts) for t in part]
    return tokens if len(tokens) == call.cum_len and compute_digest(tokens) == call.digest else None
