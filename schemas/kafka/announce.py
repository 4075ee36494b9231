"""Announce a policy version on Kafka and wait until every live interceptor applied it.

``VersionAnnouncer`` is a trainer's standing connection: its clients are made once (``open``: the topic
checked, one producer; the reports consumer on the first wait), so an announcement costs the record's
``acks=all`` and the interceptors' reports, not three clients' connections and metadata requests each
time. The one-shot ``announce_version`` and ``wait_applied`` make one and close it; on a CI host with
~350 topics one of twenty one-shot announcements once took 53 s in those requests (the engine stayed
paused meanwhile). A trainer announcing every step should hold one announcer.

``announce`` publishes one ``PolicyVersion`` (Avro, keyed by its label) and, by default, returns only
once every live interceptor reported it applied the version (``wait_applied``, over the
``tokentrail.policy-versions-applied`` topic; the protocol and why: ``schemas.version_reports``);
``NotConfirmed`` names each interceptor that did not in time. Labelling the engine itself is the
caller's (``tokentrail versions announce --engine`` does it first, so the topic never names a version
the engine refused). It never creates a topic: a missing one is an ``AnnounceFailed`` naming
`tokentrail topics` (an auto-created topic would be neither compacted nor single-partition). Every
failure is an ``AnnounceFailed`` (a ``TransportError``) naming the broker and topic.

Each wait reads the reports up to the topic's end as of the wait's start (one offsets request), then
settles who is live, exactly as a fresh reader from the start would: the announcer keeps every
instance's latest report between waits. Not thread-safe: one announcement at a time.
"""

from __future__ import annotations

import logging
import time
import uuid
from types import TracebackType
from typing import Any

import confluent_kafka

from schemas.codec import policy_version_codec
from schemas.errors import TransportError
from schemas.kafka.bridge import AckedProducer, PublishFailed, admin_client
from schemas.kafka.config import QUIET_LOGGER, producer_config
from schemas.kafka.scan import open_from_start, watermarks
from schemas.kafka.security import KafkaSecurity
from schemas.kafka.topics import POLICY_VERSIONS, TopicsUnavailable, applied_topic_of, topic_names, wait_for_topics
from schemas.policy_versions import PolicyVersion
from schemas.version_reports import DEFAULT_LEASE_S, DEFAULT_SKEW_S, AppliedReport, Confirmations, decode_report

__all__ = ["AnnounceFailed", "NotConfirmed", "VersionAnnouncer", "announce_version", "wait_applied"]

log = logging.getLogger("tokentrail.versions")


class AnnounceFailed(TransportError):
    """The announcement was not published, or its confirmations could not be read."""


class NotConfirmed(AnnounceFailed):
    """Published, but not every live interceptor confirmed it applied the version in time (``missing``)."""

    def __init__(self, message: str, missing: list[str]) -> None:
        super().__init__(message)
        self.missing = missing


class VersionAnnouncer:
    """Announcements on ``topic`` from one set of clients; a context manager (``open`` ... ``close``)."""

    def __init__(self, bootstrap: str, *, topic: str = POLICY_VERSIONS, timeout_s: float = 30.0,
                 min_followers: int = 0, skew_s: float = DEFAULT_SKEW_S,
                 security: KafkaSecurity | None = None) -> None:
        Confirmations(0, skew_s=skew_s, min_followers=min_followers)  # validated before any I/O
        self.bootstrap, self.topic, self.timeout_s, self.security = bootstrap, topic, timeout_s, security
        self.min_followers, self.skew_s = min_followers, skew_s
        self.reports_topic = applied_topic_of(topic)
        self._producer: AckedProducer | None = None
        self._consumer: Any = None
        self._next: dict[int, int] = {}  # the next report offset to read, per partition
        self._latest: dict[str, AppliedReport] = {}  # each instance's newest report read so far

    def open(self) -> VersionAnnouncer:
        """Check the topic exists (never creating it) and make the producer; ``AnnounceFailed`` if either fails."""
        try:
            # The metadata of all topics never auto-creates one (a metadata request for `topic` would).
            wait_for_topics(admin_client(self.bootstrap, security=self.security), [self.topic],
                            bootstrap=self.bootstrap, names=_names_of(self.topic), timeout=min(self.timeout_s, 10.0))
        except (TopicsUnavailable, TransportError) as exc:
            raise AnnounceFailed(f"announcing on {self.topic} at {self.bootstrap} failed: {exc}") from exc
        # Belt and braces: a topic deleted after the check is not re-created with the broker's defaults.
        config = producer_config(self.bootstrap, security=self.security,
                                 extra={"logger": QUIET_LOGGER, "allow.auto.create.topics": False})
        self._producer = AckedProducer(config, name="tokentrail-versions")
        return self

    def announce(self, label: str, step: int, *, weights: str = "", confirm: bool = True,
                 confirm_timeout_s: float = 30.0) -> PolicyVersion:
        """Publish ``label`` as the current version (the trainer's ``step``); with ``confirm``, wait until applied.

        ``ContractError`` (before any I/O) for an invalid label or step; ``AnnounceFailed`` unless the
        broker acknowledged the record; with ``confirm`` (the default), ``NotConfirmed`` unless every
        live interceptor (and at least ``min_followers``) reported within ``confirm_timeout_s`` that it
        applied ``step``. Resume the engine only after this returned.
        """
        Confirmations(step, skew_s=self.skew_s, min_followers=self.min_followers)  # validated before any I/O
        announcement = PolicyVersion(label=label, step=step, announced_at=time.time(), weights=weights)
        value = policy_version_codec().encode(announcement)
        if self._producer is None:
            self.open()
        assert self._producer is not None
        try:
            self._producer.produce_sync(self.topic, label.encode("utf-8"), value, timeout_s=self.timeout_s)
        except PublishFailed as exc:
            raise AnnounceFailed(f"announcing policy version {label!r} (step {step}) on {self.topic} at "
                                 f"{self.bootstrap} failed: {exc}; check the broker and that the topic exists "
                                 "(`tokentrail topics`)") from exc
        if confirm:
            self.wait_applied(label, step, timeout_s=confirm_timeout_s)
        return announcement

    def wait_applied(self, label: str, step: int, *, timeout_s: float = 30.0) -> list[str]:
        """Wait until every live interceptor following the topic reported it applied ``step``; their instance ids.

        ``NotConfirmed`` after ``timeout_s`` naming each live interceptor that did not confirm (a crashed
        one included: it is named, not waited out), or when fewer than ``min_followers`` confirmed;
        ``AnnounceFailed`` when the reports topic is missing or unreadable.
        """
        confirmations = Confirmations(step, skew_s=self.skew_s, min_followers=self.min_followers)
        where = f"policy version {label!r} (step {step}) was published on {self.topic} at {self.bootstrap}, but"
        started = time.monotonic()
        deadline = started + timeout_s
        try:
            ends = self._ends_to_read()
        except TransportError as exc:
            raise AnnounceFailed(f"{where} its confirmations cannot be read: {exc}; create the reports topic with "
                                 "`tokentrail topics` (or announce without waiting: --no-confirm, "
                                 "confirm=False)") from exc
        now = time.time()
        for report in self._latest.values():
            confirmations.note(report, now)
        if not ends:
            confirmations.settle(now)
        while not confirmations.done():
            left = deadline - time.monotonic()
            if left <= 0:
                missing = confirmations.missing()
                raise NotConfirmed(
                    f"{where} {confirmations.explain(time.time(), time.monotonic() - started)}. Tokens those "
                    "interceptors label may carry the old version: do not resume the engine until they confirm "
                    "(check their logs, /healthz and their access to the broker); a stopped one drops out of the "
                    f"live set {DEFAULT_LEASE_S + self.skew_s:.0f} s after its last report: announce again then",
                    missing)
            msg = self._consumer.poll(min(left, 0.05))
            if msg is None:
                continue
            if msg.error() is not None:
                log.warning("%s: %s", self.reports_topic, msg.error())
                continue
            self._next[msg.partition()] = msg.offset() + 1
            self._fold(msg, confirmations)
            end = ends.get(msg.partition())
            if end is not None and msg.offset() + 1 >= end:
                del ends[msg.partition()]
                if not ends:
                    confirmations.settle(time.time())
        return confirmations.confirmed()

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close_sync(5.0)
            self._producer = None
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def __enter__(self) -> VersionAnnouncer:
        return self.open()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _ends_to_read(self) -> dict[int, int]:
        """Per partition with reports not read yet, the end offset to read up to (the reports consumer, first made)."""
        if self._consumer is None:
            self._consumer, first = self._open()
            self._next = {tp.partition: 0 for tp in self._consumer.assignment()}
            return first
        ends: dict[int, int] = {}
        try:
            for partition, position in self._next.items():
                tp = confluent_kafka.TopicPartition(self.reports_topic, partition)
                low, high = watermarks(self._consumer, tp, deadline=time.monotonic() + 10.0)
                if high > max(position, low):  # records before `low` are gone (retention): none to wait for
                    ends[partition] = high
        except confluent_kafka.KafkaException as exc:
            return self._reopen(exc)
        return ends

    def _open(self) -> tuple[Any, dict[int, int]]:
        return open_from_start(self.bootstrap, self.reports_topic, f"tokentrail-announce-{uuid.uuid4().hex[:8]}",
                               security=self.security)

    def _reopen(self, exc: confluent_kafka.KafkaException) -> dict[int, int]:
        """After the reports consumer could not read an end offset: a new consumer, at the positions read so far.

        Why: in CI a long-lived consumer kept answering librdkafka's local "Unknown partition" through 10 s of
        retries and metadata lookups (twice in three fresh-clone runs, at the 11th and 19th announcement under
        a CPU burner), while a new client reads the topic's metadata afresh. TransportError if that fails too.
        """
        log.warning("%s: the reports consumer cannot read an end offset (%s); reading on with a new one",
                    self.reports_topic, exc)
        assert self._consumer is not None
        self._consumer.close()
        self._consumer = None
        consumer, first = self._open()  # TransportError when the new client cannot read them either
        positions = {**{tp.partition: 0 for tp in consumer.assignment()}, **self._next}
        consumer.assign([confluent_kafka.TopicPartition(self.reports_topic, p, at or confluent_kafka.OFFSET_BEGINNING)
                         for p, at in sorted(positions.items())])
        self._consumer, self._next = consumer, positions
        return {p: high for p, high in first.items() if high > positions[p]}

    def _fold(self, msg: Any, confirmations: Confirmations) -> None:
        key = (msg.key() or b"").decode("utf-8", "replace")
        if msg.value() is None:
            self._latest.pop(key, None)
            confirmations.gone(key)
            return
        try:
            report = decode_report(msg.value())
        except Exception as exc:  # content never stops the wait
            log.warning("%s record at offset %s skipped: %s", self.reports_topic, msg.offset(), exc)
            return
        kept = self._latest.get(report.instance)
        if kept is None or report.at >= kept.at:
            self._latest[report.instance] = report
        confirmations.note(report, time.time())


def announce_version(bootstrap: str, label: str, step: int, *, topic: str = POLICY_VERSIONS, weights: str = "",
                     timeout_s: float = 30.0, confirm: bool = True, confirm_timeout_s: float = 30.0,
                     min_followers: int = 0, skew_s: float = DEFAULT_SKEW_S,
                     security: KafkaSecurity | None = None) -> PolicyVersion:
    """One announcement from clients made for it (``VersionAnnouncer.announce``; a trainer announcing often holds
    an announcer instead). The same errors, the invalid label or step refused before any I/O."""
    Confirmations(step, skew_s=skew_s, min_followers=min_followers)
    PolicyVersion(label=label, step=step, announced_at=time.time(), weights=weights)
    with VersionAnnouncer(bootstrap, topic=topic, timeout_s=timeout_s, min_followers=min_followers, skew_s=skew_s,
                          security=security) as announcer:
        return announcer.announce(label, step, weights=weights, confirm=confirm, confirm_timeout_s=confirm_timeout_s)


def wait_applied(bootstrap: str, label: str, step: int, *, topic: str = POLICY_VERSIONS, timeout_s: float = 30.0,
                 min_followers: int = 0, skew_s: float = DEFAULT_SKEW_S,
                 security: KafkaSecurity | None = None) -> list[str]:
    """``VersionAnnouncer.wait_applied`` from a reports consumer made for it (no producer, no topic check)."""
    announcer = VersionAnnouncer(bootstrap, topic=topic, min_followers=min_followers, skew_s=skew_s, security=security)
    try:
        return announcer.wait_applied(label, step, timeout_s=timeout_s)
    finally:
        announcer.close()


def _names_of(topic: str) -> Any:
    # For the missing-topic message: the `tokentrail topics` command for this topic's prefix.
    return topic_names(topic.removesuffix(POLICY_VERSIONS)) if topic.endswith(POLICY_VERSIONS) else topic_names()
