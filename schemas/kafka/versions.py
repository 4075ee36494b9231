"""The policy-versions topic on Kafka: announce a version, follow the announcements.

``announce_version`` publishes one ``PolicyVersion`` (Avro, keyed by its label) with ``acks=all``
and returns once the broker acknowledged it. ``VersionFollower`` reads the topic from its start
in a background thread, without a consumer group (nothing is committed: every follower folds
the whole compacted topic), into a ``VersionBook`` and calls ``on_change`` callbacks, from its
thread, when the current version changes. A record it cannot decode is logged and skipped: the
follower never stops on content. ``wait_caught_up`` returns once everything published before it
started was read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import confluent_kafka

from schemas.codec import policy_version_codec
from schemas.errors import CodecError, ContractError, TransportError
from schemas.kafka.bridge import AckedProducer, PublishFailed
from schemas.kafka.config import QUIET_LOGGER, consumer_config, producer_config
from schemas.policy_versions import PolicyVersion, VersionBook
from schemas.topics import POLICY_VERSIONS

__all__ = ["VersionFollower", "announce_version"]

log = logging.getLogger("tokentrail.versions")


def announce_version(bootstrap: str, label: str, step: int, *, topic: str = POLICY_VERSIONS, weights: str = "",
                     timeout_s: float = 30.0) -> PolicyVersion:
    """Publish ``label`` as the current version (the trainer's ``step``); ``TransportError`` unless acked."""
    announcement = PolicyVersion(label=label, step=step, announced_at=time.time(), weights=weights)
    producer = AckedProducer(producer_config(bootstrap, extra={"logger": QUIET_LOGGER}),
                             name="tokentrail-versions")
    try:
        producer.produce_sync(topic, label.encode("utf-8"), policy_version_codec().encode(announcement),
                              timeout_s=timeout_s)
    except PublishFailed as exc:
        raise TransportError(f"announcing policy version {label!r} (step {step}) on {topic} at {bootstrap} "
                             f"failed: {exc}; check the broker and that the topic exists (`tokentrail topics`)") from exc
    finally:
        producer.close_sync(5.0)
    return announcement


class VersionFollower:
    """The policy-versions topic folded into ``book``, kept current by a background thread."""

    def __init__(self, bootstrap: str, topic: str = POLICY_VERSIONS, *,
                 on_change: Callable[[PolicyVersion], None] | None = None, poll_s: float = 0.2) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.book = VersionBook()
        self.skipped = 0  # records that could not be decoded
        self._callbacks = [on_change] if on_change is not None else []
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._ends: dict[int, int] = {}
        self._thread: threading.Thread | None = None
        self._consumer: Any = None

    def on_change(self, callback: Callable[[PolicyVersion], None]) -> None:
        self._callbacks.append(callback)

    def start(self) -> VersionFollower:
        """Assign every partition from its start and begin following; TransportError if the topic is unknown."""
        config = consumer_config(self.bootstrap, "tokentrail-versions-follower", extra={"logger": QUIET_LOGGER})
        try:
            consumer = confluent_kafka.Consumer(config)
            metadata = consumer.list_topics(self.topic, timeout=10)
        except confluent_kafka.KafkaException as exc:
            raise TransportError(f"cannot read {self.topic} at {self.bootstrap}: {exc}") from exc
        info = metadata.topics.get(self.topic)
        if info is None or info.error is not None or not info.partitions:
            consumer.close()
            raise TransportError(f"topic {self.topic} does not exist at {self.bootstrap}: create it with "
                                 "`tokentrail topics`")
        parts = [confluent_kafka.TopicPartition(self.topic, p, confluent_kafka.OFFSET_BEGINNING)
                 for p in sorted(info.partitions)]
        for tp in parts:
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            if high > low:
                self._ends[tp.partition] = high
        consumer.assign(parts)
        self._consumer = consumer
        if not self._ends:
            self._caught_up.set()
        self._thread = threading.Thread(target=self._run, name="tokentrail-versions", daemon=True)
        self._thread.start()
        return self

    def wait_caught_up(self, timeout_s: float) -> bool:
        """True once every record published before ``start`` was read (False after ``timeout_s``)."""
        return self._caught_up.wait(timeout_s)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _run(self) -> None:
        codec = policy_version_codec()
        while not self._stop.is_set():
            try:
                msg = self._consumer.poll(self._poll_s)
            except Exception as exc:  # the client closed under us, or a fatal error: keep what we have
                log.error("policy-versions follower stopped: %s", exc)
                return
            if msg is None:
                continue
            if msg.error() is not None:
                log.warning("policy-versions follower: %s", msg.error())
                continue
            self._note_position(msg.partition(), msg.offset())
            try:
                announcement = codec.decode(msg.value())
            except (CodecError, ContractError) as exc:
                self.skipped += 1
                log.warning("policy-versions record at offset %s skipped: %s", msg.offset(), exc)
                continue
            if self.book.apply(announcement):
                for callback in self._callbacks:
                    try:
                        callback(announcement)
                    except Exception:  # a subscriber's failure is its own
                        log.exception("policy-versions subscriber failed")

    def _note_position(self, partition: int, offset: int) -> None:
        end = self._ends.get(partition)
        if end is not None and offset + 1 >= end:
            del self._ends[partition]
            if not self._ends:
                self._caught_up.set()
