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

import dataclasses
from collections.abc import Callable

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
    return chain_tokens(chain, chain_spans(chain))


def chain_spans(chain: list[Node]) -> list[CallSpan]:
    """``chain_trajectory``'s per-call half: its spans and the checks that raise before any per-token work."""
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
        spans.append(_call_span(call.model_call_id, start, generation_start, end, facts.policy_version, version_spans,
                                facts.version_spans_source if facts.version_spans else "", facts.dispatch_version))
    return spans


def chain_tokens(chain: list[Node], spans: list[CallSpan]) -> Trajectory:
    """``chain_trajectory``'s per-token half, after ``chain_spans(chain)`` gave ``spans``."""
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


_SPAN_FIELDS = ("model_call_id", "start", "generation_start", "end", "policy_version", "version_spans",
                "version_source", "dispatch_version")


def _span_maker() -> Callable[..., CallSpan]:
    """``CallSpan(...)`` of the fields in ``_SPAN_FIELDS`` order, set through the slots' own setters.

    A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` (~1.5 µs a span here, one
    per call, ~6% of a 200-call rebuild); the setters make the same object (type, fields, equality, frozen
    after) in a third of it. Only while ``CallSpan`` is the record this was written for: the same fields and
    no ``__post_init__``; otherwise its constructor.
    """
    if (tuple(f.name for f in dataclasses.fields(CallSpan)) != _SPAN_FIELDS or hasattr(CallSpan, "__post_init__")
            or not hasattr(CallSpan, "__slots__")):
        return lambda *values: CallSpan(**dict(zip(_SPAN_FIELDS, values)))
    new = object.__new__
    s0, s1, s2, s3, s4, s5, s6, s7 = (getattr(CallSpan, name).__set__ for name in _SPAN_FIELDS)

    def make(model_call_id: str, start: int, generation_start: int, end: int, policy_version: str | None,
             version_spans: list[VersionSpan], version_source: str, dispatch_version: str | None) -> CallSpan:
        span: CallSpan = new(CallSpan)
        s0(span, model_call_id)
        s1(span, start)
        s2(span, generation_start)
        s3(span, end)
        s4(span, policy_version)
        s5(span, version_spans)
        s6(span, version_source)
        s7(span, dispatch_version)
        return span

    return make


_call_span = _span_maker()
