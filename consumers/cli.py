"""``tokentrail consume``: rebuild finished rollouts and deliver them to a sink.

The topics must exist first (`tokentrail topics`): a consumer that finds one it
reads or writes missing after ``--topic-wait`` seconds (or no broker answering)
exits 4 with the missing topics and the command that creates them, instead of
polling for ever. Exit 0 after a stop, 2 on invalid settings, 3 when delivery
stopped on a failure, 4 when topics or the broker are missing. With
``--max-staleness K`` the policy-versions topic is one of the topics it needs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys

from pydantic import ValidationError

from consumers.rebuild.rules import DELIVERY_MODES
from schemas.kafka.security import add_kafka_config_option
from schemas.kafka.topics import add_topic_options

EXIT_TOPICS_UNAVAILABLE = 4


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers host:port")
    parser.add_argument("--group-id", default="tokentrail-consumer")
    parser.add_argument("--sink", default="jsonl", help="'jsonl', 'kafka', 'kafka-groups' (one record per GRPO group) or module:Class of a "
                             "TrainerSink")
    parser.add_argument("--sink-path", help="JSONL file (for --sink jsonl)")
    parser.add_argument("--sink-kwargs", default="{}", help="JSON object of keyword arguments for the sink")
    parser.add_argument("--no-response", action="store_true", help="skip the Responses projection")
    parser.add_argument("--rules", default="{}",
                        help="JSON object of rebuild rules, e.g. '{\"side_call_models\": [\"haiku\"]}'")
    parser.add_argument("--delivery", choices=DELIVERY_MODES,
                        help="rebuild delivery mode (overrides the rules' delivery_mode): terminal (default), gym, "
                             "or traces (every labelled trace of the rollout's tree)")
    parser.add_argument("--side-call-model", action="append", default=[], metavar="PATTERN",
                        help="requested-model substring that marks a side call (repeatable)")
    parser.add_argument("--max-mask-fraction", type=float, help="stop when more than this fraction is masked")
    parser.add_argument("--mask-fraction-min-samples", type=int, default=50)
    parser.add_argument("--max-rollouts", type=int, help="stop after delivering this many rollouts")
    parser.add_argument("--max-staleness", type=int, default=None, metavar="K",
                        help="mask a rollout whose oldest generated token is more than K policy versions behind the "
                             "current one (stale_policy; needs the policy-versions topic)")
    parser.add_argument("--stale-action", choices=["mask", "drop"], default="mask",
                        help="with --max-staleness: deliver a stale rollout masked (default) or drop it (retired "
                             "and committed, not delivered)")
    parser.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                        help="serve Prometheus /metrics (policy staleness histogram, stale rollouts) on this port")
    parser.add_argument("--metrics-host", default="127.0.0.1")
    parser.add_argument("--fetch-wait-ms", type=int, default=None, metavar="MS",
                        help="longest fetch long-poll at the broker (default: ConsumerSettings.fetch_wait_ms)")
    add_topic_options(parser)
    add_kafka_config_option(parser)
    parser.add_argument("--log-level", default="WARNING")


def main(args: argparse.Namespace) -> int:
    from consumers.settings import ConsumerSettings
    from consumers.sinks.plugin import KAFKA_SINK_TOPICS
    from schemas.errors import ConfigError
    from schemas.kafka.topics import topic_names

    try:
        kwargs = json.loads(args.sink_kwargs)
        rules = json.loads(args.rules)
        if not isinstance(kwargs, dict) or not isinstance(rules, dict):
            raise ValueError("--sink-kwargs and --rules must be JSON objects")
        if getattr(args, "delivery", None):
            rules["delivery_mode"] = args.delivery
        if args.side_call_model:
            rules["side_call_models"] = [*rules.get("side_call_models", []), *args.side_call_model]
        topics = topic_names(args.topic_prefix)
        if args.sink_path:
            kwargs["path"] = args.sink_path
        if args.sink in KAFKA_SINK_TOPICS:  # the built-in Kafka sinks write to this cluster, prefixed
            kwargs.setdefault("bootstrap", args.bootstrap)
            kwargs.setdefault("topic", getattr(topics, KAFKA_SINK_TOPICS[args.sink]))
        settings = ConsumerSettings(bootstrap=args.bootstrap, group_id=args.group_id, sink=args.sink,
                                    sink_kwargs=kwargs, project_response=not args.no_response, rules=rules,
                                    max_mask_fraction=args.max_mask_fraction,
                                    mask_fraction_min_samples=args.mask_fraction_min_samples, topics=topics,
                                    topic_wait_s=args.topic_wait, kafka=args.kafka_config, max_staleness=getattr(args, "max_staleness", None),
                                    stale_action=getattr(args, "stale_action", "mask"),
                                    metrics_port=getattr(args, "metrics_port", None),
                                    metrics_host=getattr(args, "metrics_host", "127.0.0.1"),
                                    **({} if args.fetch_wait_ms is None else {"fetch_wait_ms": args.fetch_wait_ms}))
    except ValidationError as exc:  # one line per field: its flag, the value given and the rule (issue 26)
        print(f"tokentrail consume: invalid settings: {settings_problems(exc)}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"tokentrail consume: invalid settings: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    from consumers.sinks.plugin import load_sink

    try:
        kwargs = dict(settings.sink_kwargs)
        if settings.kafka.secured and settings.sink in KAFKA_SINK_TOPICS and kwargs.get("bootstrap") == settings.bootstrap:
            kwargs.setdefault("security", settings.kafka)  # the built-in Kafka sinks write to this cluster
        sink = load_sink(settings.sink, kwargs)
    except ConfigError as exc:
        print(f"tokentrail consume: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_run(settings, sink, args.max_rollouts))


def settings_problems(exc: ValidationError) -> str:
    """A pydantic ValidationError as one line: each field as its flag, the value given and what it must be."""
    from consumers.settings import ConsumerSettings

    parts = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error.get("loc", ()))
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        flag = "--" + field.replace("_", "-") if field in ConsumerSettings.model_fields else field
        given = f"={error['input']!r}" if "input" in error and not isinstance(error["input"], dict) else ""
        parts.append(f"{flag}{given}: " * bool(field) + f"{message[:1].lower()}{message[1:]}")
    return "; ".join(parts).replace("\n", " ") + "; fix the flag (tokentrail consume --help)"


async def _run(settings, sink, max_rollouts) -> int:
    from consumers.loop import MaskFractionExceeded, RebuildConsumer
    from schemas.errors import TransportError
    from schemas.kafka.topics import TopicsUnavailable

    consumer = RebuildConsumer(settings, sink)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    code = 0
    try:
        await consumer.run(stop=stop, max_rollouts=max_rollouts)
    except TopicsUnavailable as exc:
        print(f"tokentrail consume: {exc}", file=sys.stderr)
        code = EXIT_TOPICS_UNAVAILABLE
    except (MaskFractionExceeded, TransportError) as exc:
        print(f"tokentrail consume: {exc}", file=sys.stderr)
        code = 3
    finally:
        await consumer.close()
    stats = consumer.stats
    print(json.dumps({"rebuilt": stats.rebuilt, "delivered": stats.delivered, "masked": stats.masked,
                      "dropped": stats.dropped, "deadletters": stats.deadletters,
                      "mask_reasons": dict(stats.mask_reasons)}))
    return code
