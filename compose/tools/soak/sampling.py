"""What a soak samples every minute: each process's memory, descriptors and threads, the consumer's lag,
the processor's live state, and the latency of the calls answered since the last sample.

- Processes: ``/proc/<pid>`` of every service of the stack and of the broker (RSS, open file
  descriptors, threads). A restarted service is sampled under its new pid; the row says how
  many times each service started.
- Consumer lag: the snapshots topic's end offsets minus the consumer group's committed ones.
- Processor state: the live keys of its changelog topic (Faust's ``<app id>-rollout-state-changelog``,
  compacted), folded from its start by one standing consumer: key -> the size of its latest value,
  a tombstone removes it. That is the state the processor would recover, independent of how
  RocksDB lays it out on disk or when it compacts. A retired rollout's header (``retired``, kept so
  late writers are dead-lettered) is counted apart from the live state.
- Latency: p50 / p99 of the calls answered in the window (the workload records each answered
  attempt's duration, ``compose.tools.chaos.workload.Progress.calls``).
"""

from __future__ import annotations

import math
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka

from processors.state import decode_header, header_key
from schemas.kafka.config import QUIET_LOGGER, consumer_config
from schemas.kafka.scan import open_from_start, watermarks

HEADER_PREFIX = header_key("")  # every rollout header's key starts so (processors.state)

__all__ = ["ChangelogState", "ProcessStats", "Sample", "consumer_lag", "percentile", "process_stats"]


@dataclass(frozen=True, slots=True)
class ProcessStats:
    pid: int
    rss_kib: int
    fds: int
    threads: int


@dataclass(slots=True)
class Sample:
    """One minute of the soak: per process stats, lag, state, latency, and the rollouts so far."""

    at_s: float  # seconds since the soak's start
    processes: dict[str, ProcessStats] = field(default_factory=dict)
    lag: int = 0
    state_keys: int = 0
    state_bytes: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    calls: int = 0  # answered in the window
    rollouts: int = 0  # delivered so far (all waves)


def process_stats(pid: int) -> ProcessStats | None:
    """RSS, open descriptors and threads of ``pid`` from /proc; None if it is gone (mid-restart)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return ProcessStats(pid=pid, rss_kib=int(fields["VmRSS"].split()[0]), fds=fds, threads=int(fields["Threads"]))


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank; 0.0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


def consumer_lag(bootstrap: str, group_id: str, topic: str) -> int:
    """Records on ``topic`` the group has not committed yet (a partition never committed counts from its start)."""
    consumer = confluent_kafka.Consumer(consumer_config(bootstrap, f"{group_id}", extra={"logger": QUIET_LOGGER}))
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        committed = consumer.committed([confluent_kafka.TopicPartition(topic, p) for p in partitions], timeout=10)
        lag = 0
        for tp in committed:
            low, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
            lag += high - (tp.offset if tp.offset >= 0 else low)
        return lag
    finally:
        consumer.close()


class ChangelogState:
    """The processor's live state from its changelog: keys and bytes of what recovery would restore."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self._consumer: Any = None
        self._sizes: dict[tuple[int, bytes], int] = {}
        self._retired: set[tuple[int, bytes]] = set()  # keys holding a retired rollout's header
        self._next: dict[int, int] = {}

    def read_split(self, timeout_s: float = 30.0) -> tuple[tuple[int, int], tuple[int, int]]:
        """Read the changelog up to its end as of now; ((live keys, bytes), (retired headers, bytes))."""
        self._read(timeout_s)
        tomb = sum(self._sizes[k] for k in self._retired)
        return (len(self._sizes) - len(self._retired), sum(self._sizes.values()) - tomb), (len(self._retired), tomb)

    def _read(self, timeout_s: float) -> None:
        if self._consumer is None:
            self._consumer, _ = open_from_start(self.bootstrap, self.topic, f"tokentrail-soak-{uuid.uuid4().hex[:8]}")
            self._next = {tp.partition: 0 for tp in self._consumer.assignment()}
        ends = {}
        deadline = time.monotonic() + timeout_s
        for partition, position in self._next.items():
            low, high = watermarks(self._consumer, confluent_kafka.TopicPartition(self.topic, partition),
                                   deadline=deadline)
            if high > max(position, low):
                ends[partition] = high
        while ends and time.monotonic() < deadline:
            msg = self._consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            p = msg.partition()
            self._next[p] = msg.offset() + 1
            key = (p, msg.key() or b"")
            self._retired.discard(key)
            if msg.value() is None:
                self._sizes.pop(key, None)
            else:
                self._sizes[key] = len(key[1]) + len(msg.value())
                if key[1].startswith(HEADER_PREFIX) and decode_header(msg.value()).retired:
                    self._retired.add(key)
            if p in ends and msg.offset() + 1 >= ends[p]:
                del ends[p]

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
