"""The policy-versions topic on Kafka: follow the announcements (announcing them: ``schemas.kafka.announce``).

``VersionFollower`` reads the topic from its start in a background thread, without a consumer
group (nothing is committed: every follower folds the whole compacted topic), into a
``VersionBook`` and calls ``on_change`` callbacks, from its thread, when the current version
changes. A record it cannot decode (or a tombstone) is logged and skipped: the follower never
stops on content. ``wait_caught_up`` returns once everything published before ``start`` was read.
With ``report_as`` (an interceptor's instance id) it also publishes that instance's reports: the
owner calls ``applied(step, label)`` once its clock applied a version (a report goes out at once)
and the follower repeats the last one every ``heartbeat_s``; after a report was acknowledged and
the topic then read to its end it calls ``on_fresh(until)`` (``time.monotonic()`` seconds up to
which the owner may trust its label). ``close`` publishes the instance's tombstone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import confluent_kafka

from schemas.codec import policy_version_codec
from schemas.kafka.config import QUIET_LOGGER, producer_config
from schemas.kafka.scan import open_from_start, watermarks
from schemas.kafka.security import KafkaSecurity
from schemas.kafka.topics import POLICY_VERSIONS, applied_topic_of
from schemas.policy_versions import PolicyVersion, VersionBook
from schemas.version_reports import (
    DEFAULT_HEARTBEAT_S,
    DEFAULT_LEASE_S,
    AppliedReport,
    encode_report,
)

__all__ = ["VersionFollower"]

log = logging.getLogger("tokentrail.versions")


class VersionFollower:
    """The policy-versions topic folded into ``book``, kept current by a background thread."""

    def __init__(self, bootstrap: str, topic: str = POLICY_VERSIONS, *,
                 on_change: Callable[[PolicyVersion], object] | None = None, poll_s: float = 0.2,
                 report_as: str | None = None, on_fresh: Callable[[float], object] | None = None,
                 heartbeat_s: float = DEFAULT_HEARTBEAT_S, lease_s: float = DEFAULT_LEASE_S,
                 security: KafkaSecurity | None = None) -> None:
        self.bootstrap, self.topic, self.security = bootstrap, topic, security
        self.book = VersionBook()
        self.skipped = 0  # records that could not be decoded
        self._callbacks = [on_change] if on_change is not None else []
        self._poll_s = poll_s if report_as is None else min(poll_s, 0.05)
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._ends: dict[int, int] = {}
        self._thread: threading.Thread | None = None
        self._consumer: Any = None
        # Reports (schemas.version_reports): None until start() found the reports topic.
        self.report_as, self.reports_topic = report_as, applied_topic_of(topic)
        self._on_fresh, self._heartbeat_s, self._lease_s = on_fresh, heartbeat_s, lease_s
        self._producer: Any = None
        self._lock = threading.Lock()
        self._applied: tuple[int | None, str | None] = (None, None)
        self._next_report = 0.0
        self._acked: list[float] = []  # monotonic send times of acknowledged reports (delivery callbacks)
        self._check: tuple[float, dict[int, int]] | None = None  # (send time, versions topic end) to reach
        self._next: dict[int, int] = {}  # the next offset to read, per partition
        self._partitions: list[int] = []

    @property
    def reporting(self) -> bool:
        return self._producer is not None

    def on_change(self, callback: Callable[[PolicyVersion], object]) -> None:
        self._callbacks.append(callback)

    def start(self) -> VersionFollower:
        """Assign every partition from its start and begin following; TransportError if the topic is unknown.

        With ``report_as``, a missing reports topic is logged and the follower runs without reporting
        (``reporting`` False): an announcer waiting for confirmations fails naming `tokentrail topics`.
        """
        consumer, self._ends = open_from_start(self.bootstrap, self.topic, "tokentrail-versions-follower",
                                                security=self.security)
        self._consumer = consumer
        self._partitions = [tp.partition for tp in consumer.assignment()]
        if self.report_as is not None:
            self._start_reporting(consumer)
        if not self._ends:
            self._caught_up.set()
        self._thread = threading.Thread(target=self._run, name="tokentrail-versions", daemon=True)
        self._thread.start()
        return self

    def _start_reporting(self, consumer: Any) -> None:
        try:
            info = consumer.list_topics(self.reports_topic, timeout=10).topics.get(self.reports_topic)
        except confluent_kafka.KafkaException as exc:
            info, why = None, str(exc)
        else:
            why = "it does not exist"
        if info is None or info.error is not None or not info.partitions:
            log.warning("not reporting applied policy versions on %s (%s): announcements cannot wait for this "
                        "interceptor; create the topic with `tokentrail topics`", self.reports_topic, why)
            return
        self._producer = confluent_kafka.Producer(producer_config(
            self.bootstrap, linger_ms=0, security=self.security, extra={"logger": QUIET_LOGGER, "allow.auto.create.topics": False}))

    def applied(self, step: int | None, label: str | None) -> None:
        """The owner's clock applied ``step`` (``label``): report it now. Thread-safe, never blocks."""
        with self._lock:
            self._applied = (step, label)
        self._report()

    def wait_caught_up(self, timeout_s: float) -> bool:
        """True once every record published before ``start`` was read (False after ``timeout_s``)."""
        return self._caught_up.wait(timeout_s)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if self._producer is not None:  # a clean stop: announcers stop waiting for this instance
            try:
                self._producer.produce(self.reports_topic, key=str(self.report_as).encode("utf-8"), value=None)
                self._producer.flush(5)
            except Exception as exc:  # the broker is gone: the report ages out of the live set instead
                log.warning("could not withdraw %s from %s: %s", self.report_as, self.reports_topic, exc)
            self._producer = None
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _report(self) -> None:
        producer = self._producer
        if producer is None:
            return
        with self._lock:
            step, label = self._applied
            sent = time.monotonic()
            self._next_report = sent + self._heartbeat_s
        report = AppliedReport(instance=str(self.report_as), step=step, label=label, at=time.time(),
                               lease_s=self._lease_s)

        def delivered(err: Any, _msg: Any) -> None:
            if err is None:
                with self._lock:
                    self._acked.append(sent)
            else:
                log.warning("applied-version report to %s failed: %s", self.reports_topic, err)

        try:
            producer.produce(self.reports_topic, key=report.instance.encode("utf-8"), value=encode_report(report),
                             on_delivery=delivered)
        except (BufferError, confluent_kafka.KafkaException) as exc:
            log.warning("applied-version report to %s not sent: %s", self.reports_topic, exc)

    def _lease_step(self) -> None:
        """Heartbeat, then renew the owner's lease: an acknowledged report, then the topic read to its end."""
        producer = self._producer
        if producer is None:
            return
        producer.poll(0)  # delivery callbacks
        if time.monotonic() >= self._next_report:
            self._report()
        if self._check is None:
            with self._lock:
                sent = max(self._acked) if self._acked else None
                self._acked.clear()
            if sent is not None:
                # The end offsets read after the report was acknowledged: an announcement published
                # before then is below them, so the owner renews only once it applied it.
                ends = {}
                for p in self._partitions:
                    tp = confluent_kafka.TopicPartition(self.topic, p)
                    try:
                        ends[p] = watermarks(self._consumer, tp, deadline=time.monotonic() + 5.0)[1]
                    except confluent_kafka.KafkaException as exc:
                        log.warning("cannot read the end of %s: %s", self.topic, exc)
                        return
                self._check = (sent, ends)
        if self._check is not None:
            sent, ends = self._check
            if all(self._next.get(p, 0) >= end for p, end in ends.items()):
                self._check = None
                if self._on_fresh is not None:
                    try:
                        self._on_fresh(sent + self._lease_s)
                    except Exception:
                        log.exception("policy-versions lease subscriber failed")

    def _run(self) -> None:
        codec = policy_version_codec()
        while not self._stop.is_set():
            try:
                self._lease_step()
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
        self._next[partition] = offset + 1
        end = self._ends.get(partition)
        if end is not None and offset + 1 >= end:
            del self._ends[partition]
            if not self._ends:
                self._caught_up.set()
