"""Chaos accounting: what each rollout's harness was acknowledged against what was delivered (pure).

Inputs per rollout (``Outcome``): the model call ids the harness got a 2xx answer for
(*acknowledged*), how many of its attempts failed and were retried because of the fault, a
call it gave up on (if any; see ``compose.tools.chaos.workload``), every record the sink received
for it, and the evidence the event log holds for it: CallCaptured events per call id, and the
ids of its CallStarted intents and CallIncomplete markers. The baseline is the canonical
record of each rollout index from a clean run of the same deterministic workload.

A rollout *lost a call* when its trajectory misses an acknowledged call, when the harness
gave up on a call, or when the log holds an intent (CallStarted: the call was dispatched, so
the engine may have sampled for it) with neither a CallCaptured nor a CallIncomplete for it.
A rollout was *hit* by the fault when any of its attempts failed, or it lost a call.

The four counts that must be zero (``COUNTS``, ``failing``):

- **lost**: an acknowledged call whose CallCaptured is not on the event log, or whose rollout
  was never delivered.
- **duplicated**: a rollout delivered more than once (two records: two identities, since the
  sink drops a repeated one), a call twice in a delivered trajectory, or an acknowledged call
  with more than one CallCaptured on the log (the spool and the idempotent producer promise
  exactly once; the fold would hide it, the count does not).
- **unmasked, lost a call**: a record delivered with ``mask_sample: false`` for a rollout that
  lost a call.
- **differs**: the record is not what it must be. A rollout not hit must be delivered *equal
  to the baseline* after ``canonical``; a hit one equal to the baseline (its retries left
  nothing behind), or *masked with at least one reason*, or, when it lost no call, equal to the
  baseline apart from the evidence its failed attempts left (``ATTEMPT_EVIDENCE``: an attempt the
  engine aborted is a CallIncomplete, so the snapshot folded more events and says a call of it
  was incomplete; the retry's capture is the trajectory, and the harness never saw the aborted
  tokens); a rollout with no record differs.

``canonical`` is the record with what is legitimately run-specific taken out
(``RUN_SPECIFIC_KEYS``, the rollout id, the model call ids): everything else, token ids,
log-probs (exact floats), loss mask, spans, mask decision and reasons, result, version,
metrics and the Responses projection, must be equal.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["ATTEMPT_EVIDENCE", "RUN_SPECIFIC_KEYS", "Outcome", "Row", "account", "canonical", "failing", "render", "total"]

# Fields dropped before comparing with the clean run, and why they legitimately differ.
RUN_SPECIFIC_KEYS: Mapping[str, str] = {
    "snapshot_id": "digest over the rollout id and the event ids minted at capture time",
    "rollout_id": "each run names its rollouts <run>-<fault>-<index>",
}
# Model call ids (uuid4 hex, minted per call) anywhere in a string; numbered by first appearance.
_CALL_ID = re.compile(r"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])")

COUNTS = ("lost", "duplicated", "unmasked_lost", "differs")
# What a retried attempt recorded incomplete legitimately changes in its rollout's record (dotted paths);
# set aside only for a hit rollout that lost no call.
ATTEMPT_EVIDENCE: Mapping[str, str] = {
    "version": "the snapshot's version counts the events folded: the failed attempt's intent and marker",
    "_ng_token_capture.capture_incomplete": "a call of the rollout ended incomplete (the attempt the harness retried)",
}


@dataclass(frozen=True, slots=True)
class Outcome:
    index: int
    rollout_id: str
    acked: tuple[str, ...]  # model call ids answered 2xx, in order
    failure: str | None  # a call the harness gave up on (None: every call was answered in the end)
    records: tuple[Mapping[str, Any], ...]  # every record delivered for this rollout, in order
    captured: Mapping[str, int]  # CallCaptured events on the log, per model call id
    failed_attempts: int = 0  # attempts that failed because of the fault and were retried
    started: frozenset[str] = frozenset()  # model call ids of the CallStarted intents on the log
    incomplete: frozenset[str] = frozenset()  # model call ids of the CallIncomplete markers on the log

    def dangling(self) -> list[str]:
        """Intents on the log with neither a capture nor an incomplete marker: calls whose tokens are lost."""
        return sorted(c for c in self.started if not self.captured.get(c) and c not in self.incomplete)


@dataclass(slots=True)
class Row:
    fault: str
    rollouts: int = 0
    acked: int = 0
    fault_hit: int = 0  # rollouts an attempt of which failed, or that lost a call
    masked_as_expected: int = 0  # of those, delivered masked with a reason
    lost: int = 0
    duplicated: int = 0
    unmasked_lost: int = 0
    differs: int = 0
    note: str = ""
    problems: list[str] = field(default_factory=list)  # one line per counted cell, naming the rollout


def canonical(record: Mapping[str, Any], rollout_id: str | None = None) -> str:
    """The record as comparable text: run-specific fields dropped, rollout and call ids replaced by placeholders."""
    rollout_id = rollout_id or str(record.get("rollout_id", ""))
    kept = {k: v for k, v in record.items() if k not in RUN_SPECIFIC_KEYS}
    text = _dump(kept)
    if rollout_id:
        text = text.replace(rollout_id, "<rollout>")
    numbers: dict[str, str] = {}
    return _CALL_ID.sub(lambda m: numbers.setdefault(m.group(0), f"<call{len(numbers)}>"), text)


def account(fault: str, outcomes: Sequence[Outcome], baseline: Mapping[int, str], *, note: str = "",
            versions_unreadable: bool = False) -> Row:
    """One table row: the four counts over ``outcomes``, against the clean run's canonical records.

    ``versions_unreadable``: the fault left the interceptor unable to read the policy-versions topic for a
    while (restarted with the broker down), so a call it dispatched then is recorded with no dispatch
    version. Unknown is what it must record (fail closed: a rollout whose tokens carry no version of their
    own is masked ``unknown_policy_version``), so a span's ``dispatch_version`` may be null where the clean
    run's names one; any other value still differs.
    """
    row = Row(fault, rollouts=len(outcomes), note=note)
    for o in outcomes:
        row.acked += len(o.acked)
        latest = o.records[-1] if o.records else None
        spans = [s["model_call_id"] for s in ((latest or {}).get("trajectory") or {}).get("spans", [])]
        for call in o.acked:
            if latest is None or not o.captured.get(call):
                row.lost += 1
                row.problems.append(f"lost: {o.rollout_id} call {call} "
                                    f"({'never delivered' if latest is None else 'no CallCaptured on the log'})")
            elif o.captured[call] > 1:
                row.duplicated += 1
                row.problems.append(f"duplicated: {o.rollout_id} call {call} captured {o.captured[call]} times")
        if len(o.records) > 1:
            row.duplicated += len(o.records) - 1
            row.problems.append(f"duplicated: {o.rollout_id} delivered {len(o.records)} times")
        if len(spans) != len(set(spans)):
            row.duplicated += len(spans) - len(set(spans))
            row.problems.append(f"duplicated: {o.rollout_id} has a call twice in its trajectory")
        masked = latest is not None and bool(latest.get("mask_sample", True))
        missing = [c for c in o.acked if latest is not None and c not in spans]
        lost_call = [f"gave up on a call: {o.failure}"] if o.failure is not None else []
        lost_call += [f"acknowledged calls {missing} not in its trajectory"] if missing else []
        lost_call += [f"intents {o.dangling()} with no capture"] if o.dangling() else []
        hit = bool(lost_call) or o.failed_attempts > 0
        row.fault_hit += hit
        if latest is None:
            row.differs += 1
            row.problems.append(f"differs: {o.rollout_id} was never delivered")
            continue
        if not masked and lost_call:
            row.unmasked_lost += 1
            row.problems.append(f"unmasked_lost: {o.rollout_id} delivered unmasked though it lost a call "
                                f"({'; '.join(lost_call)})")
        if hit and masked and latest.get("mask_reasons"):
            row.masked_as_expected += 1
        elif not _matches(latest, o, baseline, retried=hit and not lost_call, unknown_ok=versions_unreadable):
            row.differs += 1
            row.problems.append(f"differs: {o.rollout_id} record differs from the clean run's rollout {o.index}"
                                f" (hit by the fault: {hit}, mask_sample={latest.get('mask_sample')}, reasons="
                                f"{[r.get('code') for r in latest.get('mask_reasons', [])]})")
    return row


def _matches(record: Mapping[str, Any], o: Outcome, baseline: Mapping[int, str], *, retried: bool,
             unknown_ok: bool) -> bool:
    """``record`` equals the clean run's; or does apart from ``ATTEMPT_EVIDENCE`` (``retried``: hit, no call
    lost), or apart from dispatch versions it records as unknown (``unknown_ok``), or both."""
    text, clean = canonical(record, o.rollout_id), baseline.get(o.index)
    if text == clean:
        return True
    if clean is None or not (retried or unknown_ok):
        return False
    if unknown_ok:
        text, clean = _unknown_dispatch_taken(text, clean)
    if retried:
        text, clean = _without_evidence(text), _without_evidence(clean)
    return text == clean


def _unknown_dispatch_taken(text: str, clean: str) -> tuple[str, str]:
    """Both records with the clean run's ``dispatch_version`` set to null on each span where ``text`` has null."""
    record, base = json.loads(text), json.loads(clean)
    spans = (record.get("trajectory") or {}).get("spans") or []
    base_spans = (base.get("trajectory") or {}).get("spans") or []
    for span, base_span in zip(spans, base_spans):
        if isinstance(span, dict) and isinstance(base_span, dict) and span.get("dispatch_version", "") is None:
            base_span["dispatch_version"] = None
    return _dump(record), _dump(base)


def _without_evidence(text: str) -> str:
    record = json.loads(text)
    for path in ATTEMPT_EVIDENCE:
        *parents, key = path.split(".")
        node = record
        for parent in parents:
            node = node.get(parent) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(key, None)
    return _dump(record)


def _dump(record: Any) -> str:
    """The one serialisation every comparison uses (keys sorted, no spaces, no NaN)."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False)


def total(rows: Sequence[Row]) -> Row:
    out = Row("total")
    for row in rows:
        for f in fields(Row):
            if f.type in ("int", int):
                setattr(out, f.name, getattr(out, f.name) + getattr(row, f.name))
        out.problems.extend(row.problems)
    return out


def failing(rows: Sequence[Row]) -> bool:
    """True if any row has a non-zero count in one of the four columns that must be zero."""
    return any(getattr(row, c) for row in rows for c in COUNTS)


_COLUMNS = (("fault", "fault", "<"), ("rollouts", "rollouts", ">"), ("acked", "acked calls", ">"),
            ("fault_hit", "hit", ">"), ("masked_as_expected", "masked ok", ">"),
            ("lost", "LOST", ">"), ("duplicated", "DUPLICATED", ">"),
            ("unmasked_lost", "UNMASKED+LOST CALL", ">"), ("differs", "DIFFERS", ">"))
_LEGEND = ("LOST: acknowledged (2xx) calls lost; DUPLICATED: calls or rollouts delivered twice; UNMASKED+LOST CALL: "
           "rollouts delivered unmasked that lost a call; DIFFERS: records unlike the clean run's (a hit rollout may "
           "instead be masked with a reason: 'masked ok', or, having lost no call, differ only by the evidence of its "
           "retried attempts: the snapshot version and capture_incomplete). hit: rollouts a retried attempt or a lost call of which "
           "the fault caused. The four upper-case columns must be 0.")


def render(rows: Sequence[Row]) -> str:
    """The table (rows as given, then a rule and the total), then each row's note, then every problem."""
    every = [*rows, total(rows)]
    cells = [[h for _, h, _ in _COLUMNS]] + [[str(getattr(r, a)) for a, _, _ in _COLUMNS] for r in every]
    widths = [max(len(c[i]) for c in cells) for i in range(len(_COLUMNS))]

    def line(values: list[str]) -> str:
        return "  ".join(f"{v:{al}{w}}" for v, w, (_, _, al) in zip(values, widths, _COLUMNS)).rstrip()

    out = [line(cells[0]), "-" * len(line(cells[0]))]
    out += [line(c) for c in cells[1:-1]]
    out += ["-" * len(line(cells[0])), line(cells[-1])]
    out += ["", *textwrap.wrap(_LEGEND, 110), ""] + [f"  {r.fault}: {r.note}" for r in rows if r.note]
    problems = every[-1].problems
    out += (["", f"{len(problems)} problem(s):"] + [f"  {p}" for p in problems[:50]]) if problems else []
    return "\n".join(out)
