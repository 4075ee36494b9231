"""``tokentrail collect``: tasks in, verified and rewarded training rollouts out.

Runs a harness (Claude Code, Codex, the OpenAI or Anthropic SDK loop, or a remote agent
service) on every task ``--samples`` times through the capture interceptor, verifies each
final answer, finishes the rollout with its reward, waits for its rebuilt record, and
writes one row per rollout to ``--out`` (failures also to ``<out>.failures.jsonl``). Re-run
the same command to resume a run that was stopped or killed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from compose.collect.settings import HARNESSES
from schemas.kafka.security import add_kafka_config_option

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from compose.collect.local import StackAddress


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n\n", 1)[1].replace("\n", " ")
    g = parser.add_argument_group("the run")
    g.add_argument("--tasks", required=True, type=Path, help="JSONL task file (id, prompt, answer; or NeMo Gym rows)")
    g.add_argument("--harness", required=True, choices=HARNESSES, help="what runs each rollout")
    g.add_argument("--out", required=True, type=Path, help="results JSONL (journal, failures, trajectories beside it)")
    g.add_argument("--samples", type=int, default=1, help="rollouts per task, one GRPO group per task (default 1)")
    g.add_argument("--concurrency", type=int, default=4, help="rollouts at once (default 4)")
    g.add_argument("--limit", type=int, help="only the first N tasks")
    g.add_argument("--max-attempts", type=int, default=3,
                   help="attempts per rollout over all re-runs; terminal failures are never retried (default 3)")
    g.add_argument("--run-id", help="the run's id, the prefix of its rollout ids (default: minted, then kept "
                   "in the journal)")
    g = parser.add_argument_group("the stack")
    g.add_argument("--local", action="store_true", help="bring a local stack up for the run (broker unless "
                   "--bootstrap, engine, interceptor, processor, consumer)")
    g.add_argument("--engine", choices=("reference", "vllm"), default="reference",
                   help="--local: the engine (the reference server, or real vLLM's CPU build from `make vllm`)")
    g.add_argument("--bootstrap", help="Kafka bootstrap servers host:port")
    # The collector's clients and every process --local starts connect with it (a secured --bootstrap).
    add_kafka_config_option(g)
    g.add_argument("--interceptor-url", help="the capture interceptor's base URL, http://host:port")
    g.add_argument("--topic-prefix", default="", help="prefix of every topic name")
    g.add_argument("--rollout-secret-file", type=Path, help="file holding the interceptor's rollout secret "
                   "(default: TOKENTRAIL_ROLLOUT_SECRET; without one, harnesses send no rollout token)")
    g.add_argument("--no-wait", dest="wait_records", action="store_false",
                   help="do not wait for rebuilt records (rows then carry no mask_sample or metrics)")
    g = parser.add_argument_group("the harness")
    g.add_argument("--model", help="the model name the harness asks for (default: the harness's own)")
    g.add_argument("--agent-url", help="--harness remote: base URL of the agent service (POST /v1/responses)")
    g.add_argument("--max-steps", type=int, default=16, help="remote: agent-service steps; SDK loops: model turns")
    g.add_argument("--max-turns", type=int, default=10, help="claude-code: --max-turns; gemini-cli: model calls "
                   "(model.maxSessionTurns) (default 10)")
    g.add_argument("--allowed-tools", action="append", help="claude-code: an --allowedTools rule, repeatable "
                   "(default: Bash)")
    g.add_argument("--system-prompt", help="openai-sdk / anthropic-sdk: the system message")
    g.add_argument("--call-timeout", type=float, default=300.0, help="seconds for one model call (default 300)")
    g.add_argument("--rollout-timeout", type=float, default=900.0, help="seconds for one attempt (default 900)")
    g.add_argument("--record-timeout", type=float, default=180.0,
                   help="seconds from finish to the rebuilt record (default 180)")
    g.add_argument("--keep-workdirs", action="store_true", help="keep each attempt's working directory")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def _settings(args: argparse.Namespace):
    from compose.collect.settings import CollectSettings

    secret = os.environ.get("TOKENTRAIL_ROLLOUT_SECRET") or None
    if args.rollout_secret_file is not None:
        secret = args.rollout_secret_file.read_text().strip()
    fields = {k: getattr(args, k) for k in (
        "tasks", "harness", "out", "samples", "concurrency", "limit", "max_attempts", "run_id", "local", "engine",
        "bootstrap", "interceptor_url", "topic_prefix", "wait_records", "model", "agent_url", "max_steps", "max_turns",
        "system_prompt", "keep_workdirs", "progress")}
    fields.update(rollout_secret=secret, kafka=args.kafka_config, call_timeout_s=args.call_timeout,
                  rollout_timeout_s=args.rollout_timeout, record_timeout_s=args.record_timeout)
    if args.allowed_tools:
        fields["allowed_tools"] = tuple(args.allowed_tools)
    return CollectSettings(**fields)


def main(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from schemas.errors import TokentrailError

    try:
        settings = _settings(args)
    except ValidationError as exc:
        print(f"tokentrail collect: invalid settings: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"tokentrail collect: --rollout-secret-file: {exc}", file=sys.stderr)
        return 2
    try:
        return _run(settings)
    except TokentrailError as exc:
        print(f"tokentrail collect: {exc}", file=sys.stderr)
        return 2


def _run(settings) -> int:
    from compose.collect.harnesses import make_harness
    from compose.collect.journal import Journal, RunHeader, now_ms
    from compose.collect.local import local_stack, remote_stack
    from compose.collect.run import Collector
    from compose.collect.tasks import load_tasks, tasks_digest
    from compose.collect.tools import check_task_tools
    from compose.collect.verify import check_verifiers

    # Everything that can be refused is checked before a process starts or a file is written.
    tasks = load_tasks(settings.tasks)
    # The run is its task file: --limit selects from it, so a re-run with a larger --limit extends the run.
    digest = tasks_digest(tasks)
    if settings.limit is not None:
        tasks = tasks[: settings.limit]
    verifiers = check_verifiers(tasks)
    for task in tasks:
        check_task_tools(task.tools, f"task {task.id!r} ({settings.tasks}:{task.line})")
    harness = make_harness(settings)
    settings.out.parent.mkdir(parents=True, exist_ok=True)
    fresh = RunHeader(run_id=settings.run_id or f"c{time.strftime('%m%d%H%M')}{secrets.token_hex(2)}",
                      harness=settings.harness, samples=settings.samples, tasks_digest=digest,
                      started_ms=now_ms())
    journal = Journal.open(settings.journal_path, fresh if settings.run_id or not settings.journal_path.exists()
                           else _keep_id(fresh, settings.journal_path))
    resumed = journal.header.started_ms != fresh.started_ms
    print(f"run {journal.header.run_id}: {len(tasks)} tasks x {settings.samples} samples, harness {settings.harness}"
          f"{' (resumed)' if resumed else ''}; results {settings.out}", flush=True)
    stack_cm: AbstractContextManager[StackAddress]
    if settings.local:
        stack_cm = local_stack(settings.out.with_name(settings.out.stem + ".local"), journal.header.run_id,
                               engine=settings.engine, harness=settings.harness, bootstrap=settings.bootstrap,
                               kafka=settings.kafka)
    else:
        import contextlib

        stack_cm = contextlib.nullcontext(remote_stack(settings.bootstrap, settings.interceptor_url,
                                                       settings.topic_prefix, settings.rollout_secret,
                                                       kafka=settings.kafka))
    with stack_cm as stack:
        collector = Collector(settings, tasks, verifiers, harness, stack, journal)
        summary = asyncio.run(collector.run())
    from compose.collect.summary import rollout_table

    rows = collector.results.rows.values()
    if len(rows) <= 64:  # a long run's per-rollout table is its results file
        print(rollout_table(rows))
    print(summary.table())
    print(summary.line(), flush=True)
    if collector.stopping:
        return 130
    return 0 if summary.rollouts == summary.expected else 1


def _keep_id(fresh, path):
    """``fresh`` with the journal's own run id: a re-run without --run-id resumes the run it finds."""
    import dataclasses
    import json

    first = path.read_text().split("\n", 1)[0]
    try:
        return dataclasses.replace(fresh, run_id=json.loads(first)["run_id"])
    except (ValueError, KeyError, TypeError):
        return fresh  # Journal.open refuses the file with the reason
