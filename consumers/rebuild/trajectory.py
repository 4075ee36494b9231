"""The compact trajectory of one delivered chain (pure), O(tokens).

The token ids once, a one-byte loss mask (1 where the policy generated the
token), one log-prob per generated token, and per-call spans with the policy
version each call was served under and its generated tokens' versions as run-length
``VersionSpan``s at trajectory positions (``CallFacts.version_spans``, shifted). It verifies what it delivers: the running
length equals every call's ``cum_len``, spans are contiguous, and the whole
sequence hashes to the last call's captured digest, so the concatenated deltas
are exactly the tokens the engine saw (one hash per rollout, not per call).

Cost: the per-token work is C-level list and bytes concatenation and that one
hash (``compute_digest``); Python runs per call, never per token.
"""

from __future__ import annotations

from consumers.rebuild.links import Node
from consumers.rebuild.validity import first_non_finite
from schemas.errors import ContractError
from schemas.hashing import compute_digest
from schemas.policy_versions import shifted
from schemas.records import CallFacts, CallSpan, MaskCode, Trajectory, VersionSpan


class ChainError(ContractError):
    """A chain cannot be delivered token-exact (length, digest, log-prob or contiguity violation)."""

    code = MaskCode.BUILD_ERROR  # the mask reason it becomes


class NonFiniteLogProb(ChainError):
    """A generated token's log-prob is NaN or infinite: not the policy's log-prob, and not JSON."""

    code = MaskCode.NON_FINITE_LOG_PROB


class NonFiniteValue(ChainError):
    """Captured output (items, routed experts) holds a NaN or infinite number, or is not JSON."""

    code = MaskCode.NON_FINITE_VALUE


def chain_trajectory(chain: list[Node]) -> Trajectory:
    """The compact trajectory of a root-to-terminal chain, verified against the captured digests.

    Checks, each raising ``ChainError`` (or ``NonFiniteLogProb``) for the first call in
    chain order that fails it: one log-prob per generated token, every log-prob finite,
    the running length equal to the call's ``cum_len``, its version spans covering its
    generation; then the spans' contiguity and the chain's digest.
    """
    if not chain:
        raise ChainError("no chain to deliver")
    spans: list[CallSpan] = []
    position = 0
    for index, node in enumerate(chain):
        call = node.call
        generation = call.generation_token_ids
        if len(call.generation_log_probs) != len(generation):
            _check_log_probs(chain[:index])  # an earlier call's bad log-prob is the first failure
            raise ChainError(
                f"call {node.call_id}: {len(call.generation_log_probs)} log-probs for "
                f"{len(generation)} generated tokens; one per token is required"
            )
        start = position
        generation_start = start + len(node.delta)
        position = end = generation_start + len(generation)
        if end != call.cum_len:
            _check_log_probs(chain[:index + 1])
            raise ChainError(
                f"call {node.call_id}: rebuilt {end} tokens but the capture recorded "
                f"cum_len={call.cum_len}; the chain is not contiguous"
            )
        facts = call.facts
        version_spans: list[VersionSpan] = []
        if facts.version_spans:
            try:
                version_spans = call_version_spans(node.call_id, facts, len(generation), generation_start)
            except ChainError:
                _check_log_probs(chain[:index + 1])
                raise
        spans.append(CallSpan(model_call_id=node.call_id, start=start, generation_start=generation_start,
                              end=end, policy_version=facts.policy_version, version_spans=version_spans,
                              version_source=facts.version_spans_source if facts.version_spans else "",
                              dispatch_version=facts.dispatch_version))
    # The per-token arrays last, in a loop that allocates no other object the garbage collector
    # tracks: a collection triggered while they are young would walk every token again.
    token_ids: list[int] = []
    log_probs: list[float] = []
    mask = bytearray()
    for node in chain:
        call = node.call
        token_ids += node.delta
        token_ids += call.generation_token_ids
        log_probs += call.generation_log_probs
        mask += bytes(len(node.delta))
        mask += b"\x01" * len(call.generation_token_ids)
    if first_non_finite(log_probs) is not None:  # one pass over every log-prob, not a call per call
        _check_log_probs(chain)
    assert_spans_contiguous(spans, len(token_ids))
    if compute_digest(token_ids) != chain[-1].call.digest:
        raise ChainError(
            f"chain ending at call {chain[-1].call_id} does not hash to its captured digest: "
            "the rebuilt tokens are not the tokens the engine saw"
        )
    return Trajectory(token_ids=token_ids, loss_mask=bytes(mask), log_probs=log_probs,
                      prompt_len=spans[0].generation_start, spans=spans)


def _check_log_probs(calls: list[Node]) -> None:
    """``NonFiniteLogProb`` for the first of ``calls`` holding a NaN or infinite log-prob."""
    for node in calls:
        bad = first_non_finite(node.call.generation_log_probs)
        if bad is not None:
            raise NonFiniteLogProb(
                f"call {node.call_id}: generation_log_probs[{bad[0]}] = {bad[1]!r} is not a finite number; "
                "fix the capture: every generated token needs the finite log-prob the engine sampled it with"
            )


def call_version_spans(call_id: str, facts: CallFacts, generated: int, offset: int) -> list[VersionSpan]:
    """The call's version spans placed at ``offset`` in the trajectory; ChainError unless they cover
    its ``generated`` tokens exactly (a capture that says otherwise cannot be trusted per token)."""
    spans = facts.version_spans
    if not spans:
        return []
    at = 0
    for s in spans:
        if s.start != at or s.end <= s.start:
            break
        at = s.end
    if at != generated or spans[0].start != 0:
        raise ChainError(f"call {call_id}: version_spans {[(s.version, s.start, s.end) for s in spans]} do not "
                         f"cover its {generated} generated tokens in order; fix the capture's version spans")
    return shifted(spans, offset)


def assert_spans_contiguous(spans: list[CallSpan], total: int) -> None:
    """Each call's span starts where the previous ended and the spans cover every token."""
    position = 0
    for span in spans:
        if not (span.start == position <= span.generation_start <= span.end):
            raise ChainError(
                f"call {span.model_call_id}: span [{span.start}, {span.generation_start}, {span.end}) does not "
                f"continue at {position}; the delivered prompt would have a gap"
            )
        position = span.end
    if position != total:
        raise ChainError(f"spans cover {position} of {total} tokens")
