"""Batch replay: what was masked in a time range, why, for which harness and model.

Scans every partition of ``tokentrail.rollout-events`` one record at a time,
folds each rollout with the pure fold (its state is dropped once the rollout
is retired, so memory follows the rollouts in flight, not the log), rebuilds
every rollout frozen inside ``[since, until)`` under the given rules, and
aggregates: rollouts, masked fraction, counts per mask reason, per harness
(user agent) and per model, the costliest masked rollouts, and mask reasons
over time. Reading starts ``lookback`` before ``since`` so that rollouts which
began earlier are folded whole. Under rules that deliver traces
(``delivery_mode="traces"``) it also counts traces per kind, and masked traces
per kind (``traces`` in the dict); under other rules that key is absent.

Given the policy versions' announcements (the policy-versions topic), it also
judges every rollout's policy staleness (``consumers.rebuild.staleness``) against
the version current when the rollout froze (the announcements made by then:
``announced_at`` <= ``frozen_at``; one without a time counts from the start), as
a live consumer delivering it at once would, and reports a histogram
(``staleness`` in the dict: ``histogram`` of versions behind -> rollouts,
``unknown``, and ``stale`` beyond ``max_staleness``). With ``max_staleness`` the
rollouts are masked as the consumer would mask them, so ``stale_policy`` and
``unknown_policy_version`` show among the mask reasons. Without announcements
the key is absent and nothing changes.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from consumers.rebuild import RebuildRules, rebuild
from consumers.rebuild.staleness import StalenessCheck, apply_staleness, check_staleness
from consumers.replay.eventlog import EventLog
from consumers.replay.explain import kind_counts, kind_order
from processors.replay import replay
from schemas.policy_versions import PolicyVersion, VersionBook
from schemas.records import MaskCode, RebuiltRollout, Snapshot

_VERSION = re.compile(r"/[\w.\-]+$")


@dataclass(slots=True)
class RolloutRow:
    rollout_id: str
    finished_ms: int
    masked: bool
    reasons: list[str]
    n_calls: int
    generated_tokens: int
    delivered_fraction: float
    harnesses: list[str]
    models: list[str]
    traces: dict[str, int] = field(default_factory=dict)  # traces per kind
    masked_traces: dict[str, int] = field(default_factory=dict)  # masked traces per kind
    staleness: int | None = None  # versions behind the current one at freeze (None: unknown or not judged)
    judged: bool = False  # staleness was judged (announcements given, loss-bearing tokens)


@dataclass(slots=True)
class Summary:
    since_ms: int | None
    until_ms: int | None
    delivery_mode: str = "terminal"
    events_scanned: int = 0
    rows: dict[str, RolloutRow] = field(default_factory=dict)
    versions: bool = False  # announcements were given: staleness was judged
    max_staleness: int | None = None

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        rows = sorted(self.rows.values(), key=lambda r: (r.finished_ms, r.rollout_id))
        masked = [r for r in rows if r.masked]
        by_reason = Counter(code for r in masked for code in r.reasons)
        out = {
            "since_ms": self.since_ms,
            "until_ms": self.until_ms,
            "events_scanned": self.events_scanned,
            "rollouts": len(rows),
            "masked": len(masked),
            "masked_fraction": round(len(masked) / len(rows), 4) if rows else 0.0,
            "by_reason": dict(by_reason.most_common()),
            "by_harness": _breakdown(rows, "harnesses"),
            "by_model": _breakdown(rows, "models"),
            "top_masked": [
                {"rollout_id": r.rollout_id, "reasons": r.reasons, "n_calls": r.n_calls,
                 "generated_tokens": r.generated_tokens}
                for r in sorted(masked, key=lambda r: (-r.generated_tokens, r.rollout_id))[:top]
            ],
            "timeline": [{"finished_ms": r.finished_ms, "rollout_id": r.rollout_id, "masked": r.masked,
                          "reasons": r.reasons} for r in rows],
        }
        if self.delivery_mode == "traces":
            out["traces"] = _trace_totals(rows)
        if self.versions:
            out["staleness"] = _staleness_totals(rows, self.max_staleness)
        return out


def summarize(log: EventLog, *, since_ms: int | None, until_ms: int | None, lookback_ms: int = 3_600_000,
              rules: RebuildRules = RebuildRules(project_response=False),
              announcements: Sequence[PolicyVersion] = (), max_staleness: int | None = None) -> Summary:
    """``announcements``: the policy versions announced (the topic's records); ``max_staleness``: mask as the
    consumer would (needs announcements: without them every rollout would be ``unknown_policy_version``)."""
    summary = Summary(since_ms, until_ms, delivery_mode=rules.delivery_mode, versions=bool(announcements),
                      max_staleness=max_staleness)
    history = VersionHistory(announcements)
    start = None if since_ms is None else since_ms - lookback_ms
    for partition in range(log.partitions()):
        # Each rollout's state is dropped once it is retired (nothing more can change it).
        for step in replay(_scanned(log.partition_events(partition, from_time_ms=start), until_ms, summary),
                           forget_retired=True):
            for snapshot in step.snapshots:
                if since_ms is None or snapshot.frozen_at // 1000 >= since_ms:
                    rollout, check = rebuild(snapshot, rules), None
                    if announcements:  # frozen_at is in microseconds, announced_at in seconds
                        book = history.at(snapshot.frozen_at / 1e6)
                        check = check_staleness(rollout, book)
                        rollout = apply_staleness(rollout, book, max_staleness, "mask", check=check) or rollout
                    summary.rows[snapshot.rollout_id] = _row(snapshot, rollout, check)
    return summary


class VersionHistory:
    """The book as it stood at a time: the announcements made by then (``announced_at`` 0: from the start)."""

    def __init__(self, announcements: Sequence[PolicyVersion]) -> None:
        self._ordered = sorted(announcements, key=lambda a: a.announced_at)
        self._times = [a.announced_at for a in self._ordered]
        self._books: dict[int, VersionBook] = {}

    def at(self, when_s: float) -> VersionBook:
        n = bisect.bisect_right(self._times, when_s)
        book = self._books.get(n)
        if book is None:
            book = self._books[n] = VersionBook(self._ordered[:n])
        return book


def _scanned(records: Iterable[Any], until_ms: int | None, summary: Summary) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) of the records before ``until_ms``, counted; a record without a key folds as a dead letter."""
    for record in records:
        if until_ms is not None and record.timestamp_ms >= until_ms:
            return
        summary.events_scanned += 1
        yield record.key or b"", record.value


def _row(snapshot: Snapshot, rollout: RebuiltRollout, check: StalenessCheck | None = None) -> RolloutRow:
    calls = [sc.call for sc in snapshot.calls]
    return RolloutRow(
        rollout_id=snapshot.rollout_id,
        finished_ms=snapshot.frozen_at // 1000,
        masked=rollout.mask_sample,
        reasons=[r.code for r in rollout.mask_reasons],
        n_calls=rollout.metrics.n_calls,
        generated_tokens=rollout.metrics.generated_tokens_captured,
        delivered_fraction=rollout.metrics.delivered_fraction,
        harnesses=sorted({harness_of(c.facts.user_agent) for c in calls}) or ["unknown"],
        models=sorted({c.facts.requested_model or c.model or "unknown" for c in calls}) or ["unknown"],
        traces=kind_counts(rollout.traces),
        masked_traces=kind_counts(rollout.traces, masked=True),
        staleness=check.staleness if check is not None else None,
        judged=check is not None and check.loss_bearing,
    )


def _trace_totals(rows: list[RolloutRow]) -> dict[str, Any]:
    """``{"traces": N, "masked": M, "rollouts_with_masked_traces": R, "by_kind": {kind: {"traces", "masked"}}}``."""
    by_kind: Counter[str] = Counter()
    masked: Counter[str] = Counter()
    for r in rows:
        by_kind.update(r.traces)
        masked.update(r.masked_traces)
    ordered = kind_order(by_kind)
    return {
        "traces": sum(by_kind.values()),
        "masked": sum(masked.values()),
        "rollouts_with_masked_traces": sum(1 for r in rows if r.masked_traces),
        "by_kind": {kind: {"traces": by_kind[kind], "masked": masked[kind]} for kind in ordered},
    }


def _staleness_totals(rows: list[RolloutRow], max_staleness: int | None) -> dict[str, Any]:
    """``{"histogram": {versions behind: rollouts}, "unknown", "rollouts_judged", "max_staleness", "stale"}``."""
    judged = [r for r in rows if r.judged]
    known = Counter(r.staleness for r in judged if r.staleness is not None)
    return {
        "rollouts_judged": len(judged),
        "histogram": {str(k): known[k] for k in sorted(known)},
        "unknown": sum(1 for r in judged if r.staleness is None),
        "max_staleness": max_staleness,
        "stale": sum(1 for r in rows if MaskCode.STALE_POLICY in r.reasons),
    }


def harness_of(user_agent: str) -> str:
    """The harness a user agent names, without its version (``claude-cli/2.1.3 (...)`` -> ``claude-cli``)."""
    first = (user_agent or "").split(" ", 1)[0]
    return _VERSION.sub("", first) or "unknown"


def _breakdown(rows: list[RolloutRow], attribute: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = defaultdict(lambda: {"rollouts": 0, "masked": 0, "reasons": Counter()})
    for r in rows:
        for name in getattr(r, attribute):
            entry = out[name]
            entry["rollouts"] += 1
            if r.masked:
                entry["masked"] += 1
                entry["reasons"].update(r.reasons)
    return {k: {"rollouts": v["rollouts"], "masked": v["masked"],
                "masked_fraction": round(v["masked"] / v["rollouts"], 4), "reasons": dict(v["reasons"])}
            for k, v in sorted(out.items())}


def render_text(data: dict[str, Any]) -> str:
    lines = [f"{data['rollouts']} rollouts finished in range ({data['events_scanned']} events scanned); "
             f"{data['masked']} masked ({data['masked_fraction']:.1%})"]
    if data["by_reason"]:
        lines.append("mask reasons:")
        lines += [f"  {n:>6}  {code}" for code, n in data["by_reason"].items()]
    for title, key in (("by harness (user agent):", "by_harness"), ("by model (requested):", "by_model")):
        lines.append(title)
        for name, entry in data[key].items():
            reasons = ", ".join(f"{c} x{n}" for c, n in entry["reasons"].items())
            lines.append(f"  {name:<28} {entry['rollouts']:>6} rollouts  {entry['masked']:>6} masked "
                         f"({entry['masked_fraction']:.1%}){'  ' + reasons if reasons else ''}")
    if data["top_masked"]:
        lines.append("costliest masked rollouts (generated tokens not trainable):")
        for r in data["top_masked"]:
            lines.append(f"  {r['rollout_id']:<32} {r['generated_tokens']:>8} tokens  {r['n_calls']:>4} calls  "
                         f"{', '.join(r['reasons'])}")
        lines.append("  explain one: tokentrail replay --bootstrap ... --rollout <id>")
    if "traces" in data:
        t = data["traces"]
        lines.append(f"traces (delivery_mode traces): {t['traces']}, {t['masked']} masked "
                     f"(in {t['rollouts_with_masked_traces']} rollout(s))")
        lines += [f"  {kind:<12} {e['traces']:>6} traces  {e['masked']:>6} masked" for kind, e in t["by_kind"].items()]
    if "staleness" in data:
        st = data["staleness"]
        bound = "" if st["max_staleness"] is None else f"; {st['stale']} beyond max_staleness={st['max_staleness']}"
        lines.append(f"policy staleness at freeze (versions behind the current one), {st['rollouts_judged']} "
                     f"rollouts judged, {st['unknown']} unknown{bound}:")
        top = max(st["histogram"].values(), default=0)
        lines += [f"  {k:>4}  {n:>6}  {'#' * max(1, round(40 * n / top)) if n else ''}"
                  for k, n in st["histogram"].items()]
    return "\n".join(lines)
