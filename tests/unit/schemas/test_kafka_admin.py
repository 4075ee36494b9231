"""schemas.kafka.admin.produce_all without a broker: back-pressure, order, and failures named."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from schemas.kafka.admin import TopicError, produce_all


class FakeProducer:
    """Refuses every other produce with BufferError (a full queue); delivers, or fails, on flush."""

    def __init__(self, fail: KafkaError | None = None, left: int = 0) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.pending: list = []
        self.refuse = True
        self.polls = 0
        self.fail, self.left = fail, left

    def produce(self, topic, key, value, on_delivery):
        self.refuse = not self.refuse
        if not self.refuse:
            raise BufferError("Local: Queue full")
        self.sent.append((topic, key, value))
        self.pending.append(on_delivery)

    def poll(self, timeout):
        self.polls += 1

    def flush(self, timeout):
        for callback in self.pending:
            callback(self.fail, None)
        return self.left


def test_a_full_queue_is_waited_out_and_every_record_goes_in_order():
    producer = FakeProducer()
    records = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(5)]
    produce_all(producer, "t", iter(records))
    assert producer.sent == [("t", k, v) for k, v in records]
    assert producer.polls >= 5


def test_a_delivery_error_or_unacknowledged_records_raise_a_topic_error():
    with pytest.raises(TopicError, match=r"producing to t failed: .*\(2 delivery errors\)"):
        produce_all(FakeProducer(fail=KafkaError(KafkaError._MSG_TIMED_OUT)), "t", [(b"a", b"1"), (b"b", b"2")])
    with pytest.raises(TopicError, match="3 records unacknowledged after 5 s"):
        produce_all(FakeProducer(left=3), "t", [(b"a", b"1")], timeout=5)
