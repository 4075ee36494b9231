"""Real `tokentrail process` workers and real topics for the processor's integration tests.

`FoldWorker` runs the worker command in its own process group (so ``kill -9``
hits exactly it); `publish` produces with the partitioner and limits the
interceptor uses; `TopicReader` reads a topic from the beginning; `Workload`
is a deterministic rollout-events log with its expected snapshots, computed by
the pure fold (a clean replay), which live workers must reproduce byte for byte.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import confluent_kafka
from confluent_kafka.admin import AdminClient

from compose.rig.scaleout import group_assignment  # noqa: F401  (the tests import it from here)
from processors.replay import replay
from schemas.codec import encode_event
from schemas.kafka.admin import produce_all
from schemas.kafka.config import PARTITIONER as PRODUCER_PARTITIONER
from schemas.kafka.topics import MAX_MESSAGE_BYTES, TopicNames
from schemas.records import RolloutEvent

REPO = Path(__file__).resolve().parents[3]


class FoldWorker:
    """One `tokentrail process` worker; each start writes a new log file."""

    def __init__(self, bootstrap: str, run_dir: Path, name: str, *, app_id: str, prefix: str,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.bootstrap, self.name, self.app_id, self.prefix = bootstrap, name, app_id, prefix
        self.extra_args = extra_args
        self.data_dir = run_dir / f"{name}-data"
        self.run_dir = run_dir
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def log(self) -> Path:
        return self.run_dir / f"{self.name}-{self.starts}.log"

    def start(self) -> FoldWorker:
        self.starts += 1
        with open(self.log, "wb") as handle:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "compose.cli", "process", "--bootstrap", self.bootstrap, "--data-dir",
                 str(self.data_dir), "--app-id", self.app_id, "--topic-prefix", self.prefix, "--log-level", "INFO",
                 *self.extra_args],
                stdout=handle, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        return self

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for(self, needle: str, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.log_text():
                return
            if self.proc is not None and self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"worker {self.name} did not log {needle!r}:\n{self.log_text()[-4000:]}")

    def kill9(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self, grace: float = 30.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(grace)
        except subprocess.TimeoutExpired as exc:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"worker {self.name} ignored SIGTERM for {grace} s:\n{self.log_text()[-3000:]}") from exc


def publish(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    """Produce in order, idempotently, keyed like the interceptor; returns once all are acknowledged."""
    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
        "partitioner": PRODUCER_PARTITIONER, "message.max.bytes": MAX_MESSAGE_BYTES, "linger.ms": 5,
    })
    produce_all(producer, topic, records, timeout=60)


@dataclass
class Record:
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]
    partition: int
    offset: int


class TopicReader:
    """Reads a topic from the beginning, accumulating every record it has seen."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.records: list[Record] = []
        self._consumer: confluent_kafka.Consumer | None = confluent_kafka.Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex}", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "fetch.message.max.bytes": MAX_MESSAGE_BYTES,
            "max.partition.fetch.bytes": MAX_MESSAGE_BYTES, "topic.metadata.refresh.interval.ms": 1000,
        })
        self._consumer.subscribe([topic])

    def poll(self, seconds: float = 0.2) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            msg = self._consumer.poll(0.05)
            if msg is None or msg.error():
                continue
            self.records.append(Record(msg.key(), msg.value(), dict(msg.headers() or []), msg.partition(),
                                       msg.offset()))

    def wait(self, done: Callable[[list[Record]], bool], timeout: float, what: str,
             alive: Callable[[], None] = lambda: None) -> None:
        deadline = time.monotonic() + timeout
        while not done(self.records):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
            alive()
            self.poll()

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


@dataclass
class Workload:
    """A rollout-events log (already encoded) and the snapshots a clean run emits for it."""

    records: list[tuple[bytes, bytes]]
    rollouts: list[str]
    expected_distinct: dict[str, list[bytes]] = field(default_factory=dict)
    bad: dict[bytes, str] = field(default_factory=dict)  # value -> expected dead-letter reason

    @property
    def expected_last(self) -> dict[str, bytes]:
        return {rid: snaps[-1] for rid, snaps in self.expected_distinct.items()}

    def split(self, fraction: float) -> tuple[list, list]:
        cut = int(len(self.records) * fraction)
        return self.records[:cut], self.records[cut:]


def build_workload(per_rollout: list[list[RolloutEvent]], bad: dict[bytes, tuple[bytes, str]],
                   seed: int) -> Workload:
    """Interleave the rollouts (each keeps its order), add the bad records, and fold it cleanly."""
    from tests.unit.processors.scenarios import interleave, with_duplicates

    rng = random.Random(seed)
    log = with_duplicates(rng, interleave(rng, per_rollout), len(per_rollout))
    records = [(ev.rollout_id.encode(), encode_event(ev)) for ev in log]
    for value, (key, _reason) in bad.items():
        records.insert(rng.randrange(len(records) + 1), (key, value))
    work = Workload(records, sorted({ev.rollout_id for ev in log}), bad={v: r for v, (_k, r) in bad.items()})
    for step in replay(records):
        for snap in step.result.emitted:
            seen = work.expected_distinct.setdefault(snap.rollout_id, [])
            if snap.data not in seen:
                seen.append(snap.data)
    return work


def emitted_by_rollout(records: list[Record]) -> dict[str, list[bytes]]:
    """Snapshot records in topic order per rollout (a rollout's records share one partition)."""
    out: dict[str, list[bytes]] = {}
    for rec in records:
        out.setdefault(rec.key.decode(), []).append(rec.value)
    return out


def assert_same_snapshots(emitted: dict[str, list[bytes]], work: Workload) -> None:
    """Byte for byte: the same distinct snapshots per rollout as the clean run, and the same last one."""
    assert sorted(emitted) == sorted(work.expected_distinct), "snapshots for other rollouts than expected"
    for rid, expected in work.expected_distinct.items():
        got = emitted[rid]
        assert set(got) == set(expected), f"{rid}: {len(set(got))} distinct snapshots, expected {len(expected)}"
        assert got[-1] == expected[-1], f"{rid}: the last snapshot differs from the clean run's"


def describe_missing(records: list[Record], work: Workload, limit: int = 12) -> str:
    """For each rollout whose last snapshot is missing: (version, calls, markers) expected and emitted."""
    from schemas.codec import decode_snapshot

    def brief(data: bytes) -> tuple:
        s = decode_snapshot(data)
        return s.version, len(s.calls), len(s.incomplete_markers)

    got = emitted_by_rollout(records)
    seen = {r.value for r in records}
    lines = []
    for rid, last in work.expected_last.items():
        if last not in seen:
            lines.append(f"{rid}: expected {[brief(d) for d in work.expected_distinct[rid]]}, "
                         f"emitted {[brief(d) for d in got.get(rid, [])]}")
    if not lines:
        return "nothing missing"
    if len(lines) > limit:
        lines[limit:] = [f"... and {len(lines) - limit} more rollouts"]
    return f"{len(work.expected_last)} rollouts, last snapshot missing for:\n" + "\n".join(lines)


def log_report(text: str, events: int = 80, stacks: int = 6000) -> str:
    """A worker log, compacted for a failure message: its last log events, then the tail (task stacks)."""
    logged = [line[:300] for line in text.splitlines()
              if line.startswith("[20") and "dead letter" not in line and "Stack for" not in line]
    return "\n".join(logged[-events:]) + "\n... tail:\n" + text[-stacks:]


def all_last_seen(work: Workload) -> Callable[[list[Record]], bool]:
    wanted = set(work.expected_last.values())
    return lambda records: wanted <= {r.value for r in records}


def topic_config(bootstrap: str, topic: str) -> dict[str, str]:
    from confluent_kafka.admin import ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(timeout=10)
    return {name: entry.value for name, entry in entries.items()}


def topic_names_for(prefix: str) -> TopicNames:
    from schemas.kafka.topics import topic_names

    return topic_names(prefix)
