"""``tokentrail process``: run one fold worker (a Faust worker) against a broker.

Run several with the same ``--app-id`` (one ``--data-dir`` each) to split the
partitions; SIGTERM stops a worker cleanly, and a worker killed any other way
recovers its tables from the changelog at the next start (``processors.app``).

The topics must exist first (`tokentrail topics`): a worker that finds one of
them missing after ``--topic-wait`` seconds (or no broker answering) exits 4
with the missing topics and the command that creates them, instead of waiting.
Exit 0 after a stop, 2 on invalid settings, 4 when topics or the broker are missing.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from pydantic import ValidationError

from schemas.kafka.security import add_kafka_config_option
from schemas.kafka.topics import add_topic_options

EXIT_TOPICS_UNAVAILABLE = 4


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers host:port")
    parser.add_argument("--data-dir", type=Path, default=Path(".tokentrail/processor"),
                        help="RocksDB directory for this worker (one per process)")
    parser.add_argument("--app-id", default="tokentrail-processor", help="consumer group id / changelog prefix")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--hole-check-interval", type=float, default=1.0, metavar="SECONDS",
                        help="how often the offset guard repeats a rewind and checks quiet partitions' tails")
    parser.add_argument("--fetch-wait-ms", type=int, default=None, metavar="MS",
                        help="longest fetch long-poll at the broker (default: ProcessorSettings.fetch_wait_ms)")
    add_topic_options(parser)
    add_kafka_config_option(parser)
    parser.add_argument("--log-level", default="WARNING")


def main(args: argparse.Namespace) -> int:
    from processors.settings import ProcessorSettings
    from schemas.kafka.topics import topic_names

    try:
        settings = ProcessorSettings(bootstrap=args.bootstrap, data_dir=args.data_dir, app_id=args.app_id,
                                     partitions=args.partitions, topics=topic_names(args.topic_prefix),
                                     hole_check_interval_s=args.hole_check_interval,
                                     topic_wait_s=args.topic_wait, kafka=args.kafka_config,
                                     **({} if args.fetch_wait_ms is None else {"fetch_wait_ms": args.fetch_wait_ms}))
    except ValidationError as exc:
        print(f"tokentrail process: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    from processors.app import (
        ProcessorWorker,
        check_topics,
        claim_local_state,
        create_app,
        faust_credentials,
        release_local_state,
    )
    from schemas.kafka.bridge import KafkaAuthFailed
    from schemas.kafka.security import KafkaConfigError
    from schemas.kafka.topics import TopicsUnavailable

    try:
        faust_credentials(settings.kafka)  # TLS files that do not load are refused before any I/O
        check_topics(settings)
    except KafkaConfigError as exc:
        print(f"tokentrail process: {exc}", file=sys.stderr)
        return 2
    except (TopicsUnavailable, KafkaAuthFailed) as exc:
        print(f"tokentrail process: {exc}", file=sys.stderr)
        return EXIT_TOPICS_UNAVAILABLE
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    app = create_app(settings)
    claim_local_state(app)
    worker = ProcessorWorker(app, loglevel=args.log_level.upper())
    try:
        worker.execute_from_commandline()
    finally:
        release_local_state(app)
    return 0
