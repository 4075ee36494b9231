"""Replay: re-run the live pipeline's pure fold and rebuild over a rollout's logged events.

``replay_rollout`` reads ``tokentrail.rollout-events`` directly (only the
rollout's partition, keys compared before decoding, one record at a time; no
consumer group, nothing committed), folds every event with the same
``processors.fold`` the Faust processor runs, and rebuilds every snapshot a
freeze produces with ``consumers.rebuild``. The fold and the rebuild are
deterministic, so the last snapshot and rebuilt record equal what the live
pipeline produced for the same events and rules, byte for byte.

Time and offset bounds select which records are folded: ``from`` skips earlier
records (useful only when what came before does not matter), ``until`` stops.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from consumers.rebuild import RebuildRules, rebuild
from consumers.replay.eventlog import EventLog, LoggedEvent
from processors.fold import DeadLetter
from processors.replay import replay
from schemas.errors import ConfigError
from schemas.kafka.topics import key_for
from schemas.records import RebuiltRollout, RolloutEvent, Snapshot

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True, slots=True)
class Bound:
    """A replay bound: a wall-clock time (ms since the epoch) or a partition offset."""

    time_ms: int | None = None
    offset: int | None = None


def parse_bound(text: str | None, *, now: float | None = None) -> Bound:
    """``2026-11-30T01:00:00Z``, epoch seconds, ``90m`` / ``2h`` / ``1d`` ago, or ``offset:N``."""
    if not text:
        return Bound()
    if text.startswith("offset:"):
        try:
            return Bound(offset=int(text[len("offset:"):]))
        except ValueError:
            raise ConfigError(f"bound {text!r}: an offset bound is offset:<integer>") from None
    relative = _RELATIVE.match(text)
    if relative:
        # ``now=0.0`` is a valid "now" (the epoch), not "no now": test for None, never for falsiness.
        ago = parse_duration(text)
        return Bound(time_ms=int(((time.time() if now is None else now) - ago) * 1000))
    try:
        return Bound(time_ms=int(float(text) * 1000))
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"bound {text!r}: use an ISO time (2026-11-30T01:00:00Z), epoch seconds, a duration ago (90m, 2h, 1d) "
            "or offset:N"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return Bound(time_ms=int(parsed.timestamp() * 1000))


def parse_duration(text: str, *, name: str = "duration") -> float:
    """``90m`` / ``2h`` / ``1d`` / ``30s`` (or plain seconds) as seconds; ``ConfigError`` naming ``name`` otherwise."""
    relative = _RELATIVE.match(text.strip()) if isinstance(text, str) else None
    if relative:
        return float(relative.group(1)) * _UNITS[relative.group(2)]
    try:
        seconds = float(text)
    except (TypeError, ValueError):
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise ConfigError(f"{name} {text!r}: use a duration such as 30m, 2h, 1d or 45s (a number of seconds >= 0)")
    return seconds


@dataclass(slots=True)
class ReplayedEvent:
    """One folded record: where it sits in the log, what it was, and what the fold did with it."""

    partition: int
    offset: int
    timestamp_ms: int
    event: RolloutEvent | None
    notes: list[str]
    deadletters: list[DeadLetter]
    changed: bool


@dataclass(slots=True)
class ReplayResult:
    rollout_id: str
    events: list[ReplayedEvent] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)
    rebuilt: list[RebuiltRollout] = field(default_factory=list)

    @property
    def snapshot(self) -> Snapshot | None:
        return self.snapshots[-1] if self.snapshots else None

    @property
    def rollout(self) -> RebuiltRollout | None:
        return self.rebuilt[-1] if self.rebuilt else None


def fold_records(rollout_id: str, records: Iterable[LoggedEvent], rules: RebuildRules,
                 until: Bound = Bound()) -> ReplayResult:
    """Fold a rollout's records in log order and rebuild every snapshot (pure apart from the iterator)."""
    out = ReplayResult(rollout_id)
    for step in replay(_until(records, until), key=key_for(rollout_id)):
        record, result = step.record, step.result
        out.events.append(ReplayedEvent(record.partition, record.offset, record.timestamp_ms, step.event(),
                                        list(result.notes), list(result.deadletters), result.changed))
        for snapshot in result.snapshots:
            out.snapshots.append(snapshot)
            out.rebuilt.append(rebuild(snapshot, rules))
    return out


def _until(records: Iterable[LoggedEvent], until: Bound) -> Iterator[LoggedEvent]:
    """The records before the bound (the first one at or past it ends the replay)."""
    for record in records:
        if until.offset is not None and record.offset >= until.offset:
            return
        if until.time_ms is not None and record.timestamp_ms >= until.time_ms:
            return
        yield record


def replay_rollout(log: EventLog, rollout_id: str, *, rules: RebuildRules = RebuildRules(),
                   since: Bound = Bound(), until: Bound = Bound()) -> ReplayResult:
    """Replay one rollout from the log (see the module docstring)."""
    records = log.rollout_events(rollout_id, from_offset=since.offset, from_time_ms=since.time_ms)
    return fold_records(rollout_id, records, rules, until)


def rule_changes(before: RebuiltRollout, after: RebuiltRollout) -> list[str]:
    """What a different rule set changes in a rebuilt rollout, as sentences."""
    changes = []
    if before.mask_sample != after.mask_sample:
        changes.append(f"mask_sample {str(before.mask_sample).lower()} -> {str(after.mask_sample).lower()}")
    old = {r.code for r in before.mask_reasons}
    new = {r.code for r in after.mask_reasons}
    if old - new:
        changes.append(f"no longer masked for: {', '.join(sorted(old - new))}")
    if new - old:
        changes.append(f"newly masked for: {', '.join(sorted(new - old))}")
    b, a = before.metrics, after.metrics
    for name in ("side_calls_excluded", "roots", "chains", "generated_tokens_delivered", "delivered_fraction",
                 "quarantined_calls"):
        if getattr(b, name) != getattr(a, name):
            changes.append(f"{name} {getattr(b, name)} -> {getattr(a, name)}")
    bt, at = b.terminal_attribution, a.terminal_attribution
    if (bt.method, bt.call_id) != (at.method, at.call_id):
        changes.append(f"terminal {bt.method}:{_short(bt.call_id)} -> {at.method}:{_short(at.call_id)}")
    if (before.trajectory is None) != (after.trajectory is None) or (
        before.trajectory and after.trajectory and before.trajectory.token_ids != after.trajectory.token_ids
    ):
        changes.append("delivered tokens differ")
    return changes


def _short(call_id: str | None) -> str:
    return call_id[:8] if call_id else "-"
