"""Explain a replayed rollout to a person: its events, its call tree, the delivered chain, the mask decision.

Pure: reads a ``ReplayResult`` (the folded events, the snapshot, the rebuilt
record) and returns text. Every statement comes from the records themselves:
how the processor decided each link (``lineage_note``), which calls the rebuild
quarantined, excluded as side calls or delivered (``detail_json``), how the
terminal was attributed, and every mask reason with the calls it names.
A rollout rebuilt with ``delivery_mode="traces"`` also gets its trace tree
(``trace_tree``): one line per trace, indented under the trace that started it;
terminal and gym records print exactly as before (they carry no traces).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from consumers.replay.rollouts import ReplayResult
from schemas.records import (
    CallCaptured,
    CallIncomplete,
    CallStarted,
    RebuiltRollout,
    RetireRequested,
    RolloutFinished,
    Snapshot,
    Trace,
    TraceKind,
)

_KIND_ORDER = [k.value for k in TraceKind]


def explain(result: ReplayResult) -> str:
    lines: list[str] = []
    snapshot, rollout = result.snapshot, result.rollout
    if rollout is None or snapshot is None:
        lines.append(f"rollout {result.rollout_id}: NOT FINISHED — no RolloutFinished in the replayed range "
                     f"({len(result.events)} event(s) folded)")
        lines += ["", "events"] + _events(result) if result.events else []
        return "\n".join(lines)
    verdict = "MASKED" if rollout.mask_sample else "DELIVERABLE (mask_sample: false)"
    first, last = result.events[0], result.events[-1]
    lines.append(f"rollout {rollout.rollout_id}: {verdict}")
    lines.append(f"  snapshot {rollout.snapshot_id} v{rollout.version}; {len(result.events)} event(s) in partition "
                 f"{first.partition}, offsets {first.offset}..{last.offset}")
    lines.append(f"  result {snapshot.finished.result_json}")
    if snapshot.finished.final_text is not None or snapshot.finished.final_response_id is not None:
        lines.append(f"  final answer {_quote(snapshot.finished.final_text)} "
                     f"(response id {snapshot.finished.final_response_id or '-'})")
    lines += ["", "events"] + _events(result)
    detail = json.loads(rollout.metrics.detail_json)
    lines += ["", "call tree (parent links as the processor verified them)"] + _tree(snapshot, detail, rollout.traces)
    if snapshot.incomplete_markers:
        lines += ["", "incomplete markers (calls whose tokens were lost)"]
        for m in snapshot.incomplete_markers:
            status = f" HTTP {m.http_status}" if m.http_status else ""
            lines.append(f"  - call {_short(m.model_call_id)}: {m.reason}{status} {m.route} {_quote(m.detail)}")
    lines += ["", *_delivery(rollout, detail)]
    lines += versions if (versions := _versions(rollout, detail)) else []
    if rollout.traces:
        lines += ["", *trace_tree(rollout)]
    lines += ["", f"decision: {'MASKED' if rollout.mask_sample else 'deliver (mask_sample: false)'}"]
    for reason in rollout.mask_reasons:
        calls = f" [calls {', '.join(_short(c) for c in reason.call_ids)}]" if reason.call_ids else ""
        lines.append(f"  - {reason.code}: {reason.detail}{calls}")
    if rollout.metrics.error:
        lines.append(f"  build error: {rollout.metrics.error}")
    if len(result.rebuilt) > 1:
        lines.append(f"  (frozen {len(result.rebuilt)} times; this is the last freeze)")
    return "\n".join(lines)


def _events(result: ReplayResult) -> list[str]:
    out = []
    for e in result.events:
        when = datetime.fromtimestamp(e.timestamp_ms / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]
        what = _describe(e.event) if e.event is not None else "undecodable record"
        extra = "; ".join([*(f"dead letter {d.reason}: {d.detail}" for d in e.deadletters), *e.notes])
        if not e.changed and not e.deadletters and not extra:
            extra = "no change"
        out.append(f"  @{e.offset:<6} {when}  {what}{'  — ' + extra if extra else ''}")
    return out


def _describe(event: Any) -> str:
    body = event.body
    if isinstance(body, CallCaptured):
        parent = f"claims parent {_short(body.parent_call_id)}" if body.parent_call_id else body.parent_resolution.value.lower()
        return (f"CallCaptured {_short(body.model_call_id)} ({body.facts.dialect.value.lower()}, {parent}, "
                f"{'delta ' if body.prompt_is_delta else ''}prompt {len(body.prompt_token_ids)} + "
                f"gen {len(body.generation_token_ids)})")
    if isinstance(body, CallIncomplete):
        return f"CallIncomplete {_short(body.model_call_id)} {body.reason}"
    if isinstance(body, RolloutFinished):
        return f"RolloutFinished attempt {body.attempt}"
    if isinstance(body, CallStarted):
        return f"CallStarted {_short(body.model_call_id)} (intent)"
    if isinstance(body, RetireRequested):
        return f"RetireRequested {body.snapshot_id[:8]} v{body.version} by {body.consumer or '?'}"
    return type(body).__name__


def _tree(snapshot: Snapshot, detail: dict[str, Any], traces: list[Trace]) -> list[str]:
    calls = {sc.call.model_call_id: sc for sc in snapshot.calls}
    children: dict[str | None, list[str]] = {}
    for cid, sc in calls.items():
        parent = sc.call.parent_call_id if sc.call.parent_call_id in calls else None
        children.setdefault(parent, []).append(cid)
    for kids in children.values():
        kids.sort(key=lambda c: (calls[c].call.created_at, c))
    tags = _tags(detail)
    for index, trace in enumerate(traces):
        for cid in trace.call_ids:
            tags.setdefault(cid, []).append(f"trace #{index} {trace.kind}")
    out: list[str] = []
    stack = [(cid, "", True, True) for cid in reversed(children.get(None, []))]
    while stack:
        cid, prefix, last, is_root = stack.pop()
        sc = calls[cid]
        c = sc.call
        branch = "" if is_root else ("└─ " if last else "├─ ")
        prompt = f"+{len(c.prompt_token_ids)}" if c.prompt_is_delta else f"{len(c.prompt_token_ids)}"
        note = sc.lineage_note or c.parent_resolution.value.lower()
        flags = ", ".join(tags.get(cid, [])) or "not delivered"
        out.append(f"  {prefix}{branch}{_short(cid)}  {note:<28} prompt {prompt:>6}  gen {len(c.generation_token_ids):>5}  "
                   f"{c.facts.requested_model or c.model}  [{flags}]{'  LATE' if sc.late else ''}")
        kids = children.get(cid, [])
        child_prefix = prefix + ("" if is_root else ("   " if last else "│  "))
        for i, kid in reversed(list(enumerate(kids))):
            stack.append((kid, child_prefix, i == len(kids) - 1, False))
    return out


def _tags(detail: dict[str, Any]) -> dict[str, list[str]]:
    tags: dict[str, list[str]] = {}

    def add(cid: str, tag: str) -> None:
        tags.setdefault(cid, []).append(tag)

    for cid in detail.get("delivered_call_ids", []):
        add(cid, "delivered")
    for cid in detail.get("quarantined_call_ids", []):
        add(cid, "quarantined")
    for group in detail.get("unresolved_retries", []):
        for cid in group if isinstance(group, list) else [group]:
            add(cid, "unresolved retry")
    for side in detail.get("side_calls", []):
        add(side["call_id"], f"side call ({side['rule']})")
    for cid in detail.get("empty_generation_call_ids", []):
        add(cid, "empty generation")
    for cid in detail.get("unresolved_parent_call_ids", []):
        add(cid, "unresolved parent")
    for cid in detail.get("recovered_call_ids", []):
        add(cid, "link recovered")
    return tags


def _delivery(rollout: RebuiltRollout, detail: dict[str, Any]) -> list[str]:
    m = rollout.metrics
    ta = m.terminal_attribution
    notes = detail.get("terminal")
    out = [f"terminal attribution: {ta.method} -> {_short(ta.call_id)}" + (f"  ({notes})" if notes else "")]
    delivered = detail.get("delivered_call_ids", [])
    if delivered:
        out.append(f"delivered chain: {' -> '.join(_short(c) for c in delivered)}: {len(delivered)} call(s), "
                   f"{m.generated_tokens_delivered} of {m.generated_tokens_captured} generated tokens "
                   f"(delivered_fraction {m.delivered_fraction})")
    else:
        out.append("delivered chain: none")
    for report in detail.get("chain_reports", []):
        if report["kind"] != "delivered":
            out.append(f"  reported, not trained: {report['label']} ({report['kind']}) "
                       f"{' -> '.join(_short(c) for c in report['call_ids'])}, {report['generated_tokens']} tokens")
    return out


def _versions(rollout: RebuiltRollout, detail: dict[str, Any]) -> list[str]:
    """Each delivered call's policy-version spans and the rollout's staleness, when the records hold them."""
    out = []
    for span in rollout.trajectory.spans if rollout.trajectory is not None else []:
        if span.version_spans:
            runs = "  ".join(f"{v.version or '?'}[{v.start}:{v.end})" for v in span.version_spans)
            out.append(f"  call {_short(span.model_call_id)}: {runs} ({span.version_source or 'recorded'})")
    if "policy_staleness" in detail:  # consumers.rebuild.staleness judged it (replay read the versions topic)
        if detail["policy_staleness"] is not None:
            out.append(f"  policy staleness at freeze: {detail['policy_staleness']} version(s) behind (oldest "
                       f"{detail['oldest_policy_version']!r}, current {detail['current_policy_version']!r})")
        else:
            why = detail.get("policy_staleness_unknown") or "no loss-bearing generated tokens"
            out.append(f"  policy staleness at freeze: unknown ({why})")
    return ["", "policy versions (trajectory positions)", *out] if out else []


def trace_tree(rollout: RebuiltRollout) -> list[str]:
    """The rollout's traces, one line each, indented two spaces per level under its ``parent_trace``.

    Each line: index, kind, label, segment (compaction), how it was classified, where it
    attaches (the parent trace's call and, for a sub-agent, the tool call), its calls,
    its loss tokens, and ``MASKED`` with the reason codes when the trace is masked. A
    ``parent_trace`` that names no earlier-listed trace puts the trace at the top level,
    so a malformed record still lists every trace once.
    """
    traces = rollout.traces
    kids: dict[int, list[int]] = {}
    for index, trace in enumerate(traces):
        parent = trace.parent_trace if 0 <= trace.parent_trace < len(traces) and trace.parent_trace != index else -1
        kids.setdefault(parent, []).append(index)
    out = [f"traces: {trace_counts(traces)}"]
    seen: set[int] = set()
    stack = [(i, 1) for i in reversed(kids.get(-1, []))]
    while stack or len(seen) < len(traces):
        if not stack:  # a parent_trace cycle: list what it hid at the top level
            stack = [(min(set(range(len(traces))) - seen), 1)]
        index, depth = stack.pop()
        if index in seen:
            continue
        seen.add(index)
        out.append("  " * depth + _trace_line(index, traces[index]))
        stack += [(kid, depth + 1) for kid in reversed(kids.get(index, []))]
    return out


def _trace_line(index: int, trace: Trace) -> str:
    parts = [f"#{index} {trace.kind} {json.dumps(trace.label, ensure_ascii=False)}"]
    if trace.segment or trace.kind == TraceKind.COMPACTION:
        parts[0] += f" segment {trace.segment}"
    parts.append(f"by {trace.classified_by or '-'}")
    if trace.attachment is not None:
        tool = f" tool {trace.attachment.tool_call_id}" if trace.attachment.tool_call_id else ""
        parts.append(f"from call {_short(trace.attachment.call_id)}{tool}")
    if trace.prefix_trace >= 0:
        parts.append(f"prefix #{trace.prefix_trace}[:{trace.prefix_len}]")
    parts.append(f"{len(trace.call_ids)} call(s)")
    parts.append("not trained" if trace.kind == TraceKind.SIDE else f"{trace.loss_tokens} loss tokens")
    if trace.mask_sample:
        parts.append("MASKED " + ", ".join(dict.fromkeys(r.code for r in trace.mask_reasons)))
    return "  ".join(parts)


def trace_counts(traces: list[Trace], *, masked: bool = False) -> str:
    """``4 (main 1, subagent 1, compaction 1, other 1)``: how many traces (masked ones only if
    ``masked``), per kind in ``TraceKind`` order; just ``0`` when there are none."""
    kinds = kind_counts(traces, masked=masked)
    total = sum(kinds.values())
    return f"{total} ({', '.join(f'{k} {n}' for k, n in kinds.items())})" if total else "0"


def kind_counts(traces: list[Trace], *, masked: bool = False) -> dict[str, int]:
    """Traces per kind (masked ones only if ``masked``), known kinds first in ``TraceKind`` order."""
    counts: dict[str, int] = {}
    for trace in traces:
        if trace.mask_sample or not masked:
            counts[trace.kind] = counts.get(trace.kind, 0) + 1
    return {kind: counts[kind] for kind in kind_order(counts)}


def kind_order(kinds: Iterable[str]) -> list[str]:
    """The kinds in ``TraceKind`` order, any unknown kind after them by name."""
    rank = {k: i for i, k in enumerate(_KIND_ORDER)}
    return sorted(kinds, key=lambda k: (rank.get(k, len(rank)), k))


def trace_changes(before: RebuiltRollout, after: RebuiltRollout) -> list[str]:
    """What a rule change does to the traces, as sentences (``rule_changes`` covers the rest):
    ``traces: 0 -> 4 (main 1, subagent 1, compaction 1, other 1)``, the masked traces, and
    relabelled traces when the counts stay the same."""
    changes = []
    if kind_counts(before.traces) != kind_counts(after.traces):
        changes.append(f"traces: {trace_counts(before.traces)} -> {trace_counts(after.traces)}")
    elif [(t.kind, t.label, t.segment) for t in before.traces] != [(t.kind, t.label, t.segment) for t in after.traces]:
        changes.append("trace labels: " + ", ".join(f"{t.kind} {t.label}" for t in before.traces) + " -> "
                       + ", ".join(f"{t.kind} {t.label}" for t in after.traces))
    if kind_counts(before.traces, masked=True) != kind_counts(after.traces, masked=True):
        changes.append(f"masked traces: {trace_counts(before.traces, masked=True)} -> "
                       f"{trace_counts(after.traces, masked=True)}")
    return changes


def _short(call_id: str | None) -> str:
    return call_id[:8] if call_id else "-"


def _quote(text: str | None, limit: int = 80) -> str:
    if text is None:
        return "-"
    text = text.replace("\n", " ")
    return json.dumps(text[:limit] + ("…" if len(text) > limit else ""), ensure_ascii=False)
