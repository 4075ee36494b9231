"""Scale-out on one machine: several interceptors, fold workers and consumers, and faults under load.

One topology for ``tests/integration/e2e/test_scale_out.py`` and ``tokentrail bench scaleout``.
A `ScaleRun` is a `LocalStack` on topics of its own with ``Topology.partitions`` partitions:
the reference policy server, ``interceptors`` interceptors, ``processors`` fold workers in one
app id (one Kafka group), and ``groups`` consumer groups, the first with ``consumers`` members and
every other one with one (independent groups: each must see every rollout). `drive` runs a
deterministic `Workload` of multi-call, tool-using rollouts through the OpenAI SDK harness, each
rollout on one interceptor (blocks of rollouts round robin), finishes them, and meanwhile applies
`Chaos`: a fold worker killed with -9 and a new one started, a consumer added to the first group,
one stopped and one killed with -9 and replaced, each when a set fraction of the rollouts is finished. `wait_delivered` returns once every group
delivered every rollout; `figures` are the per-worker counts (calls captured per interceptor from
its ``/metrics``, events folded per fold worker from its log, records written per consumer).
The checks on what was delivered are in ``compose.rig.scaleout_checks``.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from compose.harnesses.sdk import Outcome, run_rollout
from compose.rig.stack import LocalStack, StackError
from schemas.kafka.security import KafkaSecurity
from schemas.kafka.topics import DEFAULT_PARTITIONS

__all__ = ["Chaos", "ONE_WORKER", "SCALED", "ScaleRun", "Topology", "Workload", "group_assignment", "print_figures"]


@dataclass(frozen=True)
class Topology:
    partitions: int = 12
    interceptors: int = 2
    processors: int = 3
    consumers: int = 3  # members of the first consumer group
    groups: int = 2  # consumer groups; every group after the first has one member

    def describe(self) -> str:
        return (f"{self.partitions} partitions, {self.interceptors} interceptor(s), {self.processors} fold "
                f"worker(s), {self.groups} consumer group(s) ({self.consumers} + {self.groups - 1} x 1 consumers)")


ONE_WORKER = Topology(partitions=DEFAULT_PARTITIONS, interceptors=1, processors=1, consumers=1, groups=1)
SCALED = Topology()


@dataclass(frozen=True)
class Workload:
    """``rollouts`` rollouts, ``concurrency`` at a time; rollout i makes 1 + i % max_tool_calls tool calls."""

    rollouts: int = 48
    concurrency: int = 8
    max_tool_calls: int = 4

    def rollout_ids(self) -> list[str]:
        return [f"so-{i:05d}" for i in range(self.rollouts)]

    def tool_calls(self, i: int) -> int:
        return 1 + i % self.max_tool_calls


@dataclass(frozen=True)
class Chaos:
    """Faults while rollouts are in flight, each at a fraction of the rollouts finished (None: not done)."""

    kill_processor_at: float | None = 0.25  # kill -9 a fold worker, start a new one (fresh data dir)
    add_consumer_at: float | None = 0.4  # a new member of the first consumer group
    remove_consumer_at: float | None = 0.6  # the first group's first member stops (SIGTERM)
    crash_consumer_at: float | None = 0.75  # kill -9 a member of the first group, start a new one

    @classmethod
    def none(cls) -> Chaos:
        return cls(None, None, None, None)


@dataclass
class ScaleRun:
    bootstrap: str
    run_dir: Path
    topology: Topology
    name: str = "scale"
    kafka_configs: dict[str, Path] = field(default_factory=dict)  # LocalStack's: role -> client config file
    stack: LocalStack = field(init=False)
    interceptors: list[str] = field(default_factory=list)
    processors: list[str] = field(default_factory=list)  # every fold worker ever started, in order
    groups: dict[str, list[str]] = field(default_factory=dict)  # group id -> its consumers ever started
    happened: list[str] = field(default_factory=list)  # the chaos steps, in order, with when
    window_s: float = 0.0  # from the first rollout's start to the last delivery
    assignments: dict[str, list[set[int]]] = field(default_factory=dict)  # group -> partitions per member, settled
    _t0: float = 0.0
    _captured: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.app_id = f"{self.name}-{tag}"
        self.stack = LocalStack(self.bootstrap, self.run_dir, topic_prefix=f"{self.name}{tag}.",
                                processor_id=self.app_id, partitions=self.topology.partitions,
                                with_pipeline=False, die_with_parent=True, kafka_configs=self.kafka_configs)

    # -- lifecycle ----------------------------------------------------------------
    def start(self, timeout: float = 150.0) -> ScaleRun:
        """Bring every service up; returns once the fold workers and each consumer group spread their partitions evenly."""
        t, stack = self.topology, self.stack
        try:
            stack.start()  # the policy server and the first interceptor, named "interceptor"
            self.interceptors = ["interceptor"]
            for k in range(2, t.interceptors + 1):
                self.interceptors.append(stack.add_interceptor(f"interceptor-{k}").name)
            for k in range(1, t.processors + 1):  # all at once: one rebalance rather than one each
                self.processors.append(stack.add_processor(f"processor-{k}", wait=False).name)
            for name in self.processors:
                stack.wait_log(name, "Worker ready", timeout=timeout)
            for g in range(t.groups):
                group = self.first_group if g == 0 else f"{self.app_id}-group{g + 1}"
                for _ in range(t.consumers if g == 0 else 1):
                    self.add_consumer(group)
            self.wait_balanced(self.app_id, stack.topics.rollout_events, t.processors, timeout)
            for group, members in self.groups.items():
                self.wait_balanced(group, stack.topics.snapshots, len(members), timeout)
        except BaseException:
            stack.stop()
            raise
        return self

    def stop(self) -> None:
        """Read the interceptors' counters, then stop every service (fold workers log their final count)."""
        for name in self.interceptors:
            if name in self.stack.services:
                self._captured[name] = _calls_captured(str(self.stack.services[name].url))
        self.stack.stop()

    def __enter__(self) -> ScaleRun:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stack.stop()

    @property
    def first_group(self) -> str:
        return f"{self.app_id}-consumer"

    def add_consumer(self, group: str) -> str:
        members = self.groups.setdefault(group, [])
        letter = "abcdefghijklmnopqrstuvwxyz"[list(self.groups).index(group)]
        name = f"consumer-{letter}{len(members) + 1}"
        self.stack.add_consumer(name, group_id=group)
        members.append(name)
        return name

    def sink_path(self, consumer: str) -> Path:
        return self.run_dir / f"{consumer}.jsonl"

    def wait_balanced(self, group: str, topic: str, members: int, timeout: float) -> list[set[int]]:
        """Wait until ``group`` has ``members`` members holding ``topic``'s partitions evenly; the assignment."""
        p = self.topology.partitions
        even = sorted([p // members + (1 if i < p % members else 0) for i in range(members)])
        deadline, seen = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            try:
                seen = group_assignment(self.bootstrap, group, topic, security=self.stack.security("admin"))
            except Exception:  # the group is rebalancing: its description is not ready
                seen = None
            if seen is not None and sorted(map(len, seen)) == even:
                return seen
            self._check_alive()
            time.sleep(0.5)
        raise StackError(f"group {group} did not spread {topic}'s {p} partitions over {members} members "
                         f"within {timeout:.0f} s (last assignment: {seen})\n" + self.logs())

    # -- workload -----------------------------------------------------------------
    async def drive(self, work: Workload, chaos: Chaos = Chaos.none()) -> dict[str, Outcome]:
        """Run and finish every rollout of ``work``, applying ``chaos`` meanwhile; each rollout's outcome."""
        ids, gate, done = work.rollout_ids(), asyncio.Semaphore(work.concurrency), 0
        steps = sorted(((at, step) for at, step in ((chaos.kill_processor_at, self.replace_processor),
                                                     (chaos.add_consumer_at, self.grow_group),
                                                     (chaos.remove_consumer_at, self.shrink_group),
                                                     (chaos.crash_consumer_at, self.replace_consumer))
                        if at is not None), key=lambda s: s[0])
        running: list[asyncio.Task] = []
        self._t0 = time.monotonic()

        async def one(i: int) -> Outcome:
            nonlocal done
            # blocks of max_tool_calls rollouts (one of each length) per interceptor: the same calls each
            rid, via = ids[i], self.interceptors[(i // work.max_tool_calls) % len(self.interceptors)]
            async with gate:
                out = await run_rollout(self.stack.capture_base_url(rid, via=via), rid, f"weather in city {i}?",
                                        tool_calls=work.tool_calls(i))
                await asyncio.to_thread(self.stack.finish, rid, {"reward": 0.0 if out.error else 1.0},
                                        final_response_id=out.final_response_id, final_text=out.final_text, via=via)
            done += 1
            while steps and done >= steps[0][0] * len(ids):  # the step runs while the rest is in flight
                running.append(asyncio.create_task(steps.pop(0)[1](done)))
            return out

        outcomes = await asyncio.gather(*(one(i) for i in range(len(ids))))
        await asyncio.gather(*running)
        return {o.rollout_id: o for o in outcomes}

    # Chaos steps spawn on the event loop's thread and only wait in worker threads: with die_with_parent a
    # service gets SIGTERM when the thread that spawned it ends (PR_SET_PDEATHSIG), and to_thread's end.
    async def replace_processor(self, done: int) -> None:
        victim = self.processors[min(1, len(self.processors) - 1)]
        code = self.stack.remove(victim, signal.SIGKILL)
        new = self.stack.add_processor(f"processor-{len(self.processors) + 1}", wait=False).name
        self.processors.append(new)
        self._note(f"after {done} finished: kill -9 {victim} (exit {code}), started {new}")
        await asyncio.to_thread(self.stack.wait_log, new, "Worker ready", 150)
        self._note(f"{new} ready")

    async def grow_group(self, done: int) -> None:
        name = self.add_consumer(self.first_group)
        self._note(f"after {done} finished: added {name} to {self.first_group}")

    async def shrink_group(self, done: int) -> None:
        victim = self.groups[self.first_group][0]
        code = await asyncio.to_thread(self.stack.remove, victim, signal.SIGTERM)
        self._note(f"after {done} finished: stopped {victim} (SIGTERM, exit {code})")
        if code != 0:
            raise StackError(f"{victim} did not stop cleanly (exit {code})")

    async def replace_consumer(self, done: int) -> None:
        running = [c for c in self.groups[self.first_group] if c in self.stack.services]
        victim = running[0]
        code = self.stack.remove(victim, signal.SIGKILL)
        name = self.add_consumer(self.first_group)
        self._note(f"after {done} finished: kill -9 {victim} (exit {code}), added {name}")

    def _note(self, text: str) -> None:
        self.happened.append(f"t+{time.monotonic() - self._t0:5.1f}s {text}")

    # -- results ------------------------------------------------------------------
    def wait_delivered(self, rollout_ids: list[str], timeout: float = 150.0) -> None:
        """Return once every consumer group wrote every rollout (in one of its members' files)."""
        wanted, deadline = set(rollout_ids), time.monotonic() + timeout
        while True:
            missing = {g: wanted - self.delivered_ids(g) for g in self.groups}
            if not any(missing.values()):
                self.window_s = time.monotonic() - self._t0
                return
            if time.monotonic() > deadline:
                brief = {g: sorted(m)[:8] + ([f"... {len(m)} in all"] if len(m) > 8 else []) for g, m in missing.items()}
                raise StackError(f"not delivered within {timeout:.0f} s: {brief}\n" + self.logs())
            self._check_alive()
            time.sleep(0.3)

    def settle(self, timeout: float = 150.0) -> dict[str, list[set[int]]]:
        """Wait until the fold workers and the first consumer group that are still running spread their
        partitions evenly again (after the faults); their assignments, recorded in ``assignments``."""
        running = set(self.stack.services)
        members = {self.app_id: (self.stack.topics.rollout_events, [p for p in self.processors if p in running]),
                   self.first_group: (self.stack.topics.snapshots,
                                      [c for c in self.groups[self.first_group] if c in running])}
        self.assignments = {group: self.wait_balanced(group, topic, len(names), timeout)
                            for group, (topic, names) in members.items()}
        return self.assignments

    def delivered_ids(self, group: str) -> set[str]:
        out: set[str] = set()
        for consumer in self.groups[group]:
            path = self.sink_path(consumer)
            if path.exists():
                out.update(m.group(1) for m in _ROLLOUT_ID.finditer(path.read_bytes().decode()))
        return out

    def lines(self, consumer: str) -> list[bytes]:
        """The consumer's JSONL records, complete lines only, newline included."""
        path = self.sink_path(consumer)
        if not path.exists():
            return []
        return [line for line in path.read_bytes().splitlines(keepends=True) if line.endswith(b"\n")]

    def figures(self) -> dict[str, dict[str, int]]:
        """Per-worker counts: calls captured per interceptor, events folded per fold worker, records per consumer.

        Call after `stop` (the interceptors' counters are read there, the fold workers' last count at exit).
        """
        folded = {name: _last_fold_count(self.stack.run_dir / f"{name}.log") for name in self.processors}
        written = {c: len(self.lines(c)) for members in self.groups.values() for c in members}
        return {"interceptor calls captured": dict(self._captured), "processor events folded": folded,
                "consumer records written": written}

    def events_in_log(self) -> int:
        """Records on the run's rollout-events topic: what one clean pass folds (CallStarted and CallCaptured
        per call, a finish per rollout, a retire per rollout and group). Fold workers fold more than this by
        what they re-fold after a kill or a rebalance (events not yet committed when a partition moved)."""
        from schemas.kafka.scan import TopicReader

        reader = TopicReader(self.bootstrap, security=self.stack.security("admin"))
        try:
            return sum(1 for _ in reader.read_topic(self.stack.topics.rollout_events))
        finally:
            reader.close()

    def logs(self, lines: int = 15) -> str:
        return "\n".join(f"--- {s.name} ---\n{s.log_tail(lines)}" for s in list(self.stack.services.values()))

    def _check_alive(self) -> None:
        dead = self.stack.exited()
        if dead:
            raise StackError(f"services exited: {dead}\n" + self.logs())


def print_figures(label: str, run: ScaleRun) -> None:
    """The run's topology, its faults, and per-worker counts and rates over its window."""
    window = max(run.window_s, 1e-9)
    print(f"== {label}: {run.topology.describe()}; window {run.window_s:.1f} s")
    for step in run.happened:
        print(f"   {step}")
    for group, parts in run.assignments.items():
        print(f"   settled: {group} holds {sorted(sorted(p) for p in parts)}")
    print(f"   events in the log: {run.events_in_log()} (fold workers re-fold what was uncommitted when a "
          "partition moved; a worker killed -9 shows its count up to a second before the kill)")
    for what, per_worker in run.figures().items():
        total = sum(per_worker.values())
        print(f"   {what}: total {total} ({total / window:.1f}/s)")
        for name, n in per_worker.items():
            print(f"     {name:<16} {n:>7}  {n / window:8.1f}/s")


_ROLLOUT_ID = re.compile(r'^\{"rollout_id":"([^"]*)"', re.M)
_FOLDED = re.compile(rb"folded (\d+) events")


def _last_fold_count(log: Path) -> int:
    counts = _FOLDED.findall(log.read_bytes()) if log.exists() else []
    return int(counts[-1]) if counts else 0


def _calls_captured(url: str) -> int:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("tokentrail_calls_captured_total")))


def group_assignment(bootstrap: str, group: str, topic: str, *,
                     security: KafkaSecurity | None = None) -> list[set[int]]:
    """The partitions of ``topic`` each member of the Kafka group ``group`` holds now (``security``: how to connect)."""
    from confluent_kafka.admin import AdminClient

    from schemas.kafka.config import admin_config

    admin = AdminClient(admin_config(bootstrap, security=security))
    desc = admin.describe_consumer_groups([group])[group].result(timeout=10)
    return [{tp.partition for tp in m.assignment.topic_partitions if tp.topic == topic} for m in desc.members]
