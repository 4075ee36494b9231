"""``tokentrail finish``: publish RolloutFinished for a rollout (the freeze request).

Exit 0 and the event id once the finish is durable in Kafka. It writes to the topic directly, so it
cannot know whether the rollout was finished before: the processor applies a rollout's first finish
and dead-letters a later one with another payload (``conflicting_finish``, naming both; one record
per attempt). For a synchronous answer (409 on a conflict) finish through the interceptor's finish
route (``POST /rollouts/<rollout id>/finish``, bearer token) instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from schemas.kafka.security import add_kafka_config_option


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers host:port")
    parser.description = ("Publish a rollout's finish to Kafka (exit 0: durable). A second finish with another "
                          "payload is refused by the processor (dead letter conflicting_finish), not here; the "
                          "interceptor's finish route answers 409 for it instead.")
    parser.add_argument("--rollout", required=True, help="rollout id")
    parser.add_argument("--result", default="{}", help="rollout result as JSON (reward, verifier output, ...)")
    parser.add_argument("--final-response-id", help="response id of the harness's final answer")
    parser.add_argument("--final-text", help="the harness's final answer text")
    parser.add_argument("--attempt", type=int, default=0, help="retry number of the rollout, 0..2147483647")
    parser.add_argument("--topic-prefix", default="", help="prefix of every topic name (isolation)")
    add_kafka_config_option(parser)


def main(args: argparse.Namespace) -> int:
    from producers.finish import finish_rollout
    from schemas.errors import TokentrailError
    from schemas.kafka.security import security_of_args
    from schemas.kafka.topics import topic_names

    try:
        try:
            result = json.loads(args.result)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"--result is not valid JSON ({exc}): pass e.g. --result '{{\"reward\": 1}}'") from exc
        event_id = asyncio.run(finish_rollout(args.bootstrap, args.rollout, result,
                                              final_response_id=args.final_response_id,
                                              final_text=args.final_text, attempt=args.attempt,
                                              topic=topic_names(args.topic_prefix).rollout_events,
                                              security=security_of_args(args)))
    except (ValueError, TokentrailError) as exc:
        print(f"tokentrail finish: {exc}", file=sys.stderr)
        return 2
    print(event_id)
    return 0
