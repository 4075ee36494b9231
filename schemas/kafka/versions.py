"""The policy-versions topic on Kafka: announce a version, follow the announcements.

``announce_version`` publishes one ``PolicyVersion`` (Avro, keyed by its label) with ``acks=all``
and returns once the broker acknowledged it. Labelling the engine itself is the caller's (``tokentrail
versions announce --engine`` does it first, so the topic never names a version the engine refused). It
never creates the topic: a missing one is an ``AnnounceFailed`` naming `tokentrail topics` (an
auto-created topic would be neither compacted nor single-partition). Every failure is an
``AnnounceFailed`` (a ``TransportError``) naming the broker and topic.

``VersionFollower`` reads the topic from its start in a background thread, without a consumer
group (nothing is committed: every follower folds the whole compacted topic), into a
``VersionBook`` and calls ``on_change`` callbacks, from its thread, when the current version
changes. A record it cannot decode (or a tombstone) is logged and skipped: the follower never
stops on content. ``wait_caught_up`` returns once everything published before ``start`` was read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import confluent_kafka

from schemas.codec import policy_version_codec
from schemas.errors import TransportError
from schemas.kafka.bridge import AckedProducer, PublishFailed, admin_client
from schemas.kafka.config import QUIET_LOGGER, consumer_config, producer_config
from schemas.kafka.topics import POLICY_VERSIONS, TopicsUnavailable, topic_names, wait_for_topics
from schemas.policy_versions import PolicyVersion, VersionBook

__all__ = ["AnnounceFailed", "VersionFollower", "announce_version"]

log = logging.getLogger("tokentrail.versions")


class AnnounceFailed(TransportError):
    """The broker did not acknowledge the announcement (or the topic is missing)."""


def announce_version(bootstrap: str, label: str, step: int, *, topic: str = POLICY_VERSIONS, weights: str = "",
                     timeout_s: float = 30.0) -> PolicyVersion:
    """Publish ``label`` as the current version (the trainer's ``step``).

    ``ContractError`` (before any I/O) for an invalid label or step; ``AnnounceFailed`` unless the
    broker acknowledged the record.
    """
    announcement = PolicyVersion(label=label, step=step, announced_at=time.time(), weights=weights)
    value = policy_version_codec().encode(announcement)
    where = f"announcing policy version {label!r} (step {step}) on {topic} at {bootstrap}"
    try:
        # The metadata of all topics never auto-creates one (a metadata request for `topic` would).
        wait_for_topics(admin_client(bootstrap), [topic], bootstrap=bootstrap, names=_names_of(topic),
                        timeout=min(timeout_s, 10.0))
    except (TopicsUnavailable, TransportError) as exc:
        raise AnnounceFailed(f"{where} failed: {exc}") from exc
    # Belt and braces: a topic deleted after the check is not re-created with the broker's defaults.
    config = producer_config(bootstrap, extra={"logger": QUIET_LOGGER, "allow.auto.create.topics": False})
    producer = AckedProducer(config, name="tokentrail-versions")
    try:
        producer.produce_sync(topic, label.encode("utf-8"), value, timeout_s=timeout_s)
    except PublishFailed as exc:
        raise AnnounceFailed(f"{where} failed: {exc}; check the broker and that the topic exists "
                             "(`tokentrail topics`)") from exc
    finally:
        producer.close_sync(5.0)
    return announcement


def _watermarks(consumer: Any, tp: Any, *, deadline: float) -> tuple[int, int]:
    """``get_watermark_offsets``, retried while the broker reports a retriable error.

    Why: right after the topic is created its leader may not be elected yet, and the broker answers
    NOT_LEADER_FOR_PARTITION / LEADER_NOT_AVAILABLE for a moment (seen in CI); only a non-retriable
    error, or one that outlasts ``deadline``, is raised.
    """
    while True:
        try:
            offsets: tuple[int, int] = consumer.get_watermark_offsets(tp, timeout=10)
            return offsets
        except confluent_kafka.KafkaException as exc:
            error = exc.args[0] if exc.args else None
            retriable = getattr(error, "retriable", lambda: False)() or getattr(error, "code", lambda: None)() in (
                confluent_kafka.KafkaError.NOT_LEADER_FOR_PARTITION, confluent_kafka.KafkaError.LEADER_NOT_AVAILABLE,
                confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART)
            if not retriable or time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def _names_of(topic: str) -> Any:
    # For the missing-topic message: the `tokentrail topics` command for this topic's prefix.
    return topic_names(topic.removesuffix(POLICY_VERSIONS)) if topic.endswith(POLICY_VERSIONS) else topic_names()


class VersionFollower:
    """The policy-versions topic folded into ``book``, kept current by a background thread."""

    def __init__(self, bootstrap: str, topic: str = POLICY_VERSIONS, *,
                 on_change: Callable[[PolicyVersion], object] | None = None, poll_s: float = 0.2) -> None:
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

    def on_change(self, callback: Callable[[PolicyVersion], object]) -> None:
        self._callbacks.append(callback)

    def start(self) -> VersionFollower:
        """Assign every partition from its start and begin following; TransportError if the topic is unknown."""
        config = consumer_config(self.bootstrap, "tokentrail-versions-follower",
                                 extra={"logger": QUIET_LOGGER, "allow.auto.create.topics": False})
        try:
            consumer = confluent_kafka.Consumer(config)
        except confluent_kafka.KafkaException as exc:
            raise TransportError(f"cannot read {self.topic} at {self.bootstrap}: {exc}") from exc
        try:
            metadata = consumer.list_topics(self.topic, timeout=10)  # a consumer never auto-creates it
        except confluent_kafka.KafkaException as exc:
            consumer.close()
            raise TransportError(f"cannot read {self.topic} at {self.bootstrap}: {exc}; check the bootstrap "
                                 "and that the broker is up") from exc
        info = metadata.topics.get(self.topic)
        if info is None or info.error is not None or not info.partitions:
            consumer.close()
            raise TransportError(f"topic {self.topic} does not exist at {self.bootstrap}: create it with "
                                 "`tokentrail topics`")
        parts = [confluent_kafka.TopicPartition(self.topic, p, confluent_kafka.OFFSET_BEGINNING)
                 for p in sorted(info.partitions)]
        try:
            for tp in parts:
                low, high = _watermarks(consumer, tp, deadline=time.monotonic() + 30.0)
                if high > low:
                    self._ends[tp.partition] = high
        except confluent_kafka.KafkaException as exc:
            consumer.close()
            raise TransportError(f"cannot read the end offsets of {self.topic} at {self.bootstrap}: {exc}") from exc
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
            if msg.value() is None:  # a tombstone (a label deleted by hand): nothing to fold
                continue
            try:
                announcement = codec.decode(msg.value())
            except Exception as exc:  # CodecError, ContractError, or worse: content never stops the follower
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
