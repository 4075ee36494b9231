"""One chaos run: its own broker, one local stack, a clean baseline, then one phase per fault.

Guarantees: the broker is this run's own (started in ``<run_dir>/kafka``, stopped and removed
at the end, so killing it touches nobody else); every service is a real ``tokentrail``
process; each phase runs the same workload under fresh rollout ids
(``<tag>-<phase>-<index>``), waits until every rollout is delivered (or
``deliver_timeout_s``), then reads what the sink got and what the event log holds, and
accounts for it (``compose.tools.chaos.accounting``). The clean run is done twice: the first gives
the baseline, the second shows the baseline is reproducible (its row must be all zeros too).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compose.rig.kafka import broker as kafka_broker
from compose.rig.stack import LocalStack
from compose.tools.chaos.accounting import Outcome, Row, account, canonical
from compose.tools.chaos.faults import (
    BROKER_KILLING,
    FAULT_LABELS,
    FAULTS,
    VERSIONS_UNREADABLE,
    FaultContext,
    Supervisor,
)
from compose.tools.chaos.killsink import TARGET
from compose.tools.chaos.workload import ChaosError, Progress, RolloutRun, Workload, drive
from schemas.codec import decode_event
from schemas.kafka.scan import TopicReader
from schemas.records import CallCaptured, CallIncomplete, CallStarted

__all__ = ["ChaosConfig", "Evidence", "baseline_of", "chaos_stack", "drive_under", "evidence", "outcome_of", "run_chaos"]


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    run_dir: Path
    rollouts: int = 64
    faults: tuple[str, ...] = tuple(FAULTS)
    processor_kills: int = 5
    consumer_kills: int = 3
    broker_down_s: float = 6.0
    decode_ms_per_token: float = 5.0  # the reference engine's emulated decode time: streams last a while
    publish_timeout_ms: int = 2000  # the interceptor spools after this (the default 5 s only slows the run)
    deliver_timeout_s: float = 240.0
    bootstrap: str | None = None  # a broker someone else runs: only for faults that leave the broker alone
    # The interceptor's per-rollout books (lineage index, finished rollouts), when smaller than their defaults:
    # the soak fills them within its first minutes, so that its memory verdict sees them full, not filling.
    interceptor_rollouts: int | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.faults) - set(FAULTS))
        if unknown:
            raise ChaosError(f"unknown fault(s) {unknown}; choose from {sorted(FAULTS)}")
        if self.bootstrap and set(self.faults) & set(BROKER_KILLING):
            raise ChaosError(f"faults {sorted(set(self.faults) & set(BROKER_KILLING))} kill the broker: run them on "
                             f"the run's own broker (no bootstrap={self.bootstrap!r})")
        if self.rollouts < 1:
            raise ChaosError(f"rollouts={self.rollouts}: run at least one rollout")


def run_chaos(config: ChaosConfig, *, log=print) -> list[Row]:
    """Run the clean baseline and every fault of ``config``; one accounted row per phase."""
    shutil.rmtree(config.run_dir, ignore_errors=True)
    config.run_dir.mkdir(parents=True)
    broker_dir = config.run_dir / "kafka"
    if config.bootstrap:
        bootstrap = config.bootstrap
    else:
        broker = kafka_broker.start_broker(broker_dir, partitions=4)
        bootstrap = broker.bootstrap
        log(f"chaos: own Kafka broker at {bootstrap} (pid {broker.pid}, {broker_dir})")
    tag = f"chaos{uuid.uuid4().hex[:8]}"
    stack = chaos_stack(config, bootstrap, tag)
    try:
        stack.start()
        return asyncio.run(_phases(config, stack, broker_dir, tag, log))
    finally:
        stack.stop()
        if not config.bootstrap:
            kafka_broker.stop_broker(broker_dir)


def chaos_stack(config: ChaosConfig, bootstrap: str, tag: str) -> LocalStack:
    d = config.run_dir
    sink_kwargs = {"path": str(d / "rollouts.jsonl"), "count_path": str(d / "sink.count"),
                   "plan_path": str(d / "sink.plan")}
    return LocalStack(
        bootstrap=bootstrap, run_dir=d, topic_prefix=f"{tag}.", processor_id=f"{tag}-processor",
        policy_args=("--decode-ms-per-token", str(config.decode_ms_per_token)),
        intercept_args=("--spool-dir", str(d / "spool"), "--publish-timeout-ms", str(config.publish_timeout_ms),
                        *(() if config.interceptor_rollouts is None else
                          ("--index-max-rollouts", str(config.interceptor_rollouts),
                           "--finished-max-rollouts", str(config.interceptor_rollouts)))),
        sink=TARGET, consumer_args=("--sink-kwargs", json.dumps(sink_kwargs)),
    )


async def _phases(config: ChaosConfig, stack: LocalStack, broker_dir: Path, tag: str, log) -> list[Row]:
    workload = Workload(rollouts=config.rollouts)
    expected_calls = sum(workload.tool_calls(i) + 1 for i in range(workload.rollouts))
    rows: list[Row] = []
    async with Supervisor(stack) as supervisor:
        started = time.monotonic()
        clean = await _phase(stack, workload, f"{tag}-clean", None, None, config)
        baseline = baseline_of(clean)
        log(f"chaos: clean run, {len(baseline)} rollouts in {time.monotonic() - started:.1f} s")
        phases: list[tuple[str, str | None]] = [("none (clean repeat)", None)]
        phases += [(FAULT_LABELS[name], name) for name in config.faults]
        for label, name in phases:
            started = time.monotonic()
            ctx = FaultContext(stack=stack, supervisor=supervisor, progress=Progress(), expected_calls=expected_calls,
                               expected_rollouts=workload.rollouts, broker_dir=broker_dir,
                               sink_count_path=config.run_dir / "sink.count",
                               sink_plan_path=config.run_dir / "sink.plan", broker_down_s=config.broker_down_s,
                               processor_kills=config.processor_kills, consumer_kills=config.consumer_kills)
            unplanned = len(supervisor.unplanned)
            outcomes = await _phase(stack, workload, f"{tag}-{name or 'repeat'}", name, ctx, config)
            crashes = supervisor.unplanned[unplanned:]
            note = "; ".join([*ctx.notes, f"{time.monotonic() - started:.1f} s",
                              *([f"unplanned exits: {', '.join(crashes)}"] if crashes else [])])
            rows.append(account(label, outcomes, baseline, note=note, versions_unreadable=name in VERSIONS_UNREADABLE))
            log(f"chaos: {label}: {note}")
    return rows


async def _phase(stack: LocalStack, workload: Workload, prefix: str, fault: str | None, ctx: FaultContext | None,
                 config: ChaosConfig) -> list[Outcome]:
    """Drive the workload as ``<prefix>-<i>`` with ``fault`` injected beside it; what each rollout became."""
    runs = await drive_under(stack, prefix, workload, ctx.progress if ctx is not None else Progress(), fault, ctx)
    delivered = await _wait_delivered(stack, [r.rollout_id for r in runs], config.deliver_timeout_s)
    found = await asyncio.to_thread(evidence, stack, {r.rollout_id for r in runs})
    return [outcome_of(r, delivered.get(r.rollout_id, []), found.get(r.rollout_id, Evidence())) for r in runs]


async def drive_under(stack: LocalStack, prefix: str, workload: Workload, progress: Progress, fault: str | None,
                      ctx: FaultContext | None) -> list[RolloutRun]:
    """``drive`` the workload as ``<prefix>-<i>``, ``fault`` (its note added to ``ctx.notes``) injected beside it."""
    driving = asyncio.ensure_future(drive(stack, prefix, workload, progress))
    if fault is not None and ctx is not None:
        try:
            ctx.notes.append(await FAULTS[fault](ctx))
        except BaseException:
            driving.cancel()
            raise
    return await driving


def outcome_of(run: RolloutRun, records: list[dict[str, Any]], ev: Evidence) -> Outcome:
    return Outcome(run.index, run.rollout_id, tuple(run.acked), run.failure, tuple(records), dict(ev.captured),
                   failed_attempts=run.failed_attempts, started=frozenset(ev.started),
                   incomplete=frozenset(ev.incomplete))


def baseline_of(outcomes: list[Outcome]) -> dict[int, str]:
    """The clean run's canonical record per index; a clean run that is not itself clean stops the run."""
    bad = [o.rollout_id for o in outcomes if o.failure or o.failed_attempts or len(o.records) != 1
           or o.records[0].get("mask_sample") is not False]
    if bad:
        raise ChaosError(f"the clean run is not clean (a failed call, no single unmasked record): {bad[:5]}")
    return {o.index: canonical(o.records[0], o.rollout_id) for o in outcomes}


async def _wait_delivered(stack: LocalStack, rollout_ids: list[str], timeout: float) -> dict[str, list[dict]]:
    """Every record the sink holds for these rollouts, once each has one (or the timeout passed)."""
    wanted = set(rollout_ids)
    deadline = time.monotonic() + timeout
    while True:
        found: dict[str, list[dict]] = defaultdict(list)
        for record in stack.delivered():
            if record["rollout_id"] in wanted:
                found[record["rollout_id"]].append(record)
        if set(found) >= wanted or time.monotonic() > deadline:
            return dict(found)
        await asyncio.sleep(0.25)


@dataclass
class Evidence:
    captured: Counter[str] = field(default_factory=Counter)
    started: set[str] = field(default_factory=set)
    incomplete: set[str] = field(default_factory=set)


def evidence(stack: LocalStack, rollout_ids: set[str], from_time_ms: int | None = None) -> dict[str, Evidence]:
    """Per rollout, what the event log holds: CallCaptured per call id (duplicates counted), intents, incompletes.

    ``from_time_ms``: only records written from then on (a soak's wave; chaos reads the whole log)."""
    found: dict[str, Evidence] = defaultdict(Evidence)
    reader = TopicReader(stack.bootstrap)
    try:
        for msg in reader.read_topic(stack.topics.rollout_events, from_time_ms=from_time_ms):
            if msg.key() is None or msg.key().decode(errors="replace") not in rollout_ids:
                continue
            event = decode_event(msg.value())
            body, ev = event.body, found[event.rollout_id]
            if isinstance(body, CallCaptured):
                ev.captured[body.model_call_id] += 1
            elif isinstance(body, CallStarted):
                ev.started.add(body.model_call_id)
            elif isinstance(body, CallIncomplete) and body.model_call_id:
                ev.incomplete.add(body.model_call_id)
    finally:
        reader.close()
    return dict(found)
