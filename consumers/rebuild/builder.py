"""``rebuild(snapshot, rules) -> RebuiltRollout``: what a trainer may train on, and why (pure).

Deterministic: the same snapshot and rules give the same record, byte for byte.
Fail closed: every ambiguity ends in quarantine or ``mask_sample: true`` with a
structured reason; an exception inside the build masks the rollout with the
error, it never escapes.
"""

from __future__ import annotations

import json
from collections import Counter

from consumers.rebuild.graph import Graph, Node, build_graph
from consumers.rebuild.rules import RebuildRules
from consumers.rebuild.trajectory import ChainError, chain_trajectory, project_response
from schemas.errors import ContractError
from schemas.records import (
    CaptureMetrics,
    MaskReason,
    RebuiltRollout,
    Snapshot,
    TerminalAttribution,
    Trajectory,
)


def rebuild(snapshot: Snapshot, rules: RebuildRules = RebuildRules()) -> RebuiltRollout:
    """Rebuild one frozen rollout into its token-exact trajectory and mask decision."""
    reasons: list[MaskReason] = []
    if snapshot.incomplete:
        reasons.append(_incomplete_reason(snapshot))
    if snapshot.late_writes and rules.mask_late_writes:
        late = [sc.call.model_call_id for sc in snapshot.calls if sc.late]
        reasons.append(MaskReason(code="late_write", detail=f"{snapshot.late_writes} write(s) after finish", call_ids=late))
    if not snapshot.calls:
        reasons.append(MaskReason(code="no_calls", detail="capture contains no token records"))
        return _record(snapshot, reasons, None, None, _empty_metrics(snapshot, "capture contains no token records"))

    graph = build_graph(snapshot.calls)
    chain = _delivered_chain(graph)
    trajectory: Trajectory | None = None
    response: dict | None = None
    error: str | None = None
    if chain is not None:
        try:
            trajectory = chain_trajectory(chain)
            if rules.project_response:
                response = project_response(chain, snapshot.rollout_id)
        except (ChainError, ContractError, ValueError, KeyError, TypeError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            trajectory, response = None, None
    reasons.extend(_graph_reasons(graph, trajectory, error))
    metrics = _metrics(snapshot, graph, chain, trajectory, error)
    return _record(snapshot, reasons, trajectory, response, metrics)


def _delivered_chain(graph: Graph) -> list[Node] | None:
    """The main chain: the one whose root completed first (NeMo Gym's rule)."""
    if not graph.chains:
        return None
    return min(graph.chains, key=lambda c: (c[0].call.created_at, c[0].call_id))


def _incomplete_reason(snapshot: Snapshot) -> MaskReason:
    counts = Counter(m.reason for m in snapshot.incomplete_markers)
    detail = ", ".join(f"{reason} x{n}" if n > 1 else reason for reason, n in sorted(counts.items()))
    ids = sorted({m.model_call_id for m in snapshot.incomplete_markers if m.model_call_id})
    return MaskReason(code="capture_incomplete", detail=detail, call_ids=ids)


def _graph_reasons(graph: Graph, trajectory: Trajectory | None, error: str | None) -> list[MaskReason]:
    reasons = []
    if graph.unresolved_parent_calls:
        detail = ", ".join(f"{k} x{v}" for k, v in sorted(graph.link_failures.items()) if k != "parent_call_id_missing_recovered")
        reasons.append(MaskReason(code="unresolved_parent", detail=detail, call_ids=graph.unresolved_parent_calls))
    if graph.unresolved_retries:
        reasons.append(
            MaskReason(code="unresolved_retry", detail="retried call with no continuation: survivor unknown",
                       call_ids=graph.unresolved_retries)
        )
    if len(graph.roots) != 1:
        reasons.append(MaskReason(code="multiple_roots" if graph.roots else "no_roots", detail=f"roots={len(graph.roots)}",
                                  call_ids=[n.call_id for n in graph.roots]))
    if len(graph.chains) > 1:
        reasons.append(MaskReason(code="multiple_chains", detail=f"chains={len(graph.chains)}",
                                  call_ids=[c[-1].call_id for c in graph.chains]))
    if error is not None:
        reasons.append(MaskReason(code="build_error", detail=error))
    elif trajectory is None or not trajectory.log_probs:
        reasons.append(MaskReason(code="no_generated_tokens", detail="no chain with generated tokens"))
    return reasons


def _metrics(snapshot: Snapshot, graph: Graph, chain, trajectory, error) -> CaptureMetrics:
    captured = sum(len(n.generation) for n in graph.nodes)
    delivered = len(trajectory.log_probs) if trajectory is not None else 0
    failures = dict(sorted(graph.link_failures.items()))
    detail = {
        "quarantined_call_ids": graph.quarantined,
        "unresolved_parent_call_ids": graph.unresolved_parent_calls,
        "unresolved_retries": graph.unresolved_retries,
        "empty_generation_call_ids": graph.empty_generation_calls,
        "chain_call_ids": [[n.call_id for n in c] for c in graph.chains],
    }
    return CaptureMetrics(
        n_calls=graph.n_calls,
        roots=len(graph.roots),
        chains=len(graph.chains),
        delivered_fraction=round(delivered / captured, 4) if captured else 0.0,
        quarantined_calls=len(graph.quarantined),
        quarantined_fraction=round(len(graph.quarantined) / graph.n_calls, 4) if graph.n_calls else 0.0,
        empty_generation_calls=len(graph.empty_generation_calls),
        unresolved_parent_calls=len(graph.unresolved_parent_calls),
        parent_link_failures=failures,
        generated_tokens_captured=captured,
        generated_tokens_delivered=delivered,
        capture_incomplete=snapshot.incomplete,
        terminal_attribution=TerminalAttribution(
            chain="main" if chain is not None else None,
            method="earliest_root" if chain is not None else "none",
            call_id=chain[-1].call_id if chain is not None else None,
        ),
        error=error,
        detail_json=json.dumps(detail, sort_keys=True, separators=(",", ":")),
    )


def _empty_metrics(snapshot: Snapshot, error: str) -> CaptureMetrics:
    return CaptureMetrics(
        n_calls=0, roots=0, chains=0, delivered_fraction=0.0, quarantined_calls=0, quarantined_fraction=0.0,
        empty_generation_calls=0, unresolved_parent_calls=0, parent_link_failures={},
        generated_tokens_captured=0, generated_tokens_delivered=0, capture_incomplete=snapshot.incomplete,
        terminal_attribution=TerminalAttribution(), error=error,
    )


def _record(snapshot, reasons, trajectory, response, metrics) -> RebuiltRollout:
    return RebuiltRollout(
        rollout_id=snapshot.rollout_id,
        snapshot_id=snapshot.snapshot_id,
        version=snapshot.version,
        mask_sample=bool(reasons),
        mask_reasons=reasons,
        trajectory=trajectory,
        response_json=json.dumps(response, separators=(",", ":")) if response is not None else None,
        result_json=snapshot.finished.result_json,
        metrics=metrics,
    )
