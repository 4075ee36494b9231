"""``tokentrail consume``: rebuild finished rollouts and deliver them to a sink."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys

from pydantic import ValidationError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers host:port")
    parser.add_argument("--group-id", default="tokentrail-consumer")
    parser.add_argument("--sink", default="jsonl", help="'jsonl' or module:Class of a TrainerSink")
    parser.add_argument("--sink-path", help="JSONL file (for --sink jsonl)")
    parser.add_argument("--sink-kwargs", default="{}", help="JSON object of keyword arguments for the sink")
    parser.add_argument("--no-response", action="store_true", help="skip the Responses projection")
    parser.add_argument("--max-rollouts", type=int, help="stop after delivering this many rollouts")
    parser.add_argument("--topic-prefix", default="", help="prefix of every topic name (isolation)")
    parser.add_argument("--log-level", default="WARNING")


def main(args: argparse.Namespace) -> int:
    from consumers.settings import ConsumerSettings
    from schemas.topics import topic_names
    from schemas.errors import ConfigError

    try:
        kwargs = json.loads(args.sink_kwargs)
        if args.sink_path:
            kwargs["path"] = args.sink_path
        settings = ConsumerSettings(bootstrap=args.bootstrap, group_id=args.group_id, sink=args.sink,
                                    sink_kwargs=kwargs, project_response=not args.no_response,
                                    topics=topic_names(args.topic_prefix))
    except (ValidationError, ValueError) as exc:
        print(f"tokentrail consume: invalid settings: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    from consumers.loop import RebuildConsumer
    from consumers.sinks import load_sink

    try:
        sink = load_sink(settings.sink, settings.sink_kwargs)
    except ConfigError as exc:
        print(f"tokentrail consume: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_run(settings, sink, args.max_rollouts))


async def _run(settings, sink, max_rollouts) -> int:
    from consumers.loop import RebuildConsumer

    consumer = RebuildConsumer(settings, sink)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        stats = await consumer.run(stop=stop, max_rollouts=max_rollouts)
    finally:
        await consumer.close()
    print(json.dumps({"delivered": stats.delivered, "masked": stats.masked, "mask_reasons": stats.mask_reasons}))
    return 0
