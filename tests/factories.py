"""Builders of valid contract records for tests (shared by every tier)."""

from __future__ import annotations

import hashlib
import itertools
import json

from schemas.codec import with_nested
from schemas.hashing import compute_digest
from schemas.records import (
    CallCaptured,
    CallFacts,
    CallIncomplete,
    CallStarted,
    ParentResolution,
    RetireRequested,
    RolloutEvent,
    RolloutFinished,
)
from schemas.wire_kinds import HashBytes

_counter = itertools.count()
# The fields the codec's conversion table carries as raw bytes (HashBytes); writers before that wrote their hex.
HASH_FIELDS = frozenset(name for kinds in with_nested({}).values() for name, kind in kinds.items()
                        if isinstance(kind, HashBytes))


def as_written_before_binary_hashes(datum):
    """An Avro datum (``schemas.codec.to_avro``) as writers before binary hashes wrote it: each hash as hex."""
    if isinstance(datum, dict):
        return {k: _hex(v) if k in HASH_FIELDS else as_written_before_binary_hashes(v) for k, v in datum.items()}
    if isinstance(datum, (list, tuple)):
        return type(datum)(as_written_before_binary_hashes(v) for v in datum)
    return datum


def _hex(value):
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list):
        return [_hex(v) for v in value]
    return value


def hashed(label: str) -> str:
    """A fingerprint or digest named by ``label`` in a test: the SHA-256 hex of it.

    The wire carries hashes as their raw bytes (schemas.codec.HashBytes), so a record's fingerprint
    must be real hex; tests name them by label and compare through this.
    """
    return hashlib.sha256(label.encode()).hexdigest()


def make_call(
    prompt: list[int],
    generation: list[int],
    *,
    call_id: str | None = None,
    parent: str | None = None,
    resolution: ParentResolution | None = None,
    created_at: float | None = None,
    log_probs: list[float] | None = None,
    delta_of: list[int] | None = None,
    text: str = "ok",
    requested_model: str = "policy",
    facts: dict | None = None,
    **fields: object,
) -> CallCaptured:
    """A CallCaptured over a full prompt; ``delta_of`` = the parent's cumulative ids to store a delta.

    ``facts`` go to CallFacts; other keyword arguments are CallCaptured fields.
    """
    n = next(_counter)
    call_id = call_id or f"{n:032x}"
    if resolution is None:
        resolution = ParentResolution.RESOLVED if parent else ParentResolution.ROOT
    full = list(prompt) + list(generation)
    stored_prompt = list(prompt)
    is_delta = False
    if delta_of is not None:
        assert prompt[: len(delta_of)] == list(delta_of)
        stored_prompt = list(prompt[len(delta_of) :])
        is_delta = True
    return CallCaptured(
        model_call_id=call_id,
        created_at=float(n) if created_at is None else created_at,
        prompt_token_ids=stored_prompt,
        prompt_is_delta=is_delta,
        generation_token_ids=list(generation),
        generation_log_probs=log_probs if log_probs is not None else [-0.5 - i / 8 for i in range(len(generation))],
        output_items_json=json.dumps(
            [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}]
        ),
        token_item_index=0,
        parent_call_id=parent if resolution is ParentResolution.RESOLVED else None,
        parent_resolution=resolution,
        parent_resolution_reason="no_match" if resolution is ParentResolution.UNRESOLVED else "",
        cum_len=len(full),
        digest=compute_digest(full),
        facts=CallFacts(route="/v1/chat/completions", requested_model=requested_model, **(facts or {})),  # type: ignore[arg-type]
        **fields,  # type: ignore[arg-type]
    )


def event(rollout_id: str, body, *, event_id: str | None = None, at: int | None = None) -> RolloutEvent:
    n = next(_counter)
    return RolloutEvent(
        event_id=event_id or f"ev{n:030x}",
        rollout_id=rollout_id,
        emitted_at=1_700_000_000_000_000 + (n if at is None else at),
        source="test",
        body=body,
    )


def incomplete(call_id: str | None = None, reason: str = "upstream_error") -> CallIncomplete:
    return CallIncomplete(model_call_id=call_id, reason=reason, http_status=500, route="/v1/chat/completions")


def finished(result: dict | None = None, **kw: object) -> RolloutFinished:
    return RolloutFinished(result_json=json.dumps(result or {"reward": 1.0}), **kw)  # type: ignore[arg-type]


def retire(snapshot_id: str, version: int) -> RetireRequested:
    return RetireRequested(snapshot_id=snapshot_id, version=version, consumer="test")


def started(call_id: str) -> CallStarted:
    return CallStarted(model_call_id=call_id, route="/v1/chat/completions", created_at=1_700_000_000.0)
