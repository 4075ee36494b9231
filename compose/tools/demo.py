"""``tokentrail demo``: the whole pipeline on this machine, in about half a minute.

Brings up a Kafka broker (Apache Kafka jars from Maven Central), the reference
policy server, the interceptor, the Faust processor and the rebuild consumer;
runs multi-turn, tool-using rollouts through the interceptor with the OpenAI
Python SDK, one of them broken by an upstream error mid-rollout; finishes them;
prints the rebuilt rollouts; tears everything down.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path

from compose.rig.stack import DEMO_DIR, LAST_RUN
from schemas.kafka.security import KafkaConfigError, add_kafka_config_option


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rollouts", type=int, default=4, help="clean rollouts to run (plus one broken)")
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    add_kafka_config_option(parser, note="with --bootstrap only: the broker this demo starts itself is PLAINTEXT")
    parser.add_argument("--keep", action="store_true", help="leave the stack's logs and output in place")


def main(args: argparse.Namespace) -> int:
    from compose.rig.kafka.broker import BrokerError, fresh_broker, stop_broker
    from compose.rig.stack import LocalStack, StackError, kafka_configs_of_args

    try:
        kafka_configs = kafka_configs_of_args(args)  # checked before anything starts
    except KafkaConfigError as exc:
        print(f"tokentrail demo: {exc}")
        return 2
    run_dir = Path(tempfile.mkdtemp(prefix="tokentrail-demo-"))
    tag = time.strftime("%H%M%S")
    started_broker = None
    try:
        bootstrap = args.bootstrap
        if bootstrap is None:
            started_broker = (DEMO_DIR / "kafka").resolve()
            bootstrap = fresh_broker(started_broker).bootstrap  # a fresh log for every demo
        with LocalStack(bootstrap, run_dir, topic_prefix=f"demo{tag}.", processor_id=f"demo{tag}",
                        kafka_configs=kafka_configs) as stack:
            print(f"policy    {stack.policy_url}")
            print(f"intercept {stack.interceptor_url}")
            print("processor + consumer up; running rollouts...\n")
            ids = asyncio.run(_run_rollouts(stack, args.rollouts, tag))
            records = stack.wait_rollouts(ids, timeout=120)
            _print_table([records[i] for i in ids])
            masked = [i for i in ids if records[i]["mask_sample"]]
            if started_broker is not None:
                LAST_RUN.write_text(json.dumps({"kafka_dir": str(started_broker), "topic_prefix": stack.topic_prefix,
                                                "rollouts": ids, "masked": masked}))
                print("\nwhy were rollouts masked? run: make why   (tokentrail replay --last-demo)")
            print(f"\nrebuilt rollouts: {stack.rollouts_path}" if args.keep else "")
    except (BrokerError, StackError) as exc:
        print(f"tokentrail demo: {exc}")
        return 1
    finally:
        if started_broker is not None:
            stop_broker(started_broker, keep_data=True)
        if not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    return 0


async def _run_rollouts(stack, n: int, tag: str) -> list[str]:
    from compose.harnesses.sdk import failing_tool, run_rollout

    cities = ["Paris", "Oslo", "Lagos", "Lima", "Hanoi", "Quito", "Perth", "Cairo"]
    jobs = [
        run_rollout(stack.capture_base_url(f"demo{tag}-{i}"), f"demo{tag}-{i}",
                    f"What is the weather in {cities[i % len(cities)]}?", tool_calls=1 + i % 3)
        for i in range(n)
    ]
    broken = f"demo{tag}-broken"
    jobs.append(run_rollout(stack.capture_base_url(broken), broken, "What is the weather in Rome?",
                            tool_impl=failing_tool(1), tool_calls=3))
    outcomes = await asyncio.gather(*jobs)
    for o in outcomes:
        result = {"reward": 0.0 if o.error else 1.0, **({"error": o.error} if o.error else {})}
        stack.finish(o.rollout_id, result, final_response_id=o.final_response_id, final_text=o.final_text)
    return [o.rollout_id for o in outcomes]


def _print_table(records: list[dict]) -> None:
    header = f"{'rollout':<22} {'calls':>5} {'chains':>6}  {'mask_sample':<11}  reasons"
    print(header)
    print("-" * len(header) + "-" * 30)
    for rec in records:
        m = rec["_ng_token_capture"]
        reasons = "; ".join(f"{r['code']}: {r['detail']}" if r["detail"] else r["code"] for r in rec["mask_reasons"])
        print(f"{rec['rollout_id']:<22} {m['n_calls']:>5} {m['chains']:>6}  {str(rec['mask_sample']).lower():<11}  "
              f"{reasons or '-'}")
