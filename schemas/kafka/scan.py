"""Read a range of one topic partition, from an offset or a time, up to its end (the topic scan by time).

``TopicReader`` is a consumer that is never a group member: it assigns the
partition it reads, commits nothing, and reads from the later of a start
offset and the first record at or after a time (Kafka's offsets-for-times) up
to the high watermark taken when the read starts, so a read ends even while
producers keep writing, and includes everything acknowledged before it began.
Records are yielded one at a time: memory stays bounded by one fetch whatever
the partition holds; with ``key``, records of other keys are skipped before
anything is decoded. Every client error is a ``TransportError`` naming the
topic and partition. Used by the interceptor's presence check
(``producers.capture.durable``) and by replay and the Gym adapters
(``consumers.replay.eventlog``).

``open_from_start`` assigns every partition of a small topic from its start (the policy versions and
their reports: ``schemas.kafka.versions``, ``schemas.kafka.announce``); ``watermarks`` asks a
partition's offsets, waiting out a leader not elected yet.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import confluent_kafka

from schemas.errors import TransportError
from schemas.kafka.config import QUIET_LOGGER, consumer_config
from schemas.kafka.security import KafkaSecurity

__all__ = ["TopicReader", "open_from_start", "watermarks"]


class TopicReader:
    """Reads partition ranges of any topic on ``bootstrap``; one instance per thread."""

    def __init__(self, bootstrap: str, *, timeout_s: float = 30.0, config: Mapping[str, Any] | None = None,
                 security: KafkaSecurity | None = None) -> None:
        self.timeout_s = timeout_s
        settings = consumer_config(
            bootstrap, f"tokentrail-reader-{uuid.uuid4().hex}",  # never joined: partitions are assigned
            partition_eof=True, security=security,
            extra={"fetch.wait.max.ms": 20, **(config or {})},  # a reader waits for the log end, not for more data
        )
        try:
            self._consumer = confluent_kafka.Consumer(settings)
        except confluent_kafka.KafkaException as exc:
            raise TransportError(f"cannot create a Kafka consumer for {bootstrap}: {exc}") from exc

    def partitions(self, topic: str) -> int:
        """The partition count of ``topic``; TransportError if it does not exist."""
        try:
            meta = self._consumer.list_topics(topic, timeout=self.timeout_s)
        except confluent_kafka.KafkaException as exc:
            raise TransportError(f"cannot read metadata of {topic}: {exc}") from exc
        found = meta.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            raise TransportError(f"topic {topic} does not exist or has no partitions "
                                 f"({found.error if found is not None else 'missing'}); "
                                 "create it with `tokentrail topics`")
        return len(found.partitions)

    def read(self, topic: str, partition: int, *, from_offset: int | None = None,
             from_time_ms: int | None = None, key: bytes | None = None) -> Iterator[Any]:
        """The records (confluent-kafka ``Message``) of ``topic[partition]`` from the later of
        ``from_offset`` and ``from_time_ms`` (default: the beginning) to the high watermark."""
        start, high = self._range(topic, partition, from_offset, from_time_ms)
        if start >= high:
            return
        self._consumer.assign([confluent_kafka.TopicPartition(topic, partition, start)])
        try:
            yield from self._read(topic, partition, high, key)
        finally:
            self._consumer.unassign()

    def read_topic(self, topic: str, *, from_time_ms: int | None = None) -> Iterator[Any]:
        """Every record of every partition of ``topic`` written at or after ``from_time_ms``, partition by partition."""
        for partition in range(self.partitions(topic)):
            yield from self.read(topic, partition, from_time_ms=from_time_ms)

    def close(self) -> None:
        self._consumer.close()

    def _range(self, topic: str, partition: int, from_offset: int | None,
               from_time_ms: int | None) -> tuple[int, int]:
        tp = confluent_kafka.TopicPartition(topic, partition)
        try:
            low, high = self._consumer.get_watermark_offsets(tp, timeout=self.timeout_s, cached=False)
            start = low if from_offset is None else max(low, from_offset)
            if from_time_ms is not None and from_time_ms > 0:
                # Kafka reads timestamps -1 / -2 as "latest" / "earliest": a bound at or before the epoch
                # means "from the beginning" and is not sent. A time after the last record finds -1: none.
                (found,) = self._consumer.offsets_for_times(
                    [confluent_kafka.TopicPartition(topic, partition, from_time_ms)], timeout=self.timeout_s)
                start = max(start, found.offset if found.offset >= 0 else high)
        except confluent_kafka.KafkaException as exc:
            raise TransportError(f"cannot read offsets of {topic}[{partition}]: {exc}") from exc
        return start, high

    def _read(self, topic: str, partition: int, high: int, key: bytes | None) -> Iterator[Any]:
        # poll, not consume(n, timeout): consume waits out its timeout unless n records arrive.
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                msg = self._consumer.poll(0.5)
            except confluent_kafka.KafkaException as exc:
                raise TransportError(f"reading {topic}[{partition}]: {exc}") from exc
            if msg is None:
                if time.monotonic() > deadline:
                    raise TransportError(f"no records from {topic}[{partition}] for {self.timeout_s:.0f} s "
                                         f"before offset {high}")
                continue
            deadline = time.monotonic() + self.timeout_s
            err = msg.error()
            if err is not None:
                if err.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    return
                raise TransportError(f"reading {topic}[{partition}]: {err}")
            if key is None or msg.key() == key:
                yield msg
            offset = msg.offset()
            assert offset is not None  # a record (not an error event) always has its offset
            if offset >= high - 1:
                return


def open_from_start(bootstrap: str, topic: str, group: str, *,
                     security: KafkaSecurity | None = None) -> tuple[Any, dict[int, int]]:
    """A consumer assigned every partition of ``topic`` from its start, and each non-empty partition's end offset."""
    config = consumer_config(bootstrap, group, security=security,
                             extra={"logger": QUIET_LOGGER, "allow.auto.create.topics": False})
    try:
        consumer = confluent_kafka.Consumer(config)
    except confluent_kafka.KafkaException as exc:
        raise TransportError(f"cannot read {topic} at {bootstrap}: {exc}") from exc
    try:
        metadata = consumer.list_topics(topic, timeout=10)  # a consumer never auto-creates it
    except confluent_kafka.KafkaException as exc:
        consumer.close()
        raise TransportError(f"cannot read {topic} at {bootstrap}: {exc}; check the bootstrap "
                             "and that the broker is up") from exc
    info = metadata.topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        consumer.close()
        raise TransportError(f"topic {topic} does not exist at {bootstrap}: create it with `tokentrail topics`")
    parts = [confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in sorted(info.partitions)]
    ends: dict[int, int] = {}
    try:
        for tp in parts:
            low, high = watermarks(consumer, tp, deadline=time.monotonic() + 30.0)
            if high > low:
                ends[tp.partition] = high
    except confluent_kafka.KafkaException as exc:
        consumer.close()
        raise TransportError(f"cannot read the end offsets of {topic} at {bootstrap}: {exc}") from exc
    consumer.assign(parts)
    return consumer, ends


def watermarks(consumer: Any, tp: Any, *, deadline: float) -> tuple[int, int]:
    """``get_watermark_offsets``, retried while the broker reports a retriable error.

    Why: right after the topic is created its leader may not be elected yet, and the broker answers
    NOT_LEADER_FOR_PARTITION / LEADER_NOT_AVAILABLE for a moment (seen in CI); and a loaded broker's
    metadata can leave a partition out of the client's cache for a moment, which the client reports as
    its local _UNKNOWN_PARTITION (seen in CI: an announcement failed on it, and a follower's lease check).
    The client does not look again by itself (its next metadata refresh can be minutes away; in CI the
    partition stayed unknown through 10 s of retries), so a partition or topic it does not know is looked
    up (a metadata request for the topic) before the next try.
    Only a non-retriable error, or one that outlasts ``deadline``, is raised.
    """
    unknown = (confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART, confluent_kafka.KafkaError._UNKNOWN_PARTITION)
    while True:
        try:
            offsets: tuple[int, int] = consumer.get_watermark_offsets(tp, timeout=10)
            return offsets
        except confluent_kafka.KafkaException as exc:
            error = exc.args[0] if exc.args else None
            retriable = getattr(error, "retriable", lambda: False)() or getattr(error, "code", lambda: None)() in (
                confluent_kafka.KafkaError.NOT_LEADER_FOR_PARTITION, confluent_kafka.KafkaError.LEADER_NOT_AVAILABLE,
                confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART, confluent_kafka.KafkaError._UNKNOWN_PARTITION)
            if not retriable or time.monotonic() >= deadline:
                raise
            time.sleep(0.2)
            if getattr(error, "code", lambda: None)() in unknown:
                try:  # refreshes the client's metadata for the topic
                    consumer.list_topics(tp.topic, timeout=max(0.5, min(5.0, deadline - time.monotonic())))
                except confluent_kafka.KafkaException:
                    pass  # the next try says whether it helped
