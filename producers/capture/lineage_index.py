"""Request-time lineage: which earlier call of this rollout does a request continue?

A bounded, per-rollout index of the calls this interceptor served. Resolution
is the one request-time rule of ``schemas.lineage_rules`` (NeMo Gym's: the
fingerprint of the request's model-authored turns, the context digest, the
identical-token collapse); this module only supplies the candidates. A rollout
this process has not seen (another worker served it, or it was evicted) is
UNRESOLVED ``index_cold``. The processor re-verifies every claim, so eviction
costs bytes (no delta record), never correctness.

The index is metadata only (a few hundred bytes per call) unless prefix supply
is on, when each call's cumulative ids are kept too (4 bytes per token, within
``max_tokens``) so that the next call can send them to the engine.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas.lineage_rules import ParentSelection, select_parent
from schemas.records import ParentResolution


@dataclass(slots=True)
class IndexedCall:
    call_id: str
    cum_len: int
    digest: str
    context_len: int
    context_digest: str
    cum_tokens: array | None = None
    ends_on_stop: bool = True  # False: cut short (length); prefix supply then finds the turn end itself


@dataclass(slots=True)
class _Rollout:
    by_fingerprint: dict[str, list[str]] = field(default_factory=dict)
    calls: dict[str, IndexedCall] = field(default_factory=dict)
    tokens: int = 0


Resolution = ParentSelection[IndexedCall]  # status, parent (an IndexedCall when RESOLVED), reason

ROOT: Resolution = ParentSelection(ParentResolution.ROOT)


class LineageIndex:
    """LRU over rollouts, bounded by rollout count and stored tokens."""

    def __init__(self, *, max_rollouts: int = 65_536, max_tokens: int = 16_000_000, keep_tokens: bool = False) -> None:
        self.max_rollouts = max_rollouts
        self.max_tokens = max_tokens
        self.keep_tokens = keep_tokens
        self._rollouts: OrderedDict[str, _Rollout] = OrderedDict()
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._rollouts)

    def resolve(self, rollout_id: str, items: list[dict[str, Any]], fingerprint: str,
                prefixes: Sequence[str] | None = None) -> Resolution:
        """The parent decision for a request, computed once, before dispatch (``prefixes``: its context
        digests when already hashed, ``schemas.lineage_rules.select_parent``). Reads and reorders the
        index: call it on the event loop only."""
        return select_parent(fingerprint, items, lambda: self._candidates(rollout_id, fingerprint), prefixes)

    def _candidates(self, rollout_id: str, fingerprint: str) -> list[IndexedCall] | None:
        """The indexed calls with this continuation fingerprint; None when the rollout is not indexed."""
        rollout = self._rollouts.get(rollout_id)
        if rollout is None:
            return None
        self._rollouts.move_to_end(rollout_id)
        ids = dict.fromkeys(rollout.by_fingerprint.get(fingerprint, ()))
        return [rollout.calls[c] for c in ids if c in rollout.calls]

    def record(
        self,
        rollout_id: str,
        *,
        call_id: str,
        continuation_fingerprint: str,
        cum_len: int,
        digest: str,
        context_len: int,
        context_digest: str,
        cum_tokens: list[int] | None = None,
        ends_on_stop: bool = True,
    ) -> None:
        """Index a call once its capture is durable (so a continuation can only see durable parents)."""
        rollout = self._rollouts.get(rollout_id)
        if rollout is None:
            rollout = self._rollouts[rollout_id] = _Rollout()
        else:
            self._rollouts.move_to_end(rollout_id)
        if call_id in rollout.calls:
            return
        tokens = array("I", cum_tokens) if (self.keep_tokens and cum_tokens is not None) else None
        rollout.calls[call_id] = IndexedCall(call_id, cum_len, digest, context_len, context_digest, tokens,
                                             ends_on_stop)
        rollout.by_fingerprint.setdefault(continuation_fingerprint, []).append(call_id)
        if tokens is not None:
            rollout.tokens += len(tokens)
            self._tokens += len(tokens)
        self._evict(keep=rollout_id)

    def forget(self, rollout_id: str) -> None:
        """Drop a finished rollout (its calls can no longer be continued usefully)."""
        rollout = self._rollouts.pop(rollout_id, None)
        if rollout is not None:
            self._tokens -= rollout.tokens

    def _evict(self, *, keep: str) -> None:
        while len(self._rollouts) > 1 and (len(self._rollouts) > self.max_rollouts or self._tokens > self.max_tokens):
            oldest = next(iter(self._rollouts))
            if oldest == keep:
                self._rollouts.move_to_end(keep)
                continue
            self.forget(oldest)
