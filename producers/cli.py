"""``tokentrail intercept``: run the capture interceptor in front of a model server."""

from __future__ import annotations

import argparse
import json
import os
import sys

from pydantic import ValidationError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--upstream", required=True, help="OpenAI-compatible model server URL")
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers host:port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--topic-prefix", default="", help="prefix of every topic name (isolation)")
    parser.add_argument("--sampling", default="{}", help='sampling pin, JSON, e.g. \'{"temperature": 1.0}\'')
    parser.add_argument("--log-level", default="warning")


def main(args: argparse.Namespace) -> int:
    from producers.settings import InterceptorSettings
    from schemas.topics import topic_names

    try:
        settings = InterceptorSettings(
            upstream_url=args.upstream,
            bootstrap=args.bootstrap,
            host=args.host,
            port=args.port,
            sampling_overrides=json.loads(args.sampling),
            control_token=os.environ.get("TOKENTRAIL_CONTROL_TOKEN") or None,
            topics=topic_names(args.topic_prefix),
        )
    except (ValidationError, ValueError) as exc:
        print(f"tokentrail intercept: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    import uvicorn

    from producers.app import Interceptor

    uvicorn.run(Interceptor(settings), host=settings.host, port=settings.port, log_level=args.log_level,
                lifespan="on", access_log=False)
    return 0
