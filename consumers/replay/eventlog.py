"""Read one rollout's events back from ``tokentrail.rollout-events`` (the replayable log).

Every event of a rollout is keyed by its UTF-8 id and lands on one partition,
chosen by Kafka's murmur2 partitioner (``schemas.kafka.partitioning``), in the order the
producer's acknowledgements fixed. ``EventLog.rollout_events`` computes that
partition, assigns it (no consumer group, nothing committed), reads from the
beginning, an offset or a time up to the high watermark taken when the call
starts (``schemas.kafka.scan``), and yields the rollout's records one at a time: memory stays bounded
by one fetch whatever the partition holds. Records of other rollouts are
skipped by comparing keys, before anything is decoded.

Feeding the yielded events to the pure fold (``processors.fold``) reproduces
the live processor's state and snapshots exactly (the fold is deterministic):
the Gym source adapter and replay/diagnosis build on that.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from schemas.codec import decode_event
from schemas.kafka.partitioning import partition_for
from schemas.kafka.scan import TopicReader
from schemas.kafka.security import KafkaSecurity
from schemas.kafka.topics import ROLLOUT_EVENTS, key_for
from schemas.records import RolloutEvent


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
                 config: dict[str, Any] | None = None, security: KafkaSecurity | None = None) -> None:
        self.topic = topic
        self.timeout_s = timeout_s
        self._partitions: int | None = None
        self._reader = TopicReader(bootstrap, timeout_s=timeout_s, config=config, security=security)

    def partitions(self) -> int:
        """The topic's partition count (read once)."""
        if self._partitions is None:
            self._partitions = self._reader.partitions(self.topic)
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
        records = self._reader.read(self.topic, self.partition_of(rollout_id), key=key_for(rollout_id),
                                    from_offset=from_offset, from_time_ms=from_time_ms)
        yield from map(_logged, records)

    def partition_events(self, partition: int, *, from_time_ms: int | None = None) -> Iterator[LoggedEvent]:
        """Every record of one partition (all rollouts), from a time (or the beginning) to the high watermark."""
        yield from map(_logged, self._reader.read(self.topic, partition, from_time_ms=from_time_ms))

    def close(self) -> None:
        self._reader.close()


def _logged(msg: Any) -> LoggedEvent:
    return LoggedEvent(msg.partition(), msg.offset(), msg.timestamp()[1], msg.value(), msg.key())
