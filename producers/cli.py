"""``tokentrail intercept``: run the capture interceptor in front of a model server.

Secrets come from the environment (or a file), never from flags: ``TOKENTRAIL_CONTROL_TOKEN``
(control routes), ``TOKENTRAIL_UPSTREAM_API_KEY`` (sent to the engine as Bearer, e.g. vLLM
--api-key) and ``TOKENTRAIL_ROLLOUT_SECRET`` or ``--rollout-secret-file`` (rollout tokens).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from collections.abc import Mapping

from pydantic import ValidationError

from schemas.kafka.security import add_kafka_config_option


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--upstream", required=True, help="OpenAI-compatible model server URL")
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers host:port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--topic-prefix", default="", help="prefix of every topic name (isolation)")
    add_kafka_config_option(parser)
    parser.add_argument("--upstream-model",
                        help="model name always sent to the engine (default: the harness's name when the engine "
                             "serves it, else the engine's served model, learnt from GET /v1/models)")
    parser.add_argument("--spool-dir", help="fsynced local spool used while Kafka is down (one per process)")
    parser.add_argument("--prefix-supply", action="store_true",
                        help="send the verified parent's exact ids as kv_transfer_params.prompt_token_ids "
                             "(checked at startup: the engine must render chat requests and honour them)")
    parser.add_argument("--abort-policy", choices=("mask", "continue"), default="mask",
                        help="a generation the engine aborts for a weight update: mask (record it aborted, the "
                             "harness retries) or continue (resubmit prompt + partial generation as prompt ids "
                             "and answer once, token-exact)")
    parser.add_argument("--no-follow-versions", action="store_true",
                        help="do not follow the policy-versions topic (versions then come only from the engine "
                             "and POST /tokentrail/admin/policy-version)")
    parser.add_argument("--logprobs-mode", default="raw_logprobs",
                        help="what the engine's logprobs mean, as vLLM was started (--logprobs-mode): "
                             "raw_logprobs (default) or processed_logprobs; recorded on every call")
    parser.add_argument("--publish-timeout-ms", type=int, default=5000,
                        help="wait this long for Kafka's ack before spooling (or failing without a spool)")
    parser.add_argument("--engine-timeout-s", type=float, default=1800.0,
                        help="longest an engine call may take, streaming or not (default 1800); then the harness "
                             "gets a 504 or an error event and the call records CallIncomplete(engine_timeout)")
    parser.add_argument("--stream-idle-timeout-s", type=float, default=300.0,
                        help="longest silence of an engine stream, before its first chunk and between two "
                             "(default 300: a long prefill on a busy engine)")
    parser.add_argument("--no-delta-records", action="store_true", help="always store full prompts")
    parser.add_argument("--sampling", default="{}", help='sampling pin, JSON, e.g. \'{"temperature": 1.0}\'')
    parser.add_argument("--rollout-secret-file",
                        help="file holding the rollout secret (else env TOKENTRAIL_ROLLOUT_SECRET): with one, each "
                             "request under /ng-rollout/<id>/ needs that rollout's token as its API key "
                             "(`tokentrail token <id>`)")
    parser.add_argument("--max-body-bytes", type=int, default=16 * 1024 * 1024,
                        help="largest request body accepted; larger is a 413 (default 16 MiB)")
    parser.add_argument("--index-max-rollouts", type=int, default=65_536,
                        help="rollouts the lineage index keeps (the oldest evicted first; default 65,536)")
    parser.add_argument("--finished-max-rollouts", type=int, default=65_536,
                        help="finished rollouts remembered to refuse their later calls (default 65,536, ~230 B each)")
    parser.add_argument("--forward-unknown-routes", action="store_true",
                        help="forward routes the route table does not list, on bare paths only (a trusted engine)")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--log-format", choices=["json", "text"], default="json")


def rollout_secret_from(env: Mapping[str, str], path: str | None) -> str | None:
    """The rollout secret: the file's content (one trailing newline dropped), else TOKENTRAIL_ROLLOUT_SECRET."""
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read().removesuffix("\n").removesuffix("\r") or None
        except OSError as exc:
            raise ValueError(f"--rollout-secret-file {path!r} cannot be read: {exc.strerror}") from None
    return env.get("TOKENTRAIL_ROLLOUT_SECRET") or None


def main(args: argparse.Namespace) -> int:
    from producers.settings import InterceptorSettings
    from schemas.kafka.topics import topic_names

    try:
        settings = InterceptorSettings(
            upstream_url=args.upstream,
            bootstrap=args.bootstrap,
            kafka=args.kafka_config,
            host=args.host,
            port=args.port,
            sampling_overrides=json.loads(args.sampling),
            control_token=os.environ.get("TOKENTRAIL_CONTROL_TOKEN") or None,
            upstream_api_key=os.environ.get("TOKENTRAIL_UPSTREAM_API_KEY") or None,
            logprobs_mode=args.logprobs_mode,
            topics=topic_names(args.topic_prefix),
            upstream_model=args.upstream_model,
            spool_dir=args.spool_dir,
            prefix_supply=args.prefix_supply,
            abort_policy=args.abort_policy,
            follow_versions=not args.no_follow_versions,
            delta_records=not args.no_delta_records,
            publish_timeout_ms=args.publish_timeout_ms,
            engine_timeout_s=args.engine_timeout_s,
            stream_idle_timeout_s=args.stream_idle_timeout_s,
            rollout_secret=rollout_secret_from(os.environ, args.rollout_secret_file),
            max_body_bytes=args.max_body_bytes,
            forward_unknown_routes=args.forward_unknown_routes,
            index_max_rollouts=args.index_max_rollouts,
            finished_max_rollouts=args.finished_max_rollouts,
        )
    except (ValidationError, ValueError) as exc:
        print(f"tokentrail intercept: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    import uvicorn

    from producers.http.app import Interceptor
    from producers.logs import configure_logging

    configure_logging(args.log_level, args.log_format)
    # A captured call allocates tens of thousands of short-lived objects (token ids, logprob
    # entries); with CPython's default thresholds that triggers full collections that scan
    # every module object, which showed up as ~15 ms p99 spikes. Freeze what startup loaded
    # and collect the young generation less often (measured: p99 15.7 -> 4.0 ms in process).
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)

    # uvloop and httptools, named rather than left to uvicorn's "auto": a missing install fails at
    # start instead of silently costing ~1 ms of CPU per call (docs/perf/interceptor.md).
    uvicorn.run(Interceptor(settings), host=settings.host, port=settings.port, log_level=args.log_level,
                lifespan="on", access_log=False, log_config=None, loop="uvloop", http="httptools")
    return 0
