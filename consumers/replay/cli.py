"""``tokentrail replay``: why was this rollout masked, and what would change it.

    tokentrail replay --bootstrap B --rollout ID [--rollout ID ...] [--from T] [--until T]
                      [--rules FILE] [--delivery traces|terminal|gym] [--format text|json]
                      [--max-staleness K]
    tokentrail replay --bootstrap B --summary [--from T] [--until T] [--rules FILE]
                      [--delivery traces|terminal|gym] [--format text|json] [--html FILE]
                      [--max-staleness K]

Reads ``tokentrail.rollout-events`` directly (no consumer group, nothing
committed, no processor needed), runs the same pure fold and rebuild as the
live pipeline, and explains the result. With ``--rules`` it also rebuilds under
those rules and prints what would change. Times: ISO (2026-11-30T01:00:00Z),
epoch seconds, ``90m``/``2h``/``1d`` ago, or ``offset:N`` (single rollouts).

``--delivery traces|terminal|gym`` overrides ``delivery_mode`` of the rules in
play: of ``--rules`` when given, else of the rules the replay itself uses (the
defaults; for ``--summary`` the defaults without response projection). So
``--rollout ID --delivery traces`` explains the rollout with its trace tree,
``--rollout ID --rules F --delivery traces`` explains it under the defaults and
then lists what F, delivering traces, changes (trace counts per kind included)
and prints that trace tree, and ``--summary --delivery traces`` also counts
traces and masked traces per kind.

When the policy-versions topic holds announcements, each rollout is judged
against the version current when it froze: ``--rollout`` prints its calls'
version spans and its staleness, ``--summary`` histograms staleness;
``--max-staleness K`` masks, in both, as ``tokentrail consume --max-staleness K``
would (the topic must then exist).

``tokentrail replay --last-demo`` (``make why``) is ``compose.ops.replay``: finding
the demo's broker is compose's job, and consumers never import compose.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from schemas.kafka.security import add_kafka_config_option


def configure(parser: argparse.ArgumentParser) -> None:
    from consumers.rebuild.rules import DELIVERY_MODES

    parser.add_argument("--bootstrap", help="Kafka bootstrap servers host:port")
    parser.add_argument("--rollout", action="append", default=[], help="rollout id to explain (repeatable)")
    parser.add_argument("--summary", action="store_true", help="summarise every rollout finished in the range")
    parser.add_argument("--from", dest="since", help="start of the range (time or offset:N)")
    parser.add_argument("--until", help="end of the range (time or offset:N)")
    parser.add_argument("--lookback", default="1h", help="summary: read this much before --from (default 1h)")
    parser.add_argument("--rules", type=Path, help="JSON file of rebuild rules to re-decide under")
    parser.add_argument("--delivery", choices=list(DELIVERY_MODES),
                        help="override the rules' delivery_mode: of --rules when given, else of the replay's own "
                             "rules (traces: show the trace tree / count traces per kind)")
    parser.add_argument("--format", choices=["text", "json"], default="text")
    parser.add_argument("--html", type=Path, help="summary: also write an HTML report here")
    parser.add_argument("--max-staleness", type=int, default=None, metavar="K",
                        help="mask rollouts more than K policy versions behind at freeze (as `consume "
                             "--max-staleness K`; needs the policy-versions topic)")
    parser.add_argument("--topic-prefix", default="", help="prefix of every topic name")
    add_kafka_config_option(parser)


def main(args: argparse.Namespace) -> int:
    from consumers.rebuild import RebuildRules
    from consumers.replay.rollouts import parse_bound
    from schemas.errors import TokentrailError

    if not args.bootstrap:
        print("tokentrail replay: --bootstrap is required", file=sys.stderr)
        return 2
    if not args.rollout and not args.summary:
        print("tokentrail replay: give --rollout ID (repeatable) or --summary", file=sys.stderr)
        return 2
    try:
        from schemas.kafka.security import security_of_args

        args.security = security_of_args(args)  # parsed once; every reader below uses it
        since, until = parse_bound(args.since), parse_bound(args.until)
        new_rules = None
        if args.rules is not None:
            new_rules = RebuildRules.from_mapping(json.loads(args.rules.read_text()))
        delivery = getattr(args, "delivery", None)  # absent from a Namespace built by an older caller
        if args.summary:
            rules = _delivering(new_rules or RebuildRules(project_response=False), delivery)
            return _summary(args, since, until, rules)
        if new_rules is None:
            return _rollouts(args, since, until, _delivering(RebuildRules(), delivery), None)
        return _rollouts(args, since, until, RebuildRules(), _delivering(new_rules, delivery))
    except (TokentrailError, OSError, ValueError) as exc:
        print(f"tokentrail replay: {exc}", file=sys.stderr)
        return 2


def _delivering(rules, delivery: str | None):
    """``rules`` with ``delivery_mode`` replaced by ``--delivery`` when that was given."""
    return rules if delivery is None else dataclasses.replace(rules, delivery_mode=delivery)


def _rollouts(args, since, until, rules, new_rules) -> int:
    from consumers.rebuild import rebuild
    from consumers.rebuild.output import to_json_dict
    from consumers.replay.eventlog import EventLog
    from consumers.replay.explain import explain, trace_changes, trace_tree
    from consumers.replay.rollouts import replay_rollout, rule_changes
    from schemas.kafka.topics import topic_names

    names = topic_names(args.topic_prefix)
    judge = _staleness_judge(args, names)
    log = EventLog(args.bootstrap, names.rollout_events, security=args.security)
    documents = []
    try:
        for rollout_id in args.rollout:
            result = replay_rollout(log, rollout_id, rules=rules, since=since, until=until)
            if result.rollout is not None and result.snapshot is not None:
                result.rebuilt[-1] = judge(result.snapshot, result.rollout)
            changes = redecided = None
            if new_rules is not None and result.snapshot is not None:
                original = result.rollout
                assert original is not None  # each snapshot is rebuilt as it is read
                # Judged as the original is, so the comparison shows what the rule file changes, not the bound.
                redecided = judge(result.snapshot, rebuild(result.snapshot, new_rules))
                changes = rule_changes(original, redecided) + trace_changes(original, redecided)
            if args.format == "json":
                documents.append({
                    "rollout_id": rollout_id,
                    "events": len(result.events),
                    "freezes": len(result.snapshots),
                    "rebuilt": to_json_dict(result.rollout, include_response=False) if result.rollout else None,
                    "changes_under_rules": changes,
                })
                continue
            print(explain(result))
            if changes is not None:
                under = " with ".join([str(args.rules), *([f"--delivery {args.delivery}"] if getattr(
                    args, "delivery", None) else [])])
                print(f"\nunder {under}: " + ("no change" if not changes else ""))
                for change in changes:
                    print(f"  - {change}")
                assert redecided is not None and result.rollout is not None  # set with `changes`
                tree = trace_tree(redecided) if redecided.traces else []
                if tree and tree != trace_tree(result.rollout):
                    print("\n".join(["", f"under {under}, {tree[0]}", *tree[1:]]))
            print()
    finally:
        log.close()
    if args.format == "json":
        print(json.dumps(documents, indent=1))
    return 0


def _staleness_judge(args, names):
    """``(snapshot, rollout) -> rollout`` with its staleness at freeze, as the summary judges it; identity
    when the versions topic holds no announcement (``--max-staleness`` then needs the topic)."""
    from consumers.rebuild.staleness import apply_staleness
    from consumers.replay.summary import VersionHistory

    max_staleness = _max_staleness(args)
    announcements = read_announcements(args.bootstrap, names.policy_versions, required=max_staleness is not None,
                                       security=args.security)
    if not announcements:
        return lambda snapshot, rollout: rollout
    history = VersionHistory(announcements)  # frozen_at is in microseconds, announced_at in seconds
    return lambda snapshot, rollout: apply_staleness(rollout, history.at(snapshot.frozen_at / 1e6), max_staleness,
                                                     "mask") or rollout


def _max_staleness(args) -> int | None:
    value = getattr(args, "max_staleness", None)  # absent from a Namespace built by an older caller
    if value is not None and value < 0:
        raise ValueError(f"--max-staleness={value} must be >= 0")
    return value


def _summary(args, since, until, rules) -> int:
    from consumers.replay.eventlog import EventLog
    from consumers.replay.report_html import render_html
    from consumers.replay.rollouts import parse_duration
    from consumers.replay.summary import render_text, summarize
    from schemas.kafka.topics import topic_names

    if since.offset is not None or until.offset is not None:
        print("tokentrail replay: --summary takes times, not offsets", file=sys.stderr)
        return 2
    max_staleness = _max_staleness(args)
    lookback_s = parse_duration(args.lookback, name="--lookback")
    names = topic_names(args.topic_prefix)
    announcements = read_announcements(args.bootstrap, names.policy_versions, required=max_staleness is not None,
                                       security=args.security)
    log = EventLog(args.bootstrap, names.rollout_events, security=args.security)
    try:
        data = summarize(log, since_ms=since.time_ms, until_ms=until.time_ms,
                         lookback_ms=int(lookback_s * 1000), rules=rules, announcements=announcements,
                         max_staleness=max_staleness).to_dict()
    finally:
        log.close()
    if args.html is not None:
        args.html.write_text(render_html(data))
    print(json.dumps(data, indent=1) if args.format == "json" else render_text(data))
    if args.html is not None and args.format == "text":
        print(f"HTML report: {args.html}")
    return 0


def read_announcements(bootstrap: str, topic: str, *, required: bool, timeout_s: float = 30.0,
                       security: Any = None) -> list:
    """Every announcement on the policy-versions ``topic`` (its compacted state), oldest offset first.

    An absent topic is no announcement, unless ``required`` (``--max-staleness``): then a
    ``TransportError`` naming the topic and the command that creates it.
    """
    from schemas.errors import TransportError
    from schemas.kafka.versions import VersionFollower
    from schemas.policy_versions import VersionBook

    seen: list = []

    class _Recording(VersionBook):  # the follower folds into a book; this one also keeps the history
        def apply(self, announcement) -> bool:
            seen.append(announcement)
            return super().apply(announcement)

    follower = VersionFollower(bootstrap, topic, security=security)
    follower.book = _Recording()
    try:
        follower.start()
    except TransportError:
        if required:
            raise
        return []
    try:
        if not follower.wait_caught_up(timeout_s):
            raise TransportError(f"could not read {topic} at {bootstrap} to its end within {timeout_s:g} s")
    finally:
        follower.close()
    return list(seen)
