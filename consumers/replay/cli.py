"""``tokentrail replay``: why was this rollout masked, and what would change it.

    tokentrail replay --bootstrap B --rollout ID [--rollout ID ...] [--from T] [--until T]
                      [--rules FILE] [--format text|json]
    tokentrail replay --bootstrap B --summary [--from T] [--until T] [--format text|json] [--html FILE]

Reads ``tokentrail.rollout-events`` directly (no consumer group, nothing
committed, no processor needed), runs the same pure fold and rebuild as the
live pipeline, and explains the result. With ``--rules`` it also rebuilds under
those rules and prints what would change. Times: ISO (2026-11-30T01:00:00Z),
epoch seconds, ``90m``/``2h``/``1d`` ago, or ``offset:N`` (single rollouts).
``tokentrail replay --last-demo`` (``make why``) is ``compose.replay_cli``: finding
the demo's broker is compose's job, and consumers never import compose.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers host:port")
    parser.add_argument("--rollout", action="append", default=[], help="rollout id to explain (repeatable)")
    parser.add_argument("--summary", action="store_true", help="summarise every rollout finished in the range")
    parser.add_argument("--from", dest="since", help="start of the range (time or offset:N)")
    parser.add_argument("--until", help="end of the range (time or offset:N)")
    parser.add_argument("--lookback", default="1h", help="summary: read this much before --from (default 1h)")
    parser.add_argument("--rules", type=Path, help="JSON file of rebuild rules to re-decide under")
    parser.add_argument("--format", choices=["text", "json"], default="text")
    parser.add_argument("--html", type=Path, help="summary: also write an HTML report here")
    parser.add_argument("--topic-prefix", default="", help="prefix of every topic name")


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
        since, until = parse_bound(args.since), parse_bound(args.until)
        new_rules = None
        if args.rules is not None:
            new_rules = RebuildRules.from_mapping(json.loads(args.rules.read_text()))
        if args.summary:
            return _summary(args, since, until, new_rules)
        return _rollouts(args, since, until, new_rules)
    except (TokentrailError, OSError, ValueError) as exc:
        print(f"tokentrail replay: {exc}", file=sys.stderr)
        return 2


def _rollouts(args, since, until, new_rules) -> int:
    from consumers.replay.eventlog import EventLog
    from consumers.replay.explain import explain
    from consumers.rebuild import rebuild
    from consumers.rebuild.output import to_json_dict
    from consumers.replay.rollouts import replay_rollout, rule_changes
    from schemas.topics import topic_names

    log = EventLog(args.bootstrap, topic_names(args.topic_prefix).rollout_events)
    documents = []
    try:
        for rollout_id in args.rollout:
            result = replay_rollout(log, rollout_id, since=since, until=until)
            changes = None
            if new_rules is not None and result.snapshot is not None:
                changes = rule_changes(result.rollout, rebuild(result.snapshot, new_rules))
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
                print(f"\nunder {args.rules}: " + ("no change" if not changes else ""))
                for change in changes:
                    print(f"  - {change}")
            print()
    finally:
        log.close()
    if args.format == "json":
        print(json.dumps(documents, indent=1))
    return 0


def _summary(args, since, until, new_rules) -> int:
    from consumers.replay.eventlog import EventLog
    from consumers.rebuild import RebuildRules
    from consumers.replay.rollouts import parse_duration
    from consumers.replay.report_html import render_html
    from consumers.replay.summary import render_text, summarize
    from schemas.topics import topic_names

    if since.offset is not None or until.offset is not None:
        print("tokentrail replay: --summary takes times, not offsets", file=sys.stderr)
        return 2
    lookback_s = parse_duration(args.lookback, name="--lookback")
    rules = new_rules or RebuildRules(project_response=False)
    log = EventLog(args.bootstrap, topic_names(args.topic_prefix).rollout_events)
    try:
        data = summarize(log, since_ms=since.time_ms, until_ms=until.time_ms,
                         lookback_ms=int(lookback_s * 1000), rules=rules).to_dict()
    finally:
        log.close()
    if args.html is not None:
        args.html.write_text(render_html(data))
    print(json.dumps(data, indent=1) if args.format == "json" else render_text(data))
    if args.html is not None and args.format == "text":
        print(f"HTML report: {args.html}")
    return 0
