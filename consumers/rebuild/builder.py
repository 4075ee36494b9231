"""``rebuild(snapshot, rules) -> RebuiltRollout``: what a trainer may train on, and why (pure).

Guarantees:
- Deterministic: the same snapshot and rules give the same record, byte for
  byte; the order of calls inside the snapshot does not matter.
- Linear in tokens: deltas are never materialised per call; one digest over the
  delivered chain verifies it end to end.
- Fail closed: every ambiguity ends in quarantine or ``mask_sample: true`` with
  a structured reason; an exception inside the build masks the rollout with the
  error, it never escapes.

Masking (``delivery_mode="terminal"``): capture incomplete; late writes (rule);
no calls; all calls side calls; no generated tokens; no terminal attributable
(declared call missing/empty/side, ambiguous fork, no allowed method); an
unresolved parent boundary inside the delivered ancestry; the terminal is an
unresolved retry; a build error (``non_finite_log_prob`` / ``non_finite_value``
when captured numbers are NaN or infinite); a result that is not strict JSON
(``invalid_result``, see ``validity.checked_record``). Other roots, chains,
boundaries and retries are reported in the metrics, never a reason by
themselves. ``delivery_mode="gym"`` adds NeMo Gym's rules: roots != 1,
chains != 1, any unresolved parent or retry. ``delivery_mode="traces"`` delivers
the terminal chain as ``"terminal"`` does and every trace of the forest in
``traces`` (``consumers.rebuild.traces``); the traces decide the mask instead of
the delivered chain's lineage: a masked trace of a kind in
``rules.mask_rollout_kinds`` masks the rollout (``trace_masked``), the projection is
per trace (the top-level ``response_json`` is None: it would repeat a trunk's), a compaction
segment linked to its summary is not an unresolved parent, and the rollout
totals count every unmasked trace's loss-bearing tokens.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

from consumers.rebuild.graph import Forest, ancestry, build_forest, chains, resolve_retries
from consumers.rebuild.identity import carried_summaries
from consumers.rebuild.links import BY_SEQ, Node, settle_deferred
from consumers.rebuild.projection import project_response_json
from consumers.rebuild.report import empty_metrics, metrics
from consumers.rebuild.rules import RebuildRules
from consumers.rebuild.sidecalls import classify_side_calls
from consumers.rebuild.staleness import unknown_version_reason
from consumers.rebuild.terminal import Attribution, attribute_by_evidence, attribute_by_heuristic
from consumers.rebuild.traces import build_traces, rollout_reasons
from consumers.rebuild.trajectory import ChainError, chain_trajectory
from consumers.rebuild.validity import checked_record
from schemas.records import (
    CallCaptured,
    CaptureMetrics,
    IncompleteReason,
    MaskCode,
    MaskReason,
    RebuiltRollout,
    Snapshot,
    Trace,
    Trajectory,
)

_DEFAULT_RULES = RebuildRules()


def rebuild(snapshot: Snapshot, rules: RebuildRules = _DEFAULT_RULES) -> RebuiltRollout:
    """Rebuild one frozen rollout into its token-exact trajectory and mask decision."""
    reasons = _snapshot_reasons(snapshot, rules)
    if not snapshot.calls:
        error = "capture contains no token records"
        reasons.append(MaskReason(code=MaskCode.NO_CALLS, detail=error))
        return _record(snapshot, reasons, None, None, empty_metrics(snapshot, error))
    try:
        return _rebuild(snapshot, rules, reasons)
    except Exception as exc:  # fail closed: a bug or a forged snapshot masks one rollout, never the stream
        error = f"{type(exc).__name__}: {exc}"
        reasons.append(MaskReason(code=MaskCode.BUILD_ERROR, detail=error))
        return _record(snapshot, reasons, None, None, empty_metrics(snapshot, error))


def _rebuild(snapshot: Snapshot, rules: RebuildRules, reasons: list[MaskReason]) -> RebuiltRollout:
    calls = settle_deferred(snapshot.calls)  # the calls whose parent the fold could not know yet
    first: dict[str, CallCaptured] = {}
    for sc in sorted(calls, key=BY_SEQ):
        first.setdefault(sc.call.model_call_id, sc.call)
    generating = [c for c in first.values() if c.generation_token_ids]
    forest = build_forest(calls, classify_side_calls(generating, rules))

    if rules.delivery_mode == "gym":
        unresolved_retries = resolve_retries(forest, set())
        all_chains = chains(forest)
        attribution = Attribution(node=all_chains[0][-1], method="earliest_root") if all_chains else Attribution()
        reasons.extend(_gym_reasons(forest, all_chains, unresolved_retries))
    else:
        attribution = attribute_by_evidence(forest, snapshot.finished, rules.terminal_methods)
        pinned = {id(n) for n in ancestry(attribution.node)} if attribution.node is not None else set()
        if rules.delivery_mode == "traces":
            # A summary is continued by the segment that carries it, not by a child: a retried summary
            # the next segment carries survives like a continued retry.
            for summary in carried_summaries(forest.roots, forest.live, rules):
                pinned.update(id(n) for n in ancestry(summary))
        unresolved_retries = resolve_retries(forest, pinned)
        all_chains = chains(forest)
        if attribution.node is None and attribution.failure is None and forest.live:
            if "heuristic" in rules.terminal_methods:
                heuristic = attribute_by_heuristic(forest, len(all_chains))
                heuristic.notes = {**attribution.notes, **heuristic.notes}
                attribution = heuristic
            else:
                attribution.failure = MaskCode.NO_TERMINAL
                attribution.detail = f"no evidence names the terminal and the allowed methods are {list(rules.terminal_methods)}"

    delivered = ancestry(attribution.node) if attribution.node is not None else None
    if rules.delivery_mode == "gym" or not forest.live:
        reasons.extend(_no_policy_reasons(forest))
    elif rules.delivery_mode == "traces":
        # The traces decide: a broken main (or segment) masks the rollout, a broken sub-agent only itself.
        reasons.extend(_attribution_reasons(attribution))
    else:
        reasons.extend(_delivery_reasons(attribution, delivered, unresolved_retries))
    trajectory: Trajectory | None = None
    response: str | None = None
    error: str | None = None
    if delivered and not any(n.quarantined for n in delivered):
        try:
            trajectory = chain_trajectory(delivered)
            # Traces mode projects each trace instead: the terminal chain's projection would be its trunk's again.
            if rules.project_response and rules.delivery_mode != "traces":
                response = project_response_json(delivered, snapshot.rollout_id)
        except Exception as exc:  # ChainError, or a malformed record: the chain is not deliverable
            error = f"{type(exc).__name__}: {exc}"
            trajectory, response = None, None
            code = exc.code if isinstance(exc, ChainError) else MaskCode.BUILD_ERROR
            reasons.append(MaskReason(code=code, detail=error, call_ids=[n.call_id for n in delivered]))
    m = metrics(snapshot, forest, all_chains, delivered, attribution, unresolved_retries, trajectory, error)
    traces: list[Trace] = []
    if rules.delivery_mode == "traces" and forest.live:
        known = {id(delivered[-1]): trajectory} if delivered and trajectory is not None else None
        traces, identity_reasons = build_traces(forest, attribution.node, unresolved_retries, rules,
                                                snapshot.rollout_id, known)
        reasons.extend(identity_reasons)
        reasons.extend(rollout_reasons(traces, rules))
        m = _with_trace_totals(m, traces)
    if error is None and not forest.live:
        m = _with_error(m, reasons[-1].detail if reasons else None)
    unknown = unknown_version_reason([t.trajectory for t in traces if t.trajectory is not None] if traces
                                     else [trajectory] if trajectory is not None else [])
    if unknown is not None:
        reasons.append(unknown)
    return _record(snapshot, reasons, trajectory, response, m, traces)


def _snapshot_reasons(snapshot: Snapshot, rules: RebuildRules) -> list[MaskReason]:
    reasons = []
    # An aborted generation (a weight-update pause) whose retry was captured is explained: the
    # retry (CallFacts.retry_of) is the call's evidence. One nothing retried masks on its own code.
    retried = {sc.call.facts.retry_of for sc in snapshot.calls if sc.call.facts.retry_of}
    aborted = [m for m in snapshot.incomplete_markers if m.reason == IncompleteReason.ABORTED]
    unexplained = [m for m in aborted if m.model_call_id not in retried]
    if unexplained:
        ids = sorted({m.model_call_id for m in unexplained if m.model_call_id})
        reasons.append(MaskReason(code=MaskCode.ABORTED_BY_UPDATE, call_ids=ids, detail=(
            f"{len(unexplained)} call(s) aborted by the engine (paused for a weight update) and never retried; "
            "serve with --abort-policy continue to continue them, or let the harness retry")))
    others = [m for m in snapshot.incomplete_markers if m.reason != IncompleteReason.ABORTED]
    if others:
        counts = Counter(m.reason for m in others)
        detail = ", ".join(_why(snapshot, reason, f"{reason} x{n}" if n > 1 else reason)
                           for reason, n in sorted(counts.items()))
        ids = sorted({m.model_call_id for m in others if m.model_call_id})
        reasons.append(MaskReason(code=MaskCode.CAPTURE_INCOMPLETE, detail=detail, call_ids=ids))
    # A direct producer's CallCaptured is not checked by any interceptor: a non-finite created_at would order
    # calls by NaN (every comparison false), so the tree would be a guess (issue 26).
    unordered = sorted({sc.call.model_call_id for sc in snapshot.calls if not math.isfinite(sc.call.created_at)})
    if unordered:
        reasons.append(MaskReason(code=MaskCode.INVALID_RECORD, call_ids=unordered, detail=(
            f"{len(unordered)} call(s) have a created_at that is not a finite number (NaN or infinite), so calls "
            "cannot be ordered; fix the producer: created_at is the call's wall-clock time in seconds")))
    if snapshot.late_writes and rules.mask_late_writes:
        late = sorted({sc.call.model_call_id for sc in snapshot.calls if sc.late})
        reasons.append(MaskReason(code=MaskCode.LATE_WRITE, detail=f"{snapshot.late_writes} write(s) after finish", call_ids=late))
    return reasons


# Reasons whose cause is only in the engine's own words: the mask reason quotes them.
_QUOTED_REASONS = (IncompleteReason.ENGINE_REJECTED, IncompleteReason.ABORTED, IncompleteReason.UNTRANSLATABLE_OUTPUT)


def _why(snapshot: Snapshot, reason: str, label: str) -> str:
    if reason not in _QUOTED_REASONS:
        return label
    # The smallest (status, detail) of that reason: independent of the markers' order.
    status, text = min((m.http_status or 0, m.detail) for m in snapshot.incomplete_markers if m.reason == reason)
    quote = f"HTTP {status}: {text}" if status else text
    return f"{label} ({quote[:200]})" if quote else label


def _no_policy_reasons(forest: Forest) -> list[MaskReason]:
    if forest.live:
        return []
    if forest.side:
        return [MaskReason(code=MaskCode.ALL_SIDE_CALLS, detail="all captured calls were side calls",
                           call_ids=[n.call_id for n in forest.side])]
    return [MaskReason(code=MaskCode.NO_GENERATED_TOKENS, detail="no captured call generated tokens",
                       call_ids=list(forest.empty))]


def _delivery_reasons(
    attribution: Attribution, delivered: list[Node] | None, unresolved_retries: list[list[str]]
) -> list[MaskReason]:
    if attribution.failure is not None:
        return _attribution_reasons(attribution)
    reasons = []
    assert delivered is not None
    root, terminal = delivered[0], delivered[-1]
    if root.boundary is not None:
        reasons.append(MaskReason(
            code=MaskCode.UNRESOLVED_PARENT,
            detail=f"the delivered chain starts at call {root.call_id}, whose parent is unknown ({root.boundary})",
            call_ids=[root.call_id]))
    for group in unresolved_retries:
        if terminal.call_id in group:
            reasons.append(MaskReason(code=MaskCode.UNRESOLVED_RETRY,
                                      detail="the terminal call was retried and nothing says which retry was kept",
                                      call_ids=group))
    return reasons


def _attribution_reasons(attribution: Attribution) -> list[MaskReason]:
    if attribution.failure is None:
        return []
    ids = attribution.notes.get("ambiguous_children") or (
        [attribution.notes["declared_call_id"]] if "declared_call_id" in attribution.notes else [])
    return [MaskReason(code=attribution.failure, detail=attribution.detail, call_ids=list(ids))]


def _gym_reasons(forest: Forest, all_chains: list[list[Node]], unresolved_retries: list[list[str]]) -> list[MaskReason]:
    reasons = []
    links = forest.links
    if links.unresolved:
        detail = ", ".join(f"{k} x{v}" for k, v in sorted(links.failures.items()) if k != "parent_call_id_missing_recovered")
        reasons.append(MaskReason(code=MaskCode.UNRESOLVED_PARENT, detail=detail, call_ids=links.unresolved))
    if unresolved_retries:
        reasons.append(MaskReason(code=MaskCode.UNRESOLVED_RETRY, detail="retried call with no continuation: survivor unknown",
                                  call_ids=[cid for group in unresolved_retries for cid in group]))
    if forest.live and len(forest.roots) != 1:
        reasons.append(MaskReason(code=MaskCode.MULTIPLE_ROOTS, detail=f"roots={len(forest.roots)}",
                                  call_ids=[n.call_id for n in forest.roots]))
    if len(all_chains) > 1:
        reasons.append(MaskReason(code=MaskCode.MULTIPLE_CHAINS, detail=f"chains={len(all_chains)}",
                                  call_ids=[c[-1].call_id for c in all_chains]))
    return reasons


def _with_error(m: CaptureMetrics, error: str | None) -> CaptureMetrics:
    return dataclasses.replace(m, error=error)


def _with_trace_totals(m: CaptureMetrics, traces: list[Trace]) -> CaptureMetrics:
    """Traces mode delivers every unmasked trace's loss-bearing tokens, not only the terminal chain's."""
    delivered = sum(t.loss_tokens for t in traces if not t.mask_sample)
    captured = m.generated_tokens_captured
    return dataclasses.replace(m, generated_tokens_delivered=delivered,
                               delivered_fraction=round(delivered / captured, 4) if captured else 0.0)


def _record(snapshot: Snapshot, reasons: list[MaskReason], trajectory: Trajectory | None, response: str | None,
            metrics_: CaptureMetrics, traces: list[Trace] | None = None) -> RebuiltRollout:
    # The result is the finisher's opaque text: a result that is not strict JSON masks (invalid_result),
    # kept as a string, so that no sink can be stopped by it. The trajectories and projections are this
    # module's own, checked as they were built (``built``): not scanned again here.
    return checked_record(RebuiltRollout(
        rollout_id=snapshot.rollout_id,
        snapshot_id=snapshot.snapshot_id,
        version=snapshot.version,
        mask_sample=bool(reasons),
        mask_reasons=reasons,
        trajectory=trajectory,
        response_json=response,
        result_json=snapshot.finished.result_json,
        metrics=metrics_,
        traces=traces or [],
    ), built=True)
