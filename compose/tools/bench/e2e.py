"""Finish → delivered end to end, its per-stage breakdown and CPU per call (budget: p95 ≤ 250 ms at 1 in flight, ≤ 500 ms at 32).

Runs the whole pipeline as separate processes (``compose.rig.stack.LocalStack``:
the reference policy server, the interceptor, one processor worker and one
consumer with the JSONL sink) on a real broker (``--bootstrap``, else a jar
broker it starts). At each ``--concurrency`` level, that many closed-loop
clients run multi-turn tool-using rollouts (the OpenAI SDK harness of
``compose.harnesses.sdk``) through the interceptor and finish each; it prints
rollouts/s and calls/s over the level's window (first rollout started → last
delivered), finish → delivered percentiles, where that time goes, and the CPU
seconds per call of each of our processes.

- finish: the moment the benchmark sends the finish POST;
- delivered: the moment the consumer's JSONL sink returned from ``deliver``
  (the line is written and fsynced), marked by the consumer itself;
- the breakdown: the stage marks of ``schemas.stage_log`` (``TOKENTRAIL_STAGE_LOG``,
  set for every service of the stack): the finish event's and the snapshot's
  Kafka timestamps, the processor's fetch, fold, send and the acks of its
  changelog and snapshot (futures' callbacks), the consumer's poll, rebuild,
  delivery, retire ack and commit. Each stage is the time between two marks;
  the stages on the path telescope to finish → delivered, the side stages
  (changelog ack, retire, commit) run beside or after it;
- CPU: utime + stime of each service's process from ``/proc/<pid>/stat`` at the
  level's start and end, over the calls the level made.

Every rollout is checked to arrive once in the sink, unmasked.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from compose.tools.bench._measure import cpu_seconds, machine_busy, percentile
from compose.tools.bench.budgets import budget_line, figure_line
from schemas.kafka.security import add_kafka_config_option

BUDGET_P95_S = {1: 0.250, 32: 0.500}
SERVICES = ("interceptor", "processor", "consumer", "policy")

# (name, from mark, to mark, on the finish → delivered path)
STAGE_SPANS: tuple[tuple[str, str, str, bool], ...] = (
    ("finish produce", "finish.sent", "finish.record", True),
    ("processor fetch", "finish.record", "proc.fetched", True),
    ("fold", "proc.fetched", "proc.folded", True),
    ("changelog + snapshot send", "proc.folded", "proc.sent", True),
    ("snapshot produce (ack)", "proc.sent", "proc.snapshot_acked", True),
    ("consumer fetch", "proc.snapshot_acked", "cons.polled", True),
    ("rebuild", "cons.polled", "cons.rebuilt", True),
    ("sink (write + fsync)", "cons.rebuilt", "cons.delivered", True),
    ("finish POST answered", "finish.sent", "finish.answered", False),
    ("changelog ack", "proc.sent", "proc.changelog_acked", False),
    ("retire (after delivery)", "cons.delivered", "cons.retired", False),
    ("commit (after retire)", "cons.retired", "cons.committed", False),
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32], help="rollouts in flight, per level")
    parser.add_argument("--rollouts", type=int, default=None,
                        help="rollouts per level (default: 40, or 3 per client when that is more)")
    parser.add_argument("--tool-calls", type=int, default=2, help="tool calls per rollout (calls = tool calls + 1)")
    parser.add_argument("--decode-ms-per-token", type=float, default=0.0,
                        help="the reference engine's emulated decode time per token")
    parser.add_argument("--warmup", type=int, default=8, help="rollouts before measuring (group joins, JIT)")
    parser.add_argument("--bootstrap", help="broker to use (default: start a jar broker)")
    add_kafka_config_option(parser, note="with --bootstrap only: the broker this tool starts itself is PLAINTEXT")


@dataclass
class Level:
    concurrency: int
    rollouts: int
    calls: int
    seconds: float
    latencies: list[float]
    stages: dict[str, tuple[float, float, int]]  # name → (p50 s, p95 s, rollouts measured)
    cpu_per_call: dict[str, float]
    masked: int
    busy: float  # the machine's CPUs busy over the level (every process on it), 0..1


def read_cpu(pids: Mapping[str, int]) -> dict[str, float]:
    ticks = os.sysconf("SC_CLK_TCK")
    return {name: cpu_seconds(Path(f"/proc/{pid}/stat").read_text(), ticks) for name, pid in pids.items()}


def cpu_per_call(before: Mapping[str, float], after: Mapping[str, float], calls: int) -> dict[str, float]:
    return {name: (after[name] - before[name]) / max(calls, 1) for name in before}


def stage_breakdown(marks: Mapping[str, Mapping[str, float]],
                    rollouts: list[str]) -> dict[str, tuple[float, float, int]]:
    """Per stage of `STAGE_SPANS`: (p50, p95, how many rollouts had both marks), over ``rollouts``."""
    out = {}
    for name, start, end, _ in STAGE_SPANS:
        spans = [marks[r][end] - marks[r][start] for r in rollouts
                 if r in marks and start in marks[r] and end in marks[r]]
        out[name] = (percentile(spans, 50), percentile(spans, 95), len(spans)) if spans else (float("nan"),) * 2 + (0,)
    return out


def finish_to_delivered(marks: Mapping[str, Mapping[str, float]], rollouts: list[str]) -> list[float]:
    return [marks[r]["cons.delivered"] - marks[r]["finish.sent"] for r in rollouts]


async def _run_level(stack, stage_log, concurrency: int, n: int, tool_calls: int, tag: str) -> tuple[list[str], int]:
    """Run ``n`` rollouts, ``concurrency`` at a time, finish each; wait for all deliveries. (ids, calls)."""
    import httpx

    from compose.harnesses.sdk import run_rollout

    ids = [f"e2e-{tag}-{i:04d}" for i in range(n)]
    todo, calls = iter(ids), [0]
    headers = {"authorization": f"Bearer {stack.control_token}"}

    def finish(http: httpx.Client, rid: str, body: dict) -> None:
        # In a thread, with a blocking client: the harness clients keep this process's event loop busy,
        # and a POST queued behind them would be sent late, after its "sent" mark.
        stage_log.mark(rid, "finish.sent")
        r = http.post(f"{stack.interceptor_url}/rollouts/{rid}/finish", json=body, headers=headers)
        stage_log.mark(rid, "finish.answered")
        r.raise_for_status()

    # A new connection per finish: a kept-alive one may have been closed by the server's idle timeout meanwhile.
    with httpx.Client(timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as http, \
            ThreadPoolExecutor(concurrency) as pool:
        async def client() -> None:
            for rid in todo:
                outcome = await run_rollout(stack.capture_base_url(rid), rid, f"weather in city {rid}?",
                                            tool_calls=tool_calls, api_key=stack.api_key(rid))
                if outcome.error:
                    raise RuntimeError(f"rollout {rid}: {outcome.error}")
                calls[0] += outcome.calls
                body = {"result": {"reward": 1.0}, "final_response_id": outcome.final_response_id,
                        "final_text": outcome.final_text}
                await asyncio.get_running_loop().run_in_executor(pool, finish, http, rid, body)

        await asyncio.gather(*(client() for _ in range(concurrency)))
    await _wait_delivered(stack, stage_log.path, ids)
    return ids, calls[0]


async def _wait_delivered(stack, path: Path, ids: list[str], timeout: float = 300.0) -> None:
    from schemas.stage_log import read_stage_log

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        marks = read_stage_log(path.read_text().splitlines())
        if all("cons.delivered" in marks.get(r, {}) for r in ids):
            return
        stack.check_alive()
        await asyncio.sleep(0.02)
    raise RuntimeError(f"{sum('cons.delivered' not in marks.get(r, {}) for r in ids)} rollouts not delivered "
                       f"within {timeout:.0f} s; logs under {stack.run_dir}")


def _level(stack, stage_log, concurrency: int, n: int, tool_calls: int) -> Level:
    from schemas.stage_log import read_stage_log

    pids = {**{name: stack.services[name].proc.pid for name in SERVICES}, "harness": os.getpid()}
    tag = uuid.uuid4().hex[:6]
    before, machine, start = read_cpu(pids), machine_busy(Path("/proc/stat").read_text()), time.time()
    ids, calls = asyncio.run(_run_level(stack, stage_log, concurrency, n, tool_calls, tag))
    after, machine_after = read_cpu(pids), machine_busy(Path("/proc/stat").read_text())
    busy = (machine_after[0] - machine[0]) / max(machine_after[1] - machine[1], 1)
    marks = read_stage_log(stage_log.path.read_text().splitlines())
    seconds = max(marks[r]["cons.delivered"] for r in ids) - start
    delivered = stack.delivered()
    mine = [d for d in delivered if d["rollout_id"] in set(ids)]
    if sorted(d["rollout_id"] for d in mine) != sorted(ids):
        raise RuntimeError(f"the sink holds {len(mine)} records for {len(ids)} rollouts: not each exactly once")
    return Level(concurrency, n, calls, seconds, finish_to_delivered(marks, ids), stage_breakdown(marks, ids),
                 cpu_per_call(before, after, calls), sum(d["mask_sample"] for d in mine), busy)


def main(args: argparse.Namespace) -> int:
    from compose.rig.stack import LocalStack, kafka_configs_of_args
    from schemas.stage_log import ENV, StageLog

    kafka_configs = kafka_configs_of_args(args)  # checked before anything starts

    run_dir = Path(tempfile.mkdtemp(prefix="tokentrail-bench-e2e-"))
    broker_dir, bootstrap = None, args.bootstrap
    stage_path = run_dir / "stages.jsonl"
    os.environ[ENV] = str(stage_path)  # every service of the stack inherits it
    stage_log = StageLog(stage_path)
    try:
        if bootstrap is None:
            from compose.rig.kafka.broker import start_broker

            broker_dir = run_dir / "kafka"
            bootstrap = start_broker(broker_dir).bootstrap
        tag = uuid.uuid4().hex[:8]
        policy_args = ("--decode-ms-per-token", str(args.decode_ms_per_token))
        with LocalStack(bootstrap, run_dir / "stack", topic_prefix=f"benche2e{tag}.", processor_id=f"benche2e-{tag}",
                        policy_args=policy_args, kafka_configs=kafka_configs) as stack:
            if args.warmup:
                _level(stack, stage_log, min(4, args.warmup), args.warmup, args.tool_calls)
            levels = [_level(stack, stage_log, c, args.rollouts or max(40, 3 * c), args.tool_calls)
                      for c in args.concurrency]
    finally:
        os.environ.pop(ENV, None)
        if broker_dir is not None:
            from compose.rig.kafka.broker import stop_broker

            stop_broker(broker_dir)
    print(f"end to end: reference engine (decode {args.decode_ms_per_token} ms/token), {args.tool_calls + 1} calls "
          f"per rollout, JSONL sink (fsync), broker {bootstrap}")
    for level in levels:
        _report(level)
    shutil.rmtree(run_dir, ignore_errors=True)  # kept, with the services' logs, when the run failed
    return 0


def _report(level: Level) -> None:
    ms = lambda s: f"{s * 1000:7.1f} ms"  # noqa: E731
    lat = level.latencies
    p95 = percentile(lat, 95)
    budget = BUDGET_P95_S.get(level.concurrency)
    verdict = f"= {p95 / budget:.2f}x the budget (p95 <= {budget * 1000:.0f} ms)" if budget else "(no budget)"
    print(f"== {level.concurrency} in flight: {level.rollouts} rollouts, {level.calls} calls in {level.seconds:.1f} s, "
          f"{level.masked} masked")
    print(f"  rollouts/s {level.rollouts / level.seconds:8.2f}     calls/s {level.calls / level.seconds:8.2f}")
    print(f"  finish -> delivered  p50 {ms(percentile(lat, 50))}  p95 {ms(p95)}  p99 {ms(percentile(lat, 99))}  "
          f"{verdict}")
    print("  breakdown                      p50         p95")
    for name, _start, _end, on_path in STAGE_SPANS:
        p50, p95_, n = level.stages[name]
        side = "" if on_path else "  (beside / after the path)"
        missing = "" if n == level.rollouts else f"  ({n} of {level.rollouts} rollouts marked)"
        print(f"    {name:<26} {ms(p50)}  {ms(p95_)}{side}{missing}")
    cpu = "  ".join(f"{name} {level.cpu_per_call[name] * 1000:.2f}" for name in SERVICES)
    print(f"  CPU ms per call   {cpu}   (the load's own harness {level.cpu_per_call['harness'] * 1000:.2f}; "
          f"machine {level.busy:.0%} busy of {os.cpu_count()} CPUs)")
    if budget:  # one line of `make bench`'s table (compose.tools.bench.budgets)
        print(budget_line(f"e2e.c{level.concurrency}.finish_to_delivered_p95_ms", p95 * 1000, budget * 1000))
    for name in SERVICES:
        print(figure_line(f"e2e.c{level.concurrency}.{name}_cpu_ms_per_call", level.cpu_per_call[name] * 1000))
