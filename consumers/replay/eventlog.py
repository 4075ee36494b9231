"""Read one rollout's events back from ``tokentrail.rollout-events`` (the replayable log).

Every event of a rollout is keyed by its UTF-8 id and lands on one partition,
chosen by Kafka's murmur2 partitioner (``schemas.topics``), in the order the
producer's acknowledgements fixed. ``EventLog.rollout_events`` computes that
partition, assigns it (no consumer group, nothing committed), reads from the
beginning, an offset or a time up to the high watermark taken when the call
starts, and yields the rollout's records one at a time: memory stays bounded
by one fetch whatever the partition holds. Records of other rollouts are
skipped by comparing keys, before anything is decoded.

Feeding the yielded events to the pure fold (``processors.fold``) reproduces
the live processor's state and snapshots exactly (the fold is deterministic):
the Gym source adapter and replay/diagnosis build on that.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import confluent_kafka

from schemas.codec import decode_event
from schemas.errors import TransportError
from schemas.records import RolloutEvent
from schemas.topics import MAX_MESSAGE_BYTES, ROLLOUT_EVENTS, key_for

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (Java ``Utils.murmur2``, librdkafka ``murmur2_random``), as an unsigned 32-bit value."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = ((h * _M) & _MASK32) ^ k
    extra = length % 4
    if extra == 3:
        h ^= data[whole + 2] << 16
    if extra >= 2:
        h ^= data[whole + 1] << 8
    if extra >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition a keyed record lands on (Java's ``toPositive(murmur2(key)) % partitions``)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """One record of a rollout as it sits in the log (undecoded until asked)."""

    partition: int
    offset: int
    timestamp_ms: int
    value: bytes
    key: bytes | None = None

    def decode(self) -> RolloutEvent:
        return decode_event(self.value)


class EventLog:
    """Reads rollouts' events from the rollout-events topic; one instance per thread."""

    def __init__(self, bootstrap: str, topic: str = ROLLOUT_EVENTS, *, timeout_s: float = 30.0,
                 config: dict[str, Any] | None = None) -> None:
        self.topic = topic
        self.timeout_s = timeout_s
        self._partitions: int | None = None
        try:
            self._consumer = confluent_kafka.Consumer({
                "bootstrap.servers": bootstrap,
                "group.id": f"tokentrail-eventlog-{uuid.uuid4().hex}",  # never joined: partitions are assigned
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "fetch.wait.max.ms": 20,  # a reader waits for the log end, not for more data
                "fetch.message.max.bytes": MAX_MESSAGE_BYTES,
                "max.partition.fetch.bytes": MAX_MESSAGE_BYTES,
                "isolation.level": "read_committed",
                **(config or {}),
            })
        except confluent_kafka.KafkaException as exc:
            raise TransportError(f"cannot create a Kafka consumer for {bootstrap}: {exc}") from exc

    def partitions(self) -> int:
        """The topic's partition count (read once)."""
        if self._partitions is None:
            try:
                meta = self._consumer.list_topics(self.topic, timeout=self.timeout_s)
            except confluent_kafka.KafkaException as exc:
                raise TransportError(f"cannot read metadata of {self.topic}: {exc}") from exc
            topic = meta.topics.get(self.topic)
            if topic is None or topic.error is not None or not topic.partitions:
                raise TransportError(f"topic {self.topic} does not exist or has no partitions "
                                     f"({topic.error if topic is not None else 'missing'}); create it with `tokentrail topics`")
            self._partitions = len(topic.partitions)
        return self._partitions

    def partition_of(self, rollout_id: str) -> int:
        return partition_for(key_for(rollout_id), self.partitions())

    def rollout_events(self, rollout_id: str, *, from_offset: int | None = None,
                       from_time_ms: int | None = None) -> Iterator[LoggedEvent]:
        """The rollout's records in log order, from the beginning (default), an offset or a time.

        Stops at the high watermark read when the call starts, so it ends even
        while producers keep writing; anything acknowledged before the call is
        included.
        """
        yield from self._scan(self.partition_of(rollout_id), key_for(rollout_id), from_offset, from_time_ms)

    def partition_events(self, partition: int, *, from_time_ms: int | None = None) -> Iterator[LoggedEvent]:
        """Every record of one partition (all rollouts), from a time (or the beginning) to the high watermark."""
        yield from self._scan(partition, None, None, from_time_ms)

    def _scan(self, partition: int, key: bytes | None, from_offset: int | None,
              from_time_ms: int | None) -> Iterator[LoggedEvent]:
        """Records of ``partition`` (only ``key``'s, when given) from the later of the offset and the time."""
        tp = confluent_kafka.TopicPartition(self.topic, partition)
        try:
            low, high = self._consumer.get_watermark_offsets(tp, timeout=self.timeout_s, cached=False)
            start = low if from_offset is None else max(low, from_offset)
            if from_time_ms is not None and from_time_ms > 0:
                # Kafka reads timestamps -1 / -2 as "latest" / "earliest": a bound at or before the epoch
                # means "from the beginning" and is not sent. A time after the last record finds -1: none.
                (found,) = self._consumer.offsets_for_times(
                    [confluent_kafka.TopicPartition(self.topic, partition, from_time_ms)], timeout=self.timeout_s)
                start = max(start, found.offset if found.offset >= 0 else high)
        except confluent_kafka.KafkaException as exc:
            raise TransportError(f"cannot read offsets of {self.topic}[{partition}]: {exc}") from exc
        if start >= high:
            return
        self._consumer.assign([confluent_kafka.TopicPartition(self.topic, partition, start)])
        try:
            yield from self._read(key, partition, high)
        finally:
            self._consumer.unassign()

    def _read(self, key: bytes | None, partition: int, high: int) -> Iterator[LoggedEvent]:
        # poll, not consume(n, timeout): consume waits out its timeout unless n records arrive.
        deadline = time.monotonic() + self.timeout_s
        while True:
            msg = self._consumer.poll(0.5)
            if msg is None:
                if time.monotonic() > deadline:
                    raise TransportError(f"no records from {self.topic}[{partition}] for {self.timeout_s:.0f} s "
                                         f"before offset {high}")
                continue
            deadline = time.monotonic() + self.timeout_s
            err = msg.error()
            if err is not None:
                if err.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    return
                raise TransportError(f"reading {self.topic}[{partition}]: {err}")
            if key is None or msg.key() == key:
                yield LoggedEvent(partition, msg.offset(), msg.timestamp()[1], msg.value(), msg.key())
            if msg.offset() >= high - 1:
                return

    def close(self) -> None:
        self._consumer.close()
