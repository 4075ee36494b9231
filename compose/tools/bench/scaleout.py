"""Scale-out on one machine: per-worker throughput, and the checks that scaling changed no record.

Runs one workload (``--rollouts`` multi-call tool-using rollouts of the OpenAI SDK harness on the
reference engine, ``--concurrency`` at a time) twice, on topics of its own each time: on one worker
(1 interceptor, 1 fold worker, 1 consumer, the default partitions) and on the scaled topology
(``--partitions``, ``--interceptors``, ``--processors`` fold workers in one app id, a consumer group
of ``--consumers`` and ``--groups`` - 1 independent one-member groups), with, unless ``--no-chaos``,
a fold worker killed with -9 and replaced, a consumer added, one stopped and one killed with -9 and
replaced while rollouts are in flight (``compose.rig.scaleout``). Prints, per run, the window (first rollout start to last delivery),
and per worker: calls captured per interceptor (its ``/metrics``), events folded per fold worker
(its log), records written per consumer (its JSONL file), each also per second of the window. Then
the checks of ``compose.rig.scaleout_checks``: each group delivered each rollout once (repeats after a
rebalance counted, and identical), the records equal an offline replay of the run's event log byte
for byte, and equal the one-worker run's records (call ids canonical). Exit 1 if a check failed.

On two shared cores every process competes for the same CPUs: the rates show how the work was
split, not how a machine per worker would scale.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from schemas.kafka.security import add_kafka_config_option


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tool-calls", type=int, default=4, help="rollout i makes 1 + i %% this tool calls")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--interceptors", type=int, default=2)
    parser.add_argument("--processors", type=int, default=3, help="fold workers in one app id")
    parser.add_argument("--consumers", type=int, default=3, help="members of the first consumer group")
    parser.add_argument("--groups", type=int, default=2, help="consumer groups (each after the first: one member)")
    parser.add_argument("--no-chaos", action="store_true", help="no worker killed, no consumer added or stopped")
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    add_kafka_config_option(parser, note="with --bootstrap only: the broker this tool starts itself is PLAINTEXT")


def main(args: argparse.Namespace) -> int:
    from compose.rig.kafka.broker import ensure_jars, start_broker, stop_broker
    from compose.rig.scaleout import ONE_WORKER, Chaos, ScaleRun, Topology, Workload, print_figures
    from compose.rig.scaleout_checks import check, one_record_each
    from compose.rig.stack import kafka_configs_of_args

    kafka_configs = kafka_configs_of_args(args)  # checked before anything starts

    work = Workload(rollouts=args.rollouts, concurrency=args.concurrency, max_tool_calls=args.max_tool_calls)
    scaled = Topology(partitions=args.partitions, interceptors=args.interceptors, processors=args.processors,
                      consumers=args.consumers, groups=args.groups)
    chaos = Chaos.none() if args.no_chaos else Chaos()
    run_dir = Path(tempfile.mkdtemp(prefix="tokentrail-bench-scaleout-"))
    broker_dir, bootstrap = None, args.bootstrap
    if bootstrap is None:
        ensure_jars()
        broker_dir = run_dir / "kafka"
        bootstrap = start_broker(broker_dir).bootstrap
    try:
        runs: dict[str, ScaleRun] = {}
        for label, topology, faults in (("one worker", ONE_WORKER, Chaos.none()), ("scaled", scaled, chaos)):
            run = ScaleRun(bootstrap, run_dir / label.replace(" ", "-"), topology, name=f"bso{len(runs)}",
                           kafka_configs=kafka_configs)
            try:
                started = time.monotonic()
                run.start()
                up = time.monotonic() - started
                outcomes = asyncio.run(run.drive(work, faults))
                failed = [rid for rid, o in outcomes.items() if o.error]
                run.wait_delivered(work.rollout_ids(), timeout=max(150.0, 2.0 * args.rollouts))
                run.settle()
                run.stop()
            finally:
                run.stack.stop()
            print(f"({label}: services up in {up:.1f} s; {len(failed)} rollouts ended in an error)")
            print_figures(label, run)
            runs[label] = run
        verdict = check(runs["scaled"], work.rollout_ids(), one_record_each(runs["one worker"]))
        print("== checks")
        for line in verdict.summary:
            print(f"   {line}")
        for problem in verdict.problems:
            print(f"   FAILED: {problem}")
        print(f"(logs and records under {run_dir})")
        return 0 if verdict.ok else 1
    finally:
        if broker_dir is not None:
            stop_broker(broker_dir)
