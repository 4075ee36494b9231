"""The lineage rules, in one place: which earlier call a request continues, and when a link holds (pure).

Four components decide lineage and must decide it the same way: the
interceptor before dispatch (``producers.capture.lineage_index``), the Gym lineage
adapter over the published calls (``consumers.gym``), the processor, which is
the authority (``processors.lineage``), and the rebuild, which re-verifies every
link it is handed (``consumers.rebuild.links``). They share these rules:

- **Request-time parent selection** (``select_parent``), as NeMo Gym resolves:
  the candidates are the calls whose continuation fingerprint is the request's
  fingerprint; one is kept only if the request's first ``context_len`` items
  hash to the context digest recorded for it; candidates with identical
  cumulative tokens (cum_len, digest) are interchangeable and collapse to the
  smallest call id. One survivor is RESOLVED; none is UNRESOLVED ``no_match``;
  several are UNRESOLVED ``ambiguous``. A request without model-authored turns
  (no fingerprint) is ROOT; an index that has never seen the rollout answers
  UNRESOLVED ``index_cold``.
- **Delta verification** (``delta_link_holds``), O(1): a delta prompt continues
  its parent only if the parent's cumulative digest is the ``parent_digest``
  the delta refers to and the lengths add up (``delta_parent_len``).
- **Prefix verification** (``prefix_verified``): a full prompt continues a call
  only if the digest of the prompt's prefix of the call's cumulative length is
  the call's digest.
- **A full prompt's parent** (``full_prompt_parent``), the processor's rule,
  applied again by the rebuild, with every call known, to the calls whose
  decision depended on the fold's order (a claim deferred as
  ``PARENT_MISSING``, a cold call nothing verified for yet): among the
  candidates (the calls with the request's fingerprint, and the claimed
  parent), the prefix-verified ones; one (or several with identical cumulative
  tokens, collapsed to the claim, else the smallest call id) is the parent;
  several different ones are ambiguous.

Nothing here guesses: a rule either verifies a link from digests or says why
not. Reason strings are defined once, here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from schemas.hashing import FINGERPRINT_VERSION, compute_digest, conversation_prefix_digests
from schemas.records import CallCaptured, ParentResolution

__all__ = [
    "AMBIGUOUS", "INDEX_COLD", "NO_MATCH", "PARENT_MISSING", "ParentCandidate", "ParentSelection",
    "PublishedCandidate", "delta_link_holds", "delta_parent_len", "full_prompt_parent", "prefix_verified",
    "published_candidates", "select_parent",
]

# Why a request's parent is UNRESOLVED (``parent_resolution_reason``).
NO_MATCH = "no_match"  # no earlier call has the request's fingerprint and context
AMBIGUOUS = "ambiguous"  # several calls with different tokens match: never guess between them
INDEX_COLD = "index_cold"  # this interceptor has not seen the rollout (another worker served it, or evicted)

# The processor's lineage note (``PARENT_MISSING:<claimed id>``) on a full-prompt call whose claimed
# parent was not in the state when it was folded: later in the log (a spool drained after its child)
# or lost. The processor stores the call as published (full prompt, claim kept) and the rebuild,
# which sees every call, decides its parent (``consumers.rebuild.links``).
PARENT_MISSING = "parent_missing"


class ParentCandidate(Protocol):
    """What the selection rule reads of an earlier call (the interceptor's ``IndexedCall`` has it)."""

    @property
    def call_id(self) -> str: ...
    @property
    def cum_len(self) -> int: ...
    @property
    def digest(self) -> str: ...
    @property
    def context_len(self) -> int: ...
    @property
    def context_digest(self) -> str: ...


C = TypeVar("C", bound=ParentCandidate)


@dataclass(frozen=True, slots=True)
class ParentSelection(Generic[C]):
    """A request's parent decision: ``parent`` is set exactly when ``status`` is RESOLVED."""

    status: ParentResolution
    parent: C | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class PublishedCandidate:
    """A published call as a selection candidate (``call`` is the CallCaptured it came from)."""

    call_id: str
    cum_len: int
    digest: str
    context_len: int
    context_digest: str
    call: CallCaptured

    @classmethod
    def of(cls, call: CallCaptured) -> PublishedCandidate:
        return cls(call.model_call_id, call.cum_len, call.digest, call.continuation_context_len,
                   call.continuation_context_digest, call)


def published_candidates(calls: Iterable[CallCaptured], fingerprint: str) -> list[PublishedCandidate]:
    """The published calls a request with ``fingerprint`` may continue (same fingerprint and version)."""
    return [PublishedCandidate.of(c) for c in calls
            if c.continuation_fingerprint == fingerprint and c.fingerprint_version == FINGERPRINT_VERSION]


def select_parent(
    fingerprint: str,
    items: list[dict[str, Any]],
    candidates: Callable[[], Sequence[C] | None],
    prefixes: Sequence[str] | None = None,
) -> ParentSelection[C]:
    """The request-time parent of a request (see the module docstring).

    ``candidates()`` returns the earlier calls whose continuation fingerprint is
    ``fingerprint``, or None when the index has never seen the rollout. It is
    called only for a request with a fingerprint, and the request's context
    digests are computed only when there is a candidate to compare them with,
    unless the caller hashed them already: ``prefixes``, exactly
    ``conversation_prefix_digests(items)``.
    """
    if not fingerprint:
        return ParentSelection(ParentResolution.ROOT)
    found = candidates()
    if found is None:
        return ParentSelection(ParentResolution.UNRESOLVED, reason=INDEX_COLD)
    if found:
        if prefixes is None:
            prefixes = conversation_prefix_digests(items)
        found = [
            c for c in found
            if c.context_digest and c.context_len < len(prefixes) and prefixes[c.context_len] == c.context_digest
        ]
    if len(found) > 1 and len({(c.cum_len, c.digest) for c in found}) == 1:
        found = [min(found, key=lambda c: c.call_id)]  # identical-token retries are interchangeable
    if len(found) == 1:
        return ParentSelection(ParentResolution.RESOLVED, found[0])
    return ParentSelection(ParentResolution.UNRESOLVED, reason=AMBIGUOUS if found else NO_MATCH)


def delta_parent_len(call: CallCaptured) -> int:
    """The cumulative length the parent of a delta call must have (its cum_len minus what it adds)."""
    return call.cum_len - len(call.prompt_token_ids) - len(call.generation_token_ids)


def delta_link_holds(call: CallCaptured, parent_cum_len: int, parent_digest: str) -> bool:
    """Whether a delta call continues a parent with this cumulative length and digest (O(1))."""
    return parent_digest == call.parent_digest and parent_cum_len == delta_parent_len(call)


def prefix_verified(prompt: Sequence[int], cum_len: int, digest: str) -> bool:
    """Whether a full prompt starts with the cumulative tokens (``cum_len``, ``digest``) of a call."""
    return cum_len <= len(prompt) and compute_digest(prompt[:cum_len]) == digest


def full_prompt_parent(
    prompt: Sequence[int], claimed: str | None, candidates: Mapping[str, tuple[int, str]]
) -> tuple[str | None, list[str]]:
    """The parent of a full prompt among ``candidates`` (call id -> (cum_len, digest)), and the verified ids.

    The verified candidates are those whose cumulative tokens prefix ``prompt``. One (or several with
    identical cumulative tokens: interchangeable, the claim preferred, else the smallest call id) is
    the parent; none or several different ones give no parent, and the sorted verified ids say which
    (several: ambiguous, never guessed between).
    """
    verified = {call_id: key for call_id, key in candidates.items() if prefix_verified(prompt, *key)}
    if len(set(verified.values())) != 1:
        return None, sorted(verified)
    return (claimed if claimed in verified else min(verified)), sorted(verified)
