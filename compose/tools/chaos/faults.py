"""The faults of a chaos run, each injected while the workload runs, and the supervisor that restarts.

Every fault is a coroutine ``inject(ctx) -> str`` (a note for the table) run beside the
workload; it waits on the workload's live ``Progress`` so it lands under load:

- ``broker``: Kafka broker SIGKILLed once a third of the calls were answered, kept down
  ``broker_down_s`` (longer than the interceptor's publish timeout, so calls spool), then
  restarted on the same ports and log dir (``compose.rig.kafka.broker.restart_broker``).
- ``processor``: the Faust worker SIGKILLed ``processor_kills`` times, each once the previous
  restart is ready, the first after a sixth of the calls.
- ``consumer``: the consumer SIGKILLs itself right after a delivery returned, before its
  offset commit and RetireRequested (``compose.tools.chaos.killsink``), at ``consumer_kills`` chosen
  delivery counts of this phase.
- ``interceptor``: the broker is killed first so the interceptor spools; once its spool holds
  records and a stream is mid-flight, the interceptor is SIGKILLed, restarted on the same
  port and spool, and then the broker comes back: what the dead process acknowledged from its
  spool must reach Kafka from the new one.
- ``engine-stall``: once a third of the calls were answered and a stream is mid-flight, the
  engine freezes for ``engine_stall_s`` (vLLM's ``POST /pause?mode=keep``: generations in flight
  stop between tokens, new ones queue), then resumes: shorter than every timeout, so no call
  may fail and every record must equal the clean run's.
- ``engine-abort``: at the same point the engine aborts every generation in flight
  (``POST /pause?mode=abort``, vLLM's weight-sync pause) and resumes: each aborted call is
  CallIncomplete(aborted) and a 503 (a stream: an error event) to its harness, so its rollout
  is masked, or equal to the clean run's when the retry left nothing behind.

The ``Supervisor`` polls the stack's processes: it restarts every service that exits, counts
the exits a fault announced (``expect``) apart from the ones nobody announced (unplanned: a
service that crashed under the fault, reported in the table), and lets a fault await the
restart. Restarts run in a thread (``LocalStack.restart`` blocks until ready).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from compose.rig.kafka import broker as kafka_broker
from compose.rig.stack import LocalStack
from compose.tools.chaos.killsink import read_count, write_plan
from compose.tools.chaos.workload import ChaosError, Progress

__all__ = ["BROKER_KILLING", "FAULTS", "FAULT_LABELS", "VERSIONS_UNREADABLE", "FaultContext", "Supervisor"]

_POLL_S = 0.1
_READY_S = 240.0  # a restart on a loaded 2-core box: a broker took 60 s, Faust's recovery longer


class Supervisor:
    """Restarts what exits; tells planned exits (announced by a fault) from unplanned ones."""

    def __init__(self, stack: LocalStack) -> None:
        self.stack = stack
        self.planned: Counter[str] = Counter()  # announced exits still to come
        self.planned_exits: Counter[str] = Counter()
        self.unplanned: list[str] = []  # "processor exited 1"
        self._restarted: dict[str, asyncio.Event] = {}
        self._task: asyncio.Task | None = None
        self.paused: set[str] = set()  # services a fault restarts itself, later

    def expect(self, name: str, times: int = 1) -> None:
        self.planned[name] += times

    async def restarted(self, name: str, timeout: float = 2 * _READY_S) -> None:
        event = self._restarted.setdefault(name, asyncio.Event())
        await asyncio.wait_for(event.wait(), timeout)
        event.clear()

    async def __aenter__(self) -> Supervisor:
        self._task = asyncio.get_running_loop().create_task(self._watch())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    async def _watch(self) -> None:
        while True:
            for name, rc in self.stack.exited().items():
                if name in self.paused:
                    continue
                if self.planned[name] > 0:
                    self.planned[name] -= 1
                    self.planned_exits[name] += 1
                else:
                    self.unplanned.append(f"{name} exited {rc}")
                try:
                    await asyncio.to_thread(self.stack.restart, name, timeout=_READY_S)
                except Exception as exc:  # a service that cannot come back ends the run, with its log
                    raise ChaosError(f"{name} did not come back after exiting {rc}: {exc}") from exc
                self._restarted.setdefault(name, asyncio.Event()).set()
            await asyncio.sleep(_POLL_S)


@dataclass
class FaultContext:
    stack: LocalStack
    supervisor: Supervisor
    progress: Progress
    expected_calls: int  # answered calls of a clean run of this workload
    expected_rollouts: int
    broker_dir: Path
    sink_count_path: Path
    sink_plan_path: Path
    broker_down_s: float = 6.0
    engine_stall_s: float = 5.0
    processor_kills: int = 5
    consumer_kills: int = 3
    notes: list[str] = field(default_factory=list)

    async def calls_reach(self, fraction: float) -> None:
        while self.progress.acked < self.expected_calls * fraction and self.progress.done < self.expected_rollouts:
            await asyncio.sleep(_POLL_S / 2)


async def kill_broker(ctx: FaultContext) -> str:
    await ctx.calls_reach(1 / 3)
    await asyncio.to_thread(kafka_broker.kill_broker, ctx.broker_dir)
    at = ctx.progress.acked
    await asyncio.sleep(ctx.broker_down_s)
    await asyncio.to_thread(kafka_broker.restart_broker, ctx.broker_dir, ready_timeout=_READY_S)
    return f"broker down {ctx.broker_down_s:.0f} s from call {at}; {ctx.progress.acked - at} calls answered meanwhile"


async def kill_processor(ctx: FaultContext) -> str:
    at = []
    for k in range(ctx.processor_kills):
        await ctx.calls_reach((k + 1) / (ctx.processor_kills + 1))
        at.append(ctx.progress.acked)
        ctx.supervisor.expect("processor")
        await asyncio.to_thread(ctx.stack.kill, "processor")
        await ctx.supervisor.restarted("processor")
    return f"{ctx.processor_kills} kills at calls {at}"


async def kill_consumer(ctx: FaultContext) -> str:
    start = read_count(ctx.sink_count_path)
    step = max(1, ctx.expected_rollouts // (ctx.consumer_kills + 1))
    plan = [start + step * (k + 1) for k in range(ctx.consumer_kills)]
    ctx.supervisor.expect("consumer", len(plan))
    write_plan(ctx.sink_plan_path, plan)
    try:
        for _ in plan:
            await ctx.supervisor.restarted("consumer")
    finally:
        write_plan(ctx.sink_plan_path, [])
    return f"{len(plan)} kills after deliveries {[k - start for k in plan]} of this phase"


async def kill_interceptor(ctx: FaultContext) -> str:
    await ctx.calls_reach(1 / 4)
    await asyncio.to_thread(kafka_broker.kill_broker, ctx.broker_dir)
    async with httpx.AsyncClient(timeout=5) as client:
        spooled = 0
        while not (spooled > 0 and ctx.progress.streaming > 0):
            if ctx.progress.done >= ctx.expected_rollouts:
                raise ChaosError("the workload ended before the interceptor spooled a record with a stream in flight")
            try:
                spooled = (await client.get(f"{ctx.stack.interceptor_url}/healthz")).json()["spooled"]
            except (httpx.HTTPError, ValueError, KeyError):
                spooled = 0
            await asyncio.sleep(_POLL_S / 2)
    streaming = ctx.progress.streaming
    ctx.supervisor.expect("interceptor")
    await asyncio.to_thread(ctx.stack.kill, "interceptor")
    await ctx.supervisor.restarted("interceptor")
    await asyncio.to_thread(kafka_broker.restart_broker, ctx.broker_dir, ready_timeout=_READY_S)
    return f"killed with {spooled} spooled, {streaming} stream(s) mid-flight; broker down meanwhile"


ABORT_TRIES = 3


async def _mid_generation(ctx: FaultContext) -> tuple[int, int]:
    """Wait for a third of the calls and a stream past its first chunk; (calls answered, streams in flight)."""
    await ctx.calls_reach(1 / 3)
    while ctx.progress.streaming == 0 and ctx.progress.done < ctx.expected_rollouts:
        await asyncio.sleep(_POLL_S / 2)
    return ctx.progress.acked, ctx.progress.streaming


async def _pause_engine(ctx: FaultContext, mode: str, hold_s: float) -> None:
    async with httpx.AsyncClient(base_url=ctx.stack.policy_url, timeout=30) as engine:
        (await engine.post("/pause", params={"mode": mode})).raise_for_status()
        try:
            await asyncio.sleep(hold_s)
        finally:
            (await engine.post("/resume")).raise_for_status()


async def stall_engine(ctx: FaultContext) -> str:
    at, streaming = await _mid_generation(ctx)
    await _pause_engine(ctx, "keep", ctx.engine_stall_s)
    return f"engine frozen {ctx.engine_stall_s:.0f} s from call {at} with {streaming} stream(s) mid-flight"


async def abort_engine(ctx: FaultContext) -> str:
    # The stream seen mid-flight may end before the pause lands (on a loaded host it did: the short soak's one
    # abort then aborted nothing). An abort that failed no attempt did not happen: it is tried again at the
    # next stream, up to ABORT_TRIES times, while rollouts are left.
    tries = 0
    while True:
        tries, failed = tries + 1, ctx.progress.failed
        at, streaming = await _mid_generation(ctx)
        await _pause_engine(ctx, "abort", 0.5)
        if ctx.progress.failed > failed or ctx.progress.done >= ctx.expected_rollouts or tries == ABORT_TRIES:
            break
    return (f"engine aborted its generations at call {at} with {streaming} stream(s) mid-flight"
            + (f" (try {tries}: the earlier aborts found nothing in flight)" if tries > 1 else ""))


FAULTS: dict[str, Callable[[FaultContext], Awaitable[str]]] = {
    "broker": kill_broker,
    "processor": kill_processor,
    "consumer": kill_consumer,
    "interceptor": kill_interceptor,
    "engine-stall": stall_engine,
    "engine-abort": abort_engine,
}

BROKER_KILLING = ("broker", "interceptor")  # faults that kill the broker: the run's own one only
# Faults after which the interceptor cannot read the policy versions for a while: (d) restarts it with the
# broker down, so the calls it dispatches until it reads the topic are recorded with no version
# (``compose.tools.chaos.accounting.account``'s ``versions_unreadable``).
VERSIONS_UNREADABLE = ("interceptor",)

FAULT_LABELS = {
    "broker": "(a) broker kill -9, restart",
    "processor": "(b) processor kill -9 (each restarted)",
    "consumer": "(c) consumer kill deliver..retire",
    "interceptor": "(d) interceptor kill -9 mid-stream",
    "engine-stall": "(e) engine stall (pause keep, resume)",
    "engine-abort": "(f) engine abort (pause abort, resume)",
}

