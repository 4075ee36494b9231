"""A call's policy-version facts and its engine prefix-cache salt, both read from the ``VersionClock``.

``version_facts`` decides which version sampled each generated token of a completed call, and where
that knowledge comes from (``VersionSource``): the engine's own spans, else the parts of a call
continued across aborts, else a stream's observed marks, else the bracket of dispatch and
completion. ``cache_salt`` keeps vLLM from reusing KV across versions. Pure: no I/O, no framework.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from producers.capture.version_clock import CallVersions, VersionClock
from schemas.policy_versions import (
    UNNAMED_VERSION,
    bracket_spans,
    engine_spans,
    observed_spans,
    part_spans,
    versions_of,
)
from schemas.records import VersionSource

if TYPE_CHECKING:
    from producers.capture.core import Call

__all__ = ["cache_salt", "version_facts"]


def cache_salt(clock: VersionClock, call: Call, *, part: int = 0) -> str:
    """The engine's prefix-cache salt for ``call``'s first request (``part`` 0) or its continuation ``part``.

    vLLM's prefix-cache keys do not include the weights: without a salt per version, a prompt whose
    prefix was cached before a weight update reuses KV the old weights computed, and its tokens are
    sampled from neither policy. The salt names the current version (its step and label); a salt the
    harness sent is kept, joined in front (its own cache partition still holds, within a version).
    A continuation is sent while the engine is paused for an update, possibly before the update is
    announced here: its salt is its own (call and part), so it reuses no KV at all and its whole
    prefix is computed by the weights that generate it.
    """
    label = clock.label  # the version the call's tokens are labelled with
    ours = f"tokentrail-policy:{clock.book.step_of(label)}:{label}" if label is not None else "tokentrail-policy:none"
    if part:
        ours += f"|continuation:{call.ctx.model_call_id}:{part}"
    theirs = call.body.get("cache_salt")
    return f"{theirs}|{ours}" if isinstance(theirs, str) and theirs else ours


def version_facts(clock: VersionClock, call: Call, choice: dict[str, Any], generated: int) -> dict[str, Any]:
    """The call's policy-version facts: per-token spans, where they come from, dispatch and completion.

    The engine's own spans win when they name a version (vLLM labels every span "default"
    until a trainer names the weights: then they name none); else a call continued across
    aborts is labelled by its parts; else a stream's observed marks; else the bracket of
    dispatch and completion. ValueError: the engine's spans do not cover the generation.
    """
    cv: CallVersions = call.versions if call.versions is not None else clock.start_call()
    cv.completion = clock.label
    raw = choice.get("weight_versions")
    spans, source = [], VersionSource.NONE
    if raw is not None:
        reported = engine_spans(raw, generated)
        if versions_of(reported) != [UNNAMED_VERSION]:
            spans, source = reported, VersionSource.ENGINE
    if not spans and cv.part_ends:
        # Continued across aborts: a part's tokens were generated between its dispatch and its abort,
        # so the part bounds say which version made them, streamed or not. A stream's marks do not:
        # chunks generated before a pause can reach the interceptor after the announcement that follows
        # it (a CI run labelled 541 tokens of the old weights with the new version). Part 0 is unknown,
        # and the rollout masked, unless the version at its abort is the version at its dispatch.
        spans, source = part_spans(cv.dispatch, cv.part_ends, cv.completion, generated), VersionSource.BRACKET
    if not spans and call.ctx.facts.streamed:
        spans, source = observed_spans(cv.marks, generated), VersionSource.OBSERVED
    if not spans:
        spans, source = bracket_spans(cv.dispatch, cv.completion, generated), VersionSource.BRACKET
    if not spans:
        source = VersionSource.NONE
    named = [v for v in versions_of(spans) if v]
    if source is VersionSource.ENGINE:
        label_source = "engine"
    else:
        label_source = clock.origin if named else ""
    return {"version_spans": spans, "version_spans_source": str(source), "dispatch_version": cv.dispatch,
            "continued": call.continued, "retry_of": call.retry_of,
            "completion_version": cv.completion,
            "policy_version": ",".join(named) if named else None, "policy_version_source": label_source}
