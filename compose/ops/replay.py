"""``tokentrail replay``: the consumers' replay CLI, plus ``--last-demo`` (``make why``).

    tokentrail replay --last-demo [--rollout ID ...] [--format text|json] [--rules FILE]
    tokentrail replay --bootstrap B ...        (everything else: ``consumers.replay.cli``)

``--last-demo`` needs the demo's kept broker, which is compose's business (the
consumers package never imports compose): it restarts the broker of the last
``tokentrail demo`` on its kept log, points the consumers' replay at it
(``--bootstrap``, the demo's topic prefix, its masked rollouts unless
``--rollout`` names others), and stops the broker again, its log kept, whatever
the replay returned. Without ``--last-demo`` the arguments go to
``consumers.replay.cli`` unchanged.
"""

from __future__ import annotations

import argparse
import json
import sys

from consumers.replay import cli as replay


def configure(parser: argparse.ArgumentParser) -> None:
    replay.configure(parser)
    parser.add_argument("--last-demo", action="store_true",
                        help="explain the masked rollouts of the last `tokentrail demo` (restarts its broker briefly)")


def main(args: argparse.Namespace) -> int:
    if getattr(args, "last_demo", False):
        return last_demo(args)
    if not args.bootstrap:
        print("tokentrail replay: --bootstrap is required (or --last-demo)", file=sys.stderr)
        return 2
    return replay.main(args)


def last_demo(args: argparse.Namespace) -> int:
    """Restart the last demo's broker on its kept log, explain its masked rollouts, stop it again."""
    from compose.rig.kafka.broker import BrokerError, restart_broker, stop_broker
    from compose.rig.stack import LAST_RUN

    if not LAST_RUN.exists():
        print(f"tokentrail replay: no {LAST_RUN}: run `make demo` first", file=sys.stderr)
        return 2
    last = json.loads(LAST_RUN.read_text())
    try:
        info = restart_broker(last["kafka_dir"])
    except BrokerError as exc:
        print(f"tokentrail replay: cannot restart the demo's broker: {exc}", file=sys.stderr)
        return 2
    try:
        return replay.main(argparse.Namespace(**{
            # The demo's own broker is PLAINTEXT: a --kafka-config (or an exported TOKENTRAIL_KAFKA_CONFIG) is not its.
            **vars(args), "last_demo": False, "bootstrap": info.bootstrap, "topic_prefix": last["topic_prefix"],
            "kafka_config": None,
            "rollout": args.rollout or last["masked"] or last["rollouts"][:1],
        }))
    finally:
        stop_broker(last["kafka_dir"], keep_data=True)
