"""``announce_version`` and the follower without a broker: validation before any I/O, leaderless partitions waited out."""

from __future__ import annotations

import time

import confluent_kafka
import pytest

from schemas.errors import ContractError
from schemas.kafka.announce import announce_version
from schemas.kafka.scan import watermarks as _watermarks

UNREACHABLE_BROKER = "127.0.0.1:1"  # an announcement that got this far would fail naming it


def test_an_invalid_announcement_is_refused_before_any_io():
    with pytest.raises(ContractError, match="step=-1"):
        announce_version(UNREACHABLE_BROKER, "v1", -1)


class _FlakyOffsets:
    """A consumer whose end-offset reads fail with ``errors`` (in order) before answering."""

    def __init__(self, *errors: int) -> None:
        self.errors, self.calls, self.looked_up = list(errors), 0, []

    def list_topics(self, topic, timeout):
        self.looked_up.append(topic)

    def get_watermark_offsets(self, tp, timeout):
        self.calls += 1
        if self.errors:
            raise confluent_kafka.KafkaException(confluent_kafka.KafkaError(self.errors.pop(0)))
        return 0, 7


def test_a_partition_without_a_leader_yet_is_waited_for():
    # The CI failure this pins: NOT_LEADER_FOR_PARTITION right after the topic was created.
    flaky = _FlakyOffsets(confluent_kafka.KafkaError.NOT_LEADER_FOR_PARTITION,
                          confluent_kafka.KafkaError.LEADER_NOT_AVAILABLE)
    assert _watermarks(flaky, None, deadline=time.monotonic() + 5) == (0, 7)
    assert flaky.calls == 3


def test_a_partition_missing_from_the_clients_metadata_for_a_moment_is_waited_for():
    # The CI failure this pins: an announcement's confirmation read failed on the client's local
    # "Unknown partition" while a loaded broker's metadata left the reports topic's partition out.
    flaky = _FlakyOffsets(confluent_kafka.KafkaError._UNKNOWN_PARTITION)
    tp = confluent_kafka.TopicPartition("t.reports", 0)
    assert _watermarks(flaky, tp, deadline=time.monotonic() + 5) == (0, 7)
    assert flaky.calls == 2
    # ... and the client was made to look the topic up again: it does not by itself for minutes (in CI the
    # partition stayed unknown through 10 s of retries).
    assert flaky.looked_up == ["t.reports"]


def test_a_lasting_or_non_retriable_offset_error_is_raised():
    with pytest.raises(confluent_kafka.KafkaException):
        _watermarks(_FlakyOffsets(confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED), None,
                    deadline=time.monotonic() + 5)
    lasting = _FlakyOffsets(*[confluent_kafka.KafkaError.NOT_LEADER_FOR_PARTITION] * 100)
    with pytest.raises(confluent_kafka.KafkaException):
        _watermarks(lasting, None, deadline=time.monotonic() + 0.5)
    assert 1 < lasting.calls < 100


class _ReportsConsumer:
    """The announcer's reports consumer: assigned partitions, closable, and end offsets that may fail."""

    def __init__(self, partitions: list[int], error: int | None = None, high: int = 7) -> None:
        self.assigned = [confluent_kafka.TopicPartition("t.applied", p, 0) for p in partitions]
        self.error, self.high, self.closed = error, high, False

    def assignment(self):
        return self.assigned

    def assign(self, parts):
        self.assigned = list(parts)

    def close(self):
        self.closed = True

    def list_topics(self, topic, timeout):
        pass

    def get_watermark_offsets(self, tp, timeout):
        if self.error is not None:
            raise confluent_kafka.KafkaException(confluent_kafka.KafkaError(self.error))
        return 0, self.high


def test_a_reports_consumer_that_lost_its_partition_is_replaced_at_the_positions_read(monkeypatch):
    # In CI a long-lived reports consumer kept answering "Unknown partition" through 10 s of retries and metadata
    # lookups, at the 11th and the 19th of twenty announcements: a new client reads on from where the old one was.
    from schemas.kafka import announce as announce_module
    from schemas.kafka.announce import VersionAnnouncer

    fresh = _ReportsConsumer([0, 1])
    monkeypatch.setattr(announce_module, "open_from_start", lambda *a, **k: (fresh, {0: 9, 1: 4}))
    announcer = VersionAnnouncer("b:9092", topic="t")
    lost = _ReportsConsumer([0, 1], error=confluent_kafka.KafkaError._UNKNOWN_PARTITION)
    announcer._consumer, announcer._next = lost, {0: 5, 1: 4}
    monkeypatch.setattr(announce_module, "watermarks", lambda consumer, tp, deadline: consumer.get_watermark_offsets(tp, 1))
    ends = announcer._ends_to_read()
    assert lost.closed and announcer._consumer is fresh
    assert ends == {0: 9}  # partition 1 was read to its end already
    assert [(tp.partition, tp.offset) for tp in fresh.assigned] == [(0, 5), (1, 4)]
