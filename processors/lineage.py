"""The processor's lineage authority: verify parent claims, resolve cold calls (pure).

The processor sees every call of a rollout in order, so it decides each call's
parent from the events alone, whatever the interceptor that served it knew:

- A full-prompt call: the candidates are the calls whose continuation
  fingerprint equals the call's request fingerprint (plus the parent the
  interceptor claimed); a candidate is verified when the digest of the child's
  prompt prefix of the candidate's cumulative length equals the candidate's
  digest. One verified candidate (or several with identical tokens, collapsed
  to the smallest call id, preferring the claim) is the parent; several
  different ones are ambiguous; none leaves the call a root (no model-authored
  history, as the interceptor said) or unresolved. The prompt is then stored as a delta against the
  verified parent, so state and snapshots grow with new tokens only.
  A claimed parent that is not in the state (later in the log: a spool drained
  after its child; or lost without a marker) is not decided here, since the
  answer would depend on the order of the events: the call is stored as
  published (full prompt, claim kept), noted ``parent_missing:<claimed>``, and
  the rebuild, which sees every call, applies the same rule or recovers the call
  onto its nearest verified ancestor, as NeMo Gym's builder does.
- A delta call: its claim is verified in O(1): the parent exists, its digest is
  the ``parent_digest`` the delta refers to, and the lengths add up. The builder
  re-verifies the full digest after materialising the delta.

The digest and length checks are ``schemas.lineage_rules``', shared with the
interceptor and the rebuild, so every component verifies a link the same way.

Every decision is recorded as a ``lineage_note`` for replay and diagnosis.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from schemas.lineage_rules import AMBIGUOUS, NO_MATCH, PARENT_MISSING, delta_link_holds, full_prompt_parent
from schemas.records import CallCaptured, ParentResolution

if TYPE_CHECKING:
    from processors.txn import Txn

VERIFIED = "verified"
RESOLVED_BY_PROCESSOR = "resolved_by_processor"
ROOT = "root"


def decide(txn: Txn, call: CallCaptured) -> tuple[CallCaptured, str]:
    """The call as it is stored (verified lineage, delta prompt) and how that was decided."""
    if call.prompt_is_delta:
        return call, _verify_delta(txn, call)
    return _resolve_full(txn, call)


def _verify_delta(txn: Txn, call: CallCaptured) -> str:
    assert call.parent_call_id is not None  # record invariant: delta => RESOLVED
    # A call cannot continue itself; its own body may be in the state when its event is redone.
    parent = txn.call_link(call.parent_call_id) if call.parent_call_id != call.model_call_id else None
    if parent is None:
        return f"delta_parent_missing:{call.parent_call_id}"
    if not delta_link_holds(call, *parent):
        return f"delta_parent_mismatch:{call.parent_call_id}"
    return VERIFIED


def _resolve_full(txn: Txn, call: CallCaptured) -> tuple[CallCaptured, str]:
    claimed = call.parent_call_id
    prompt = call.prompt_token_ids
    candidates: dict[str, tuple[int, str]] = {}
    if call.request_fingerprint:
        index = txn.get_index(call.request_fingerprint)
        for entry in index.entries if index else ():
            candidates[entry.call_id] = (entry.cum_len, entry.digest)
    if claimed is not None and claimed not in candidates:
        parent = txn.call_link(claimed)
        if parent is not None:
            candidates[claimed] = parent
        elif claimed != call.model_call_id:
            # The claimed parent is not in the state: later in the log (a spool drained after its
            # child) or lost without a marker. A decision now would depend on the order the events
            # came in, so none is made: the call is kept as published (full prompt, claim) and the
            # rebuild, which sees every call, decides with the same rule, or recovers it onto its
            # nearest verified ancestor (``consumers.rebuild.links``).
            return call, f"{PARENT_MISSING}:{claimed}"
    candidates.pop(call.model_call_id, None)
    parent_id, verified = full_prompt_parent(prompt, claimed, candidates)
    if parent_id is not None:
        cum_len, digest = candidates[parent_id]
        stored = dataclasses.replace(
            call,
            parent_call_id=parent_id,
            parent_resolution=ParentResolution.RESOLVED,
            parent_resolution_reason="",
            parent_digest=digest,
            prompt_token_ids=prompt[cum_len:],
            prompt_is_delta=True,
        )
        if claimed == parent_id:
            return stored, VERIFIED
        note = RESOLVED_BY_PROCESSOR if claimed is None else f"{RESOLVED_BY_PROCESSOR}:claimed={claimed}"
        return stored, note
    if verified:
        reason, note = AMBIGUOUS, f"{AMBIGUOUS}:{','.join(verified)}"
    elif not call.request_fingerprint and claimed is None and call.parent_resolution is ParentResolution.ROOT:
        # No model-authored history (Gym's ROOT). An event that says UNRESOLVED without a
        # fingerprint contradicts itself: it stays unresolved (fail closed), never promoted.
        return _as(call, ParentResolution.ROOT, ""), ROOT
    elif claimed is not None:
        reason, note = "parent_digest_mismatch", f"parent_digest_mismatch:claimed={claimed}"
    else:
        reason = call.parent_resolution_reason or NO_MATCH
        note = f"unresolved:{reason}"
    return _as(call, ParentResolution.UNRESOLVED, reason), note


def _as(call: CallCaptured, resolution: ParentResolution, reason: str) -> CallCaptured:
    if call.parent_resolution is resolution and call.parent_resolution_reason == reason and not call.parent_call_id:
        return call
    return dataclasses.replace(
        call, parent_call_id=None, parent_resolution=resolution, parent_resolution_reason=reason, parent_digest=""
    )
