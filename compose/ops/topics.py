"""`tokentrail topics`: create tokentrail's topics on a broker (idempotent, safe to rerun).

Exit 0 once every topic exists; 1 with a one-line reason otherwise (no traceback).
"""

from __future__ import annotations

import argparse
import sys

from schemas.kafka.security import KafkaConfigError, add_kafka_config_option, security_of_args
from schemas.kafka.topics import DEFAULT_PARTITIONS, add_topic_options, topic_names


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers, host:port[,...]")
    parser.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS,
                        help=f"partitions of each new topic (default {DEFAULT_PARTITIONS})")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds to wait for the broker to answer (default 30)")
    add_topic_options(parser, wait=False)
    add_kafka_config_option(parser)


def main(args: argparse.Namespace) -> int:
    from schemas.kafka.admin import TopicError, ensure_topics  # confluent_kafka only when this runs

    names = topic_names(args.topic_prefix)
    try:
        ensure_topics(args.bootstrap, names, args.partitions, timeout=args.timeout, security=security_of_args(args))
    except (TopicError, KafkaConfigError) as exc:
        print(f"tokentrail topics: {exc}", file=sys.stderr)
        return 1
    for name in names.all():
        print(name)
    return 0
