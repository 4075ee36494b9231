"""What scale-out must not change, checked on the records a `compose.rig.scaleout.ScaleRun` delivered.

- Once per group. Each consumer group delivers every rollout, and one record per rollout: at-least-once
  delivery may legitimately write a rollout again after a rebalance (a member stopped or joined before
  committing; the new owner re-delivers from the commit point, and the JSONL sink's idempotence is per
  file), so "once" means one *distinct* record per rollout per group, and every repeat must be that
  record byte for byte. Repeats are counted and reported, never hidden.
- Live equals replay. Folding the run's own rollout-events topic offline and rebuilding it
  (``consumers.replay``: the same fold, the consumer's own rules and JSON form) gives, per rollout,
  exactly the record every group delivered, byte for byte: no worker, partition count or rebalance
  left a trace in a record.
- Same as one worker. A record of the scaled run equals the one-worker run's record of the same
  rollout after `canonical`. The only run-specific values in a record are model call ids (minted per
  call by the interceptor: ``schemas.ids.new_model_call_id``, uuid4) and the response ids that
  embed them; `canonical` renames each to its order of first appearance. Everything else (token
  ids, log-probs, masks, spans, lineage verdicts, results, metrics) must be equal as bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from compose.rig.scaleout import ScaleRun

__all__ = ["GroupDelivery", "Verdict", "canonical", "check", "group_deliveries", "one_record_each", "replayed"]

# A model call id: 32 lowercase hex digits, not part of a longer hex run (digests are 64).
_CALL_ID = re.compile(rb"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])")
_ROLLOUT_ID = re.compile(rb'^\{"rollout_id":"([^"]*)"')


@dataclass
class GroupDelivery:
    group: str
    records: dict[str, list[bytes]] = field(default_factory=dict)  # rollout -> every line its members wrote

    def distinct(self, rollout_id: str) -> set[bytes]:
        return set(self.records.get(rollout_id, []))

    @property
    def repeats(self) -> int:
        """Records written more than once (identical repeats: at-least-once after a rebalance)."""
        return sum(len(lines) - 1 for lines in self.records.values())


def group_deliveries(run: ScaleRun) -> dict[str, GroupDelivery]:
    out = {}
    for group, members in run.groups.items():
        delivery = GroupDelivery(group)
        for consumer in members:
            for line in run.lines(consumer):
                delivery.records.setdefault(_rollout_of(line), []).append(line)
        out[group] = delivery
    return out


def replayed(run: ScaleRun) -> dict[str, list[bytes]]:
    """Per rollout, the JSON record of each snapshot an offline replay of the run's event log rebuilds."""
    from consumers.rebuild.output import to_json_line
    from consumers.replay.eventlog import EventLog
    from consumers.replay.rollouts import fold_records
    from consumers.settings import ConsumerSettings

    topics = run.stack.topics
    rules = ConsumerSettings(bootstrap=run.bootstrap, topics=topics).rebuild_rules()  # what `tokentrail consume` uses
    log = EventLog(run.bootstrap, topics.rollout_events)
    try:
        by_rollout: dict[str, list] = {}
        for partition in range(log.partitions()):
            for record in log.partition_events(partition):
                assert record.key is not None  # the rig keys every event by its rollout
                by_rollout.setdefault(record.key.decode(), []).append(record)
    finally:
        log.close()
    return {rid: [to_json_line(r) for r in fold_records(rid, records, rules).rebuilt]
            for rid, records in by_rollout.items()}


def canonical(line: bytes) -> bytes:
    """``line`` with each model call id replaced by ``call-<n>``, n its order of first appearance."""
    names: dict[bytes, bytes] = {}
    return _CALL_ID.sub(lambda m: names.setdefault(m.group(0), b"call-%d" % len(names)), line)


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check(run: ScaleRun, rollout_ids: list[str], reference: dict[str, bytes] | None = None) -> Verdict:
    """Every check of the module docstring; ``reference``: the one-worker run's record per rollout."""
    verdict, wanted = Verdict(), set(rollout_ids)
    groups = group_deliveries(run)
    for g in groups.values():
        missing, extra = wanted - set(g.records), set(g.records) - wanted
        conflicting = sorted(rid for rid in g.records if len(g.distinct(rid)) > 1)
        for what, rids in (("missing", missing), ("unexpected", extra), ("with differing records", conflicting)):
            if rids:
                verdict.problems.append(f"group {g.group}: {len(rids)} rollouts {what}: {sorted(rids)[:6]}")
        verdict.summary.append(f"group {g.group}: {len(g.records)} rollouts, one distinct record each: "
                               f"{not conflicting and not missing}; identical repeats after rebalances: {g.repeats}")
    first = next(iter(groups.values()))
    for g in list(groups.values())[1:]:
        differ = [rid for rid in wanted & set(g.records) & set(first.records) if g.distinct(rid) != first.distinct(rid)]
        if differ:
            verdict.problems.append(f"groups {first.group} and {g.group} differ on {len(differ)} rollouts: {differ[:6]}")
    offline = replayed(run)
    not_replayed = [rid for rid in sorted(wanted & set(first.records)) if offline.get(rid) != sorted(first.distinct(rid))]
    if not_replayed:
        rid = not_replayed[0]
        verdict.problems.append(f"{len(not_replayed)} delivered records differ from an offline replay of the event "
                                f"log, e.g. {rid}: {len(offline.get(rid, []))} replayed, "
                                f"{len(first.distinct(rid))} delivered")
    verdict.summary.append(f"delivered == offline replay of the event log, byte for byte: "
                           f"{len(wanted) - len(not_replayed)}/{len(wanted)} rollouts")
    if reference is not None:
        differ = [rid for rid in sorted(wanted) if first.distinct(rid) and
                  {canonical(line) for line in first.distinct(rid)} != {canonical(reference.get(rid, b""))}]
        if differ:
            verdict.problems.append(f"{len(differ)} records differ from the one-worker run's: {differ[:6]}")
        verdict.summary.append(f"delivered == one-worker run's record (call ids canonical): "
                               f"{len(wanted) - len(differ)}/{len(wanted)} rollouts")
    return verdict


def one_record_each(run: ScaleRun) -> dict[str, bytes]:
    """The one record per rollout of a run's first group (the reference of a one-worker run)."""
    first = next(iter(group_deliveries(run).values()))
    return {rid: lines[0] for rid, lines in first.records.items()}


def _rollout_of(line: bytes) -> str:
    match = _ROLLOUT_ID.match(line)
    if match is None:
        raise ValueError(f"not a tokentrail record: {line[:80]!r}")
    return match.group(1).decode()
