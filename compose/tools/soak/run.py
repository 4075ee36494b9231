"""One soak: the chaos workload in waves for ``minutes``, a fault every few minutes, an announcement every few.

Guarantees and what is checked (``verdict``):

- The broker is the run's own (``<run_dir>/kafka``), every service a real ``tokentrail`` process, as in
  ``compose.tools.chaos``. A clean wave first gives the baseline record of each rollout index; then
  waves of ``rollouts`` concurrent tool-calling rollouts (streaming and not, ``Workload``) run back to
  back under fresh ids (``<tag>-w<k>-<i>``) until ``minutes`` passed and each fault ran once. A wave
  that starts ``fault_every_s`` after the last fault gets the next of ``faults`` (round robin; the chaos set:
  broker, processor, interceptor kill -9, consumer kill between deliver and retire, engine stall and
  abort) injected under it (the label says "steady" for a wave without one).
- Every ``announce_every_s`` a new policy version is labelled on the engine and announced (one standing
  ``VersionAnnouncer``, which returns once the interceptor applied it), between two waves. The stand-in
  engine samples differently under each version, so a version's first wave, never faulted, is its
  baseline (the very first is the run's clean wave); a baseline wave that is not clean (a failed call,
  not one unmasked record per rollout) stops the soak.
- Each wave is accounted exactly as a chaos phase (``compose.tools.chaos.accounting``): acknowledged
  calls lost or duplicated, unmasked rollouts that lost a call, records that differ (a rollout never
  delivered differs). All must be zero.
- Every ``sample_every_s`` a ``Sample`` (``compose.tools.soak.sampling``). The RSS of each tokentrail
  process (``JUDGED``; the stand-in engine is sampled, not judged: it keeps four versions' tables) may
  grow at most ``rss_growth_max`` from the reference sample (10 minutes into the process's life in an
  hour-long run, half the run in a short one, never under a minute) to its last, per process instance:
  a fault restarts a service and its memory with it (``SoakReport.rss_growth``). The interceptor's
  per-rollout books are bounded (``interceptor_rollouts``) small enough to be full by then: what grows
  after is not a book filling up.
- After the last wave the load drains: the consumer's lag reaches 0 and the processor's live state
  (its changelog's live keys, retired rollouts' tombstone headers apart) returns to what it held
  before the first wave. The tombstones are counted apart: one small header per retired rollout,
  kept on purpose (ARCHITECTURE: late writers of a retired attempt are dead-lettered), so they grow
  with the rollouts ever retired, linearly; the table prints their bytes per rollout.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compose.engines.vllm_rig.admin import set_version
from compose.rig.kafka import broker as kafka_broker
from compose.rig.stack import LocalStack
from compose.tools.chaos.accounting import COUNTS, Outcome, Row, account
from compose.tools.chaos.faults import FAULT_LABELS, FAULTS, VERSIONS_UNREADABLE, FaultContext, Supervisor
from compose.tools.chaos.run import ChaosConfig, Evidence, baseline_of, chaos_stack, drive_under, evidence, outcome_of
from compose.tools.chaos.workload import ChaosError, Progress, Workload
from compose.tools.soak.sampling import ChangelogState, ProcessStats, Sample, consumer_lag, percentile, process_stats
from schemas.kafka.announce import VersionAnnouncer

__all__ = ["JUDGED", "SoakConfig", "SoakReport", "run_soak"]

_SERVICES = ("policy", "interceptor", "processor", "consumer")
JUDGED = ("interceptor", "processor", "consumer")  # tokentrail's own; the policy server is the stand-in engine


@dataclass(frozen=True, slots=True)
class SoakConfig:
    run_dir: Path
    minutes: float = 60.0
    rollouts: int = 16  # concurrent rollouts per wave
    fault_every_s: float = 300.0
    announce_every_s: float = 180.0
    sample_every_s: float = 60.0
    faults: tuple[str, ...] = tuple(FAULTS)
    rss_growth_max: float = 0.10
    processor_kills: int = 2  # per processor fault, each restart awaited
    drain_timeout_s: float = 180.0
    deliver_timeout_s: float = 240.0
    # The interceptor's lineage index and finished-rollouts book hold up to this many rollouts (65,536 each by
    # default: ~15 MB and more, which an hour's ~12,000 rollouts per interceptor life only fill part of, so
    # the RSS verdict saw a bounded book filling as growth: +16 % in an hour at 20da402). At ~400 rollouts a
    # minute a book of 1,000 is full within 3 minutes, well before the 10-minute reference sample.
    interceptor_rollouts: int = 1_000

    def __post_init__(self) -> None:
        unknown = sorted(set(self.faults) - set(FAULTS))
        if unknown:
            raise ChaosError(f"faults={','.join(unknown)}: unknown; choose from {','.join(FAULTS)}")
        for name in ("minutes", "fault_every_s", "announce_every_s", "sample_every_s", "drain_timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ChaosError(f"{name}={value!r} must be > 0")
        if self.rollouts < 1:
            raise ChaosError(f"rollouts={self.rollouts}: run at least one rollout per wave")
        if self.processor_kills < 1:
            raise ChaosError(f"processor_kills={self.processor_kills}: a processor fault kills it at least once")

    @property
    def reference_s(self) -> float:
        """How far into a process's life its RSS reference sample is: 10 minutes in an hour or longer, else half the
        run, and never under a minute (a process restarted by a fault spends its first one recovering: a
        processor grew 77 -> 87 MiB in it)."""
        return max(60.0, min(600.0, self.minutes * 60.0 / 2))


@dataclass
class SoakReport:
    rows: list[Row] = field(default_factory=list)  # one per wave (the clean one first)
    samples: list[Sample] = field(default_factory=list)
    starts: Counter[str] = field(default_factory=Counter)  # service -> restarts (a fault's or not)
    state_before: tuple[int, int] = (0, 0)  # live keys, bytes before the first wave
    state_after: tuple[int, int] = (0, 0)  # ... once the load drained
    tombstones: tuple[int, int] = (0, 0)  # retired rollouts' headers (keys, bytes) at the end
    delivered: int = 0
    late_duplicates: list[str] = field(default_factory=list)  # rollouts delivered again after their wave
    drained_s: float = -1.0  # seconds from the last wave's end until lag 0 and state back; -1: not in time
    announced: list[str] = field(default_factory=list)

    def rss_growth(self, reference_s: float) -> dict[str, float]:
        """Per service, the largest (last RSS / RSS ``reference_s`` into its life) - 1 of any of its instances.

        A fault restarts a service, and its memory with it: each process instance (pid) is judged on its
        own, from its first sample at least ``reference_s`` after its first sample to its last. An
        instance that did not live that long is not judged; a service none of whose instances did is
        absent from the result (the table says which were).
        """
        growth: dict[str, float] = {}
        for name in JUDGED:
            lives: dict[int, list[tuple[float, ProcessStats]]] = {}
            for s in self.samples:
                if name in s.processes:
                    lives.setdefault(s.processes[name].pid, []).append((s.at_s, s.processes[name]))
            for life in lives.values():
                born = life[0][0]
                ref = next((p for at, p in life if at - born >= reference_s), None)
                if ref is not None and ref.rss_kib:
                    g = life[-1][1].rss_kib / ref.rss_kib - 1
                    growth[name] = max(growth.get(name, g), g)
        return growth

    def verdict(self, config: SoakConfig) -> list[str]:
        """Why the soak failed; empty when it passed."""
        failed = [f"{row.fault}: {count} {getattr(row, count)}" for row in self.rows for count in COUNTS
                  if getattr(row, count)]
        failed += [f"{name} RSS grew {g:.1%} from {config.reference_s / 60:.1f} min to the end (> "
                   f"{config.rss_growth_max:.0%})" for name, g in self.rss_growth(config.reference_s).items()
                   if g > config.rss_growth_max + 1e-9]  # exactly the limit is within it
        if self.late_duplicates:
            failed.append(f"{len(self.late_duplicates)} record(s) delivered again after their wave was accounted: "
                          f"{sorted(set(self.late_duplicates))[:5]}")
        if self.drained_s < 0:
            failed.append(f"the load did not drain within {config.drain_timeout_s:.0f} s: live state "
                          f"{self.state_after} (keys, bytes) vs {self.state_before} before, or consumer lag left")
        return failed


def run_soak(config: SoakConfig, *, log=print) -> SoakReport:
    shutil.rmtree(config.run_dir, ignore_errors=True)
    config.run_dir.mkdir(parents=True)
    broker_dir = config.run_dir / "kafka"
    broker = kafka_broker.start_broker(broker_dir, partitions=4)
    log(f"soak: own Kafka broker at {broker.bootstrap} (pid {broker.pid})")
    tag = f"soak{uuid.uuid4().hex[:8]}"
    chaos = ChaosConfig(run_dir=config.run_dir, rollouts=config.rollouts, faults=config.faults,
                        processor_kills=config.processor_kills, consumer_kills=1,
                        deliver_timeout_s=config.deliver_timeout_s, interceptor_rollouts=config.interceptor_rollouts)
    stack = chaos_stack(chaos, broker.bootstrap, tag)
    try:
        stack.start()
        return asyncio.run(_soak(config, chaos, stack, broker_dir, tag, log))
    finally:
        stack.stop()
        kafka_broker.stop_broker(broker_dir)


class _Delivered:
    """The JSONL sink's records, read as they are appended (whole lines only), held until their wave is accounted.

    An hour delivers ~20,000 records of ~10 KB: an accounted wave's are dropped (``done``), and a record
    that arrives later for an accounted rollout is a duplicate delivery (``late``), which fails the soak.
    """

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0
        self.pending: dict[str, list[dict[str, Any]]] = {}
        self.accounted: set[str] = set()
        self.late: list[str] = []

    @property
    def count(self) -> int:
        return len(self.accounted) + len(self.pending)

    def read(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            if line.strip():
                record = json.loads(line)
                rid = record["rollout_id"]
                if rid in self.accounted:
                    self.late.append(rid)
                else:
                    self.pending.setdefault(rid, []).append(record)

    def done(self, rollout_ids: set[str]) -> None:
        for rid in rollout_ids:
            self.pending.pop(rid, None)
        self.accounted |= rollout_ids


async def _soak(config: SoakConfig, chaos: ChaosConfig, stack: LocalStack, broker_dir: Path, tag: str,
                log) -> SoakReport:
    report = SoakReport()
    workload = Workload(rollouts=config.rollouts)
    expected_calls = sum(workload.tool_calls(i) + 1 for i in range(workload.rollouts))
    delivered = _Delivered(config.run_dir / "rollouts.jsonl")
    state = ChangelogState(stack.bootstrap, f"{stack.processor_id}-rollout-state-changelog")
    announcer = VersionAnnouncer(stack.bootstrap, topic=stack.topics.policy_versions)
    progress = Progress()
    started = time.monotonic()

    def announce(step: int) -> str:
        label = f"{tag}-v{step}"
        set_version(stack.policy_url, label)
        announcer.announce(label, step)
        report.announced.append(label)
        return label

    async def sampler() -> None:
        since = 0
        while True:
            await asyncio.sleep(config.sample_every_s)
            try:
                sample = await asyncio.to_thread(_sample, stack, state, report, progress.calls[since:],
                                                 time.monotonic() - started, delivered.count)
            except Exception as exc:  # a sampling error loses one minute's figures, never the soak
                log(f"soak: a sample failed: {exc!r}")
                continue
            since = len(progress.calls)
            report.samples.append(sample)
            log(f"soak: {sample.at_s / 60:5.1f} min  " + _line(sample))

    await asyncio.to_thread(announcer.open)
    try:
        async with Supervisor(stack) as supervisor:
            label = await asyncio.to_thread(announce, 0)
            report.state_before = (await asyncio.to_thread(state.read_split))[0]
            sampling = asyncio.ensure_future(sampler())
            try:
                baseline: dict[int, str] = {}
                k, faults, last_fault, last_announce = 0, 0, time.monotonic(), time.monotonic()
                # ``minutes``, and until each fault ran once (a short run on a slow host still has them all).
                while not baseline or time.monotonic() - started < config.minutes * 60 or faults < len(config.faults):
                    k += 1
                    now = time.monotonic()
                    if now - last_announce >= config.announce_every_s:
                        label = await asyncio.to_thread(announce, len(report.announced))
                        last_announce, baseline = now, {}
                    fault = None
                    if baseline and now - last_fault >= config.fault_every_s and config.faults:
                        fault, faults, last_fault = config.faults[faults % len(config.faults)], faults + 1, now
                    ctx = FaultContext(stack=stack, supervisor=supervisor, progress=Progress(),
                                       expected_calls=expected_calls, expected_rollouts=workload.rollouts,
                                       broker_dir=broker_dir, sink_count_path=config.run_dir / "sink.count",
                                       sink_plan_path=config.run_dir / "sink.plan",
                                       processor_kills=config.processor_kills, consumer_kills=1)
                    ctx.progress.calls = progress.calls
                    unplanned = len(supervisor.unplanned)
                    wave_started = time.monotonic()
                    outcomes = await _wave(stack, workload, f"{tag}-w{k}", fault, ctx, chaos, delivered,
                                           ctx.progress)
                    crashes = supervisor.unplanned[unplanned:]
                    note = "; ".join([label, *ctx.notes, f"{time.monotonic() - wave_started:.1f} s",
                                      *([f"unplanned exits: {', '.join(crashes)}"] if crashes else [])])
                    kind = FAULT_LABELS[fault] if fault else "steady" if baseline else "baseline (a version's first)"
                    if not baseline:  # the version's first wave, never faulted: its baseline (ChaosError if not clean)
                        baseline = baseline_of(outcomes)
                    row = account(kind, outcomes, baseline, note=note, versions_unreadable=fault in VERSIONS_UNREADABLE)
                    report.rows.append(row)
                    if fault or any(getattr(row, c) for c in COUNTS):
                        log(f"soak: wave {k} {row.fault}: {note}; " + ", ".join(f"{c} {getattr(row, c)}" for c in COUNTS))
                report.starts = Counter(supervisor.planned_exits) + Counter(u.split()[0] for u in supervisor.unplanned)
            finally:
                sampling.cancel()
            drain_started = time.monotonic()
            report.drained_s = await asyncio.to_thread(_drain, stack, state, report, config.drain_timeout_s)
            if report.drained_s >= 0:
                report.drained_s = time.monotonic() - drain_started
            report.samples.append(await asyncio.to_thread(_sample, stack, state, report, [],
                                                          time.monotonic() - started, delivered.count))
    finally:
        await asyncio.to_thread(announcer.close)
        state.close()
    delivered.read()  # anything delivered after its wave was accounted: a duplicate
    report.delivered, report.late_duplicates = delivered.count, delivered.late
    return report


async def _wave(stack: LocalStack, workload: Workload, prefix: str, fault: str | None, ctx: FaultContext | None,
                chaos: ChaosConfig, delivered: _Delivered, progress: Progress) -> list[Outcome]:
    """One wave of the workload (``fault`` beside it); what each rollout became (``compose.tools.chaos.run``)."""
    since_ms = int(time.time() * 1000) - 5_000
    runs = await drive_under(stack, prefix, workload, progress, fault, ctx)
    wanted = {r.rollout_id for r in runs}
    deadline = time.monotonic() + chaos.deliver_timeout_s
    while True:
        delivered.read()
        if wanted <= delivered.pending.keys() or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.25)
    found = await asyncio.to_thread(evidence, stack, wanted, since_ms)
    outcomes = [outcome_of(r, delivered.pending.get(r.rollout_id, []), found.get(r.rollout_id, Evidence()))
                for r in runs]
    delivered.done(wanted)
    return outcomes


def _sample(stack: LocalStack, state: ChangelogState, report: SoakReport,
            calls: list[tuple[float, float]], at_s: float, delivered: int) -> Sample:
    sample = Sample(at_s=at_s, rollouts=delivered, calls=len(calls))
    for name in _SERVICES:
        service = stack.services.get(name)
        if service is None:
            continue
        stats = process_stats(service.proc.pid)
        if stats is not None:
            sample.processes[name] = stats
    seconds = [s for _, s in calls]
    sample.p50_ms, sample.p99_ms = percentile(seconds, 0.5) * 1000, percentile(seconds, 0.99) * 1000
    try:
        sample.lag = consumer_lag(stack.bootstrap, f"{stack.processor_id}-consumer", stack.topics.snapshots)
        live, tombs = state.read_split()
        (sample.state_keys, sample.state_bytes), report.tombstones = live, tombs
    except Exception:  # a broker down for a fault: this minute has no lag or state figure (-1)
        sample.lag = sample.state_keys = sample.state_bytes = -1
    return sample


def _drain(stack: LocalStack, state: ChangelogState, report: SoakReport, timeout_s: float) -> float:
    """Wait until the consumer's lag is 0 and the live state is back to before the load; 0.0, or -1.0 at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        lag = consumer_lag(stack.bootstrap, f"{stack.processor_id}-consumer", stack.topics.snapshots)
        live, report.tombstones = state.read_split()
        report.state_after = live
        if lag == 0 and live == report.state_before:
            return 0.0
        if time.monotonic() > deadline:
            return -1.0
        time.sleep(1.0)


def _line(s: Sample) -> str:
    procs = "  ".join(f"{n} {p.rss_kib / 1024:.0f} MiB/{p.fds} fd/{p.threads} thr" for n, p in s.processes.items())
    return (f"calls {s.calls} p50 {s.p50_ms:.0f} ms p99 {s.p99_ms:.0f} ms  lag {s.lag}  state {s.state_keys} keys "
            f"{s.state_bytes / 1024:.0f} KiB  delivered {s.rollouts}  {procs}")
