"""One real fold worker under ``tokentrail bench fold``: its rate, CPU, state and (optionally) its profile.

A private helper of ``compose.tools.bench.fold`` (the leading underscore keeps it
out of the ``tokentrail bench`` list).

``run_worker`` publishes the records, starts one ``tokentrail process`` worker
(Faust, RocksDB through rocksdict, its changelog) and reads its snapshots and
changelog back:

- rate: the events over the span between the Kafka timestamps of the first
  changelog record and the last changelog or snapshot record (start-up and
  group join are left out);
- CPU: the worker's own CPU seconds (``/proc/<pid>/stat``) between its first
  and its last snapshot, over the events folded in between (known from the
  workload: a rollout's snapshot follows its finish event), and how busy the
  whole machine was meanwhile (other processes included): the figure that
  says how loaded the run was;
- state: changelog bytes (one record per table write), and the worker's
  RocksDB directory on disk after its clean stop;
- ``profile``: a py-spy ``raw`` profile of the worker between its first and
  last snapshot (so start-up is left out), summarised by ``top_frames``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from compose.tools.bench._measure import cpu_seconds, machine_busy
from compose.tools.bench._pyspy import PySpy
from schemas.kafka.security import KafkaSecurity


@dataclass(frozen=True)
class WorkerRun:
    events_s: float
    seconds: float
    state_bytes: int  # changelog key + value bytes
    snapshots: int
    cpu_per_event_s: float  # the worker's CPU between its first and last snapshot, per event folded
    machine_busy: float  # every CPU of the machine over that span, 0..1
    disk_bytes: int  # the worker's data dir (RocksDB SST + WAL) after its clean stop


def run_worker(records: list[tuple[bytes, bytes]], finishes: dict[bytes, int], bootstrap: str, run_dir: Path,
               profile: Path | None = None, kafka_config: str | Path | None = None) -> WorkerRun:
    """Publish ``records``, let one worker fold them, read its changelog and snapshots back.

    ``finishes``: rollout key → index in ``records`` of its finish event (what its snapshot says was folded).
    ``kafka_config``: the client config file of a secured ``bootstrap``: every client here and the worker use it.
    """
    import confluent_kafka

    from schemas.kafka.admin import ensure_topics, produce_all
    from schemas.kafka.config import producer_config
    from schemas.kafka.security import ENV_VAR, load_kafka_config
    from schemas.kafka.topics import topic_names

    tag = uuid.uuid4().hex[:8]
    prefix, app_id = f"benchfold{tag}.", f"benchfold-{tag}"
    names = topic_names(prefix)
    config_path = None if kafka_config is None else Path(kafka_config).resolve()
    security = None if config_path is None else load_kafka_config(config_path)
    ensure_topics(bootstrap, names, security=security)
    # The interceptor's producer settings (idempotent, acks=all, Java-compatible partitioner), batched.
    produce_all(confluent_kafka.Producer(producer_config(bootstrap, linger_ms=20, security=security)),
                names.rollout_events, records)
    log = run_dir / "worker.log"
    data_dir = run_dir / "worker"
    with open(log, "wb") as out:
        worker = subprocess.Popen([sys.executable, "-m", "compose.cli", "process", "--bootstrap", bootstrap,
                                   "--data-dir", str(data_dir), "--app-id", app_id, "--topic-prefix", prefix,
                                   *(("--kafka-config", str(config_path)) if config_path else ())],
                                  stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, ENV_VAR: str(config_path or "")})  # never an inherited one
    watch = _Watch(worker.pid, finishes, profile)
    try:
        snapshots = _drain(bootstrap, names.snapshots, until=len(finishes), worker=worker, log=log, watch=watch,
                           security=security)
    finally:
        watch.stop()
        worker.terminate()
        worker.wait(60)
    changelog = _drain(bootstrap, f"{app_id}-rollout-state-changelog", until=None, security=security)
    first, last = min(ts for ts, _, _ in changelog), max(ts for ts, _, _ in snapshots + changelog)
    return WorkerRun(events_s=len(records) / max((last - first) / 1000, 1e-3), seconds=(last - first) / 1000,
                     state_bytes=sum(size for _, _, size in changelog), snapshots=len(snapshots),
                     cpu_per_event_s=watch.cpu_per_event(), machine_busy=watch.busy(),
                     disk_bytes=sum(p.stat().st_size for p in data_dir.rglob("*") if p.is_file()))


class _Watch:
    """The worker's CPU and the machine's between its first and last snapshot; py-spy over the same span."""

    def __init__(self, pid: int, finishes: dict[bytes, int], profile: Path | None) -> None:
        self.pid, self.finishes, self.profile = pid, finishes, profile
        self.ticks = os.sysconf("SC_CLK_TCK")
        self.first: tuple[int, float, tuple[float, float]] | None = None  # (event index, worker CPU, machine)
        self.last: tuple[int, float, tuple[float, float]] | None = None
        self.spy = PySpy(pid, profile) if profile is not None else None
        self.spans: list[tuple[float, float]] = []  # (when this bench read a snapshot, when the worker wrote it)

    def snapshot(self, key: bytes, written_ms: int) -> None:
        mark = (self.finishes.get(key, 0), self._cpu(), machine_busy(Path("/proc/stat").read_text()))
        self.spans.append((time.monotonic(), written_ms / 1000))
        if self.first is None:
            self.first = mark
            if self.spy is not None:
                self.spy.start()
        else:
            self.last = mark

    def stop(self) -> None:
        if self.spy is not None:
            self.spy.stop()

    def _cpu(self) -> float:
        return cpu_seconds(Path(f"/proc/{self.pid}/stat").read_text(), self.ticks)

    def cpu_per_event(self) -> float:
        """NaN unless this bench read the snapshots as the worker wrote them: a reader that joined late reads
        them in one burst after the worker went idle, and its marks then span none of the worker's CPU."""
        if self.first is None or self.last is None or self.last[0] <= self.first[0] or not self._kept_up():
            return float("nan")
        return (self.last[1] - self.first[1]) / (self.last[0] - self.first[0])

    def _kept_up(self) -> bool:
        (read0, wrote0), (read1, wrote1) = self.spans[0], self.spans[-1]
        return read1 - read0 >= 0.5 * (wrote1 - wrote0)

    def busy(self) -> float:
        if self.first is None or self.last is None or not self._kept_up():
            return float("nan")
        (b0, t0), (b1, t1) = self.first[2], self.last[2]
        return (b1 - b0) / max(t1 - t0, 1)


def _drain(bootstrap: str, topic: str, until: int | None, worker: subprocess.Popen[bytes] | None = None,
           log: Path | None = None, watch: _Watch | None = None,
           timeout: float = 600.0, security: KafkaSecurity | None = None) -> list[tuple[int, bytes, int]]:
    """(timestamp ms, key, key + value bytes) of the topic's records: ``until`` of them, or all there are now."""
    import confluent_kafka

    from schemas.kafka.topics import MAX_MESSAGE_BYTES

    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                         "fetch.message.max.bytes": MAX_MESSAGE_BYTES,
                                         "max.partition.fetch.bytes": MAX_MESSAGE_BYTES,
                                         **(security.librdkafka() if security is not None else {})})
    # Assigned, not subscribed: a new group's join waits out the broker's initial rebalance delay (3 s), by
    # which time a fast worker has folded the whole workload, and _Watch's marks would then miss its CPU.
    partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    consumer.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in partitions])
    out: list[tuple[int, bytes, int]] = []
    deadline, idle_since = time.monotonic() + timeout, time.monotonic()
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                key = msg.key() or b""
                out.append((msg.timestamp()[1], key, len(key) + len(msg.value() or b"")))
                idle_since = time.monotonic()
                if watch is not None:
                    watch.snapshot(key, msg.timestamp()[1])
            if until is not None and len(out) >= until:
                return out
            if until is None and out and time.monotonic() - idle_since > 3:
                return out
            if worker is not None and worker.poll() is not None:
                raise RuntimeError(f"the worker exited with {worker.returncode}; see {log}")
        raise RuntimeError(f"timed out reading {topic} ({len(out)} records)")
    finally:
        consumer.close()
