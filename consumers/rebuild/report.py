"""The ``_ng_token_capture`` metrics and their detail (pure).

NeMo Gym's keys (``n_calls``, ``roots``, ``chains``, ``delivered_fraction``,
``quarantined_*``, ``empty_generation_calls``, ``unresolved_parent_calls``,
``parent_link_failures``, ``generated_tokens_*``, ``capture_incomplete``,
``error``) plus ours (``side_calls_excluded``, ``terminal_attribution``), and
``detail_json``: the lists behind the counts and one report per chain that was
not delivered, with its kind:

- ``delivered``: the terminal's ancestry (label ``main``);
- ``after_terminal``: continues past the attributed terminal;
- ``abandoned``: forks off the delivered chain's root (an abandoned branch);
- ``fragment``: starts at an unresolved boundary (compaction, lost link);
- ``other_root``: another conversation started from scratch (sub-agent, aux
  call on the policy model, pre-compaction segment);
- ``side``: side calls (grouped by the side conversation they belong to).

Every list is in a deterministic order, so the record is byte-identical for
the same snapshot and rules. A consumer that follows the policy-versions topic
adds ``policy_staleness``, ``oldest_policy_version`` and ``current_policy_version``
(and ``policy_staleness_unknown``, why, when unknown) to the detail at delivery
(``consumers.rebuild.staleness.apply_staleness``): they depend on the version
current then, not on the snapshot alone.
"""

from __future__ import annotations

import json
from typing import Any

from consumers.rebuild.graph import Forest, side_groups
from consumers.rebuild.links import Node
from consumers.rebuild.terminal import Attribution
from schemas.records import CaptureMetrics, Snapshot, TerminalAttribution, Trajectory


def metrics(
    snapshot: Snapshot,
    forest: Forest,
    all_chains: list[list[Node]],
    delivered: list[Node] | None,
    attribution: Attribution,
    unresolved_retries: list[list[str]],
    trajectory: Trajectory | None,
    error: str | None,
) -> CaptureMetrics:
    links = forest.links
    n_calls = forest.n_calls
    captured = sum([len(n.call.generation_token_ids) for n in forest.live])  # no property call per node
    delivered_tokens = len(trajectory.log_probs) if trajectory is not None else 0
    quarantined = sorted(n.call_id for n in forest.live if n.quarantined)
    detail: dict[str, Any] = {
        "quarantined_call_ids": quarantined,
        "unresolved_parent_call_ids": links.unresolved,
        "unresolved_retries": unresolved_retries,
        "empty_generation_call_ids": forest.empty,
        "recovered_call_ids": sorted(links.recovered),
        "side_spliced_call_ids": sorted(links.spliced_side_parents),
        "side_calls": [
            {"call_id": n.call_id, "rule": n.side.rule, "requested_model": n.side.requested_model}
            for n in forest.side if n.side is not None
        ],
        "delivered_call_ids": [n.call.model_call_id for n in delivered] if delivered else [],
        "chain_reports": chain_reports(forest, all_chains, delivered),
        "terminal": attribution.notes,
        "late_call_ids": sorted({sc.call.model_call_id for sc in snapshot.calls if sc.late}),
        "conflicting_call_ids": list(snapshot.conflicting_call_ids),
    }
    terminal = attribution.node
    return CaptureMetrics(
        n_calls=n_calls,
        roots=len(forest.roots),
        chains=len(all_chains),
        delivered_fraction=round(delivered_tokens / captured, 4) if captured else 0.0,
        quarantined_calls=len(quarantined),
        quarantined_fraction=round(len(quarantined) / n_calls, 4) if n_calls else 0.0,
        empty_generation_calls=len(forest.empty),
        unresolved_parent_calls=len(links.unresolved),
        parent_link_failures=dict(sorted(links.failures.items())),
        generated_tokens_captured=captured,
        generated_tokens_delivered=delivered_tokens,
        capture_incomplete=snapshot.incomplete,
        side_calls_excluded=len(forest.side),
        terminal_attribution=TerminalAttribution(
            chain="main" if delivered else None,
            method=attribution.method if terminal is not None else "none",
            call_id=terminal.call_id if terminal is not None else None,
        ),
        error=error,
        detail_json=json.dumps(detail, sort_keys=True, separators=(",", ":")),
    )


def empty_metrics(snapshot: Snapshot, error: str) -> CaptureMetrics:
    """Metrics of a rollout that could not be built at all."""
    return CaptureMetrics(
        n_calls=len({sc.call.model_call_id for sc in snapshot.calls}), roots=0, chains=0, delivered_fraction=0.0,
        quarantined_calls=0, quarantined_fraction=0.0, empty_generation_calls=0, unresolved_parent_calls=0,
        parent_link_failures={}, generated_tokens_captured=0, generated_tokens_delivered=0,
        capture_incomplete=snapshot.incomplete, terminal_attribution=TerminalAttribution(), error=error,
    )


def chain_reports(forest: Forest, all_chains: list[list[Node]], delivered: list[Node] | None) -> list[dict[str, Any]]:
    terminal = delivered[-1] if delivered else None
    root = delivered[0] if delivered else None
    reports = []
    if delivered:
        reports.append(_report("main", "delivered", delivered))
    branch = 0
    for chain in all_chains:
        if terminal is not None and chain[-1] is terminal:
            continue
        if terminal is not None and any(n is terminal for n in chain):
            kind = "after_terminal"
        elif root is not None and chain[0] is root:
            kind = "abandoned"
        elif chain[0].boundary is not None:
            kind = "fragment"
        else:
            kind = "other_root"
        reports.append(_report(f"branch-{branch}", kind, chain))
        branch += 1
    for index, group in enumerate(side_groups(forest)):
        reports.append(_report(f"side-{index}", "side", group))
    return reports


def _report(label: str, kind: str, nodes: list[Node]) -> dict[str, Any]:
    return {
        "label": label,
        "kind": kind,
        "call_ids": [n.call.model_call_id for n in nodes],
        "generated_tokens": sum([len(n.call.generation_token_ids) for n in nodes]),
    }
