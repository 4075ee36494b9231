"""The contract test of the one Kafka bridge (schemas.kafka), on the session's broker.

- A record published through the bridge is acknowledged, at the (partition, offset)
  the broker stored it, on ``partition_for(key)``: our murmur2 is librdkafka's
  ``murmur2_random``, which the builder configures, for keys of every length.
- The async path (interceptor, sink, Gym adapters), the sync path (the consumer's
  retire and dead letters) and the batch path (compose) write byte-identical
  records: same key, same value, same headers.
- An unreachable broker is a ``PublishFailed`` (a ``TransportError``) on every path,
  classified as possibly persisted (the interceptor then spools it as uncertain).
- The topic scan by time (schemas.kafka.scan) reads exactly a partition's records
  from a time to its end.
"""

from __future__ import annotations

import time
import uuid

import pytest

from schemas.errors import TransportError
from schemas.kafka.admin import ensure_topics
from schemas.kafka.bridge import AckedProducer, PublishFailed, admin_client
from schemas.kafka.config import producer_config
from schemas.kafka.framing import deadletter_headers
from schemas.kafka.partitioning import partition_for
from schemas.kafka.scan import TopicReader
from schemas.kafka.topics import topic_names

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]

PARTITIONS = 5


@pytest.fixture
def topic(kafka_bootstrap):
    names = topic_names(f"bridge{uuid.uuid4().hex[:8]}.")
    ensure_topics(kafka_bootstrap, names, partitions=PARTITIONS)
    return names.rollout_events


def _read_all(bootstrap, topic):
    reader = TopicReader(bootstrap, timeout_s=15)
    try:
        return [msg for p in range(reader.partitions(topic)) for msg in reader.read(topic, p)]
    finally:
        reader.close()


async def test_acked_on_the_murmur2_partition_and_every_path_writes_the_same_record(kafka_bootstrap, topic):
    producer = AckedProducer(producer_config(kafka_bootstrap))
    headers = deadletter_headers("CodecError", "bad magic", "src", 2, 41)
    keys = [f"rollout-{'x' * n}".encode() for n in range(12)]  # every key length mod 4
    acked = {}
    try:
        for key in keys:
            acked[("async", key)] = await producer.produce(topic, key, b"async:" + key)
        value = b"\x00\x01same-bytes"
        via_async = await producer.produce(topic, b"same", value, headers)
        via_sync = producer.produce_sync(topic, b"same", value, headers)
        assert producer.produce_all(topic, [(b"same", value)]) == 1
    finally:
        assert await producer.close() == 0

    records = _read_all(kafka_bootstrap, topic)
    stored = {(m.partition(), m.offset()): m for m in records}
    for (_, key), position in acked.items():
        assert position[0] == partition_for(key, PARTITIONS), key  # where librdkafka's murmur2_random put it
        assert stored[position].key() == key and stored[position].value() == b"async:" + key
    same = [m for m in records if m.key() == b"same"]
    assert len(same) == 3 and {(m.partition(), m.offset()) for m in same} >= {via_async, via_sync}
    assert {m.partition() for m in same} == {partition_for(b"same", PARTITIONS)}
    assert [m.value() for m in same] == [value] * 3
    assert [m.headers() for m in same[:2]] == [headers, headers]  # async and sync carry the same headers
    assert same[2].headers() is None  # the batch path sends none, like the async path without headers


async def test_an_unreachable_broker_is_a_possibly_persisted_transport_error():
    config = producer_config("127.0.0.1:1", delivery_timeout_ms=1500)
    producer = AckedProducer(config)
    with pytest.raises(PublishFailed) as async_failure:
        await producer.produce("t", b"k", b"v")
    with pytest.raises(PublishFailed) as sync_failure:
        producer.produce_sync("t", b"k", b"v")
    with pytest.raises(PublishFailed, match=r"producing to t failed: .*\(1 delivery errors\)"):
        producer.produce_all("t", [(b"k", b"v")])
    for failure in (async_failure.value, sync_failure.value):
        assert isinstance(failure, TransportError)
        assert "not acknowledged" in str(failure)
        assert failure.possibly_persisted and not failure.permanent  # a message timeout: its ack may be lost
    assert await producer.close(timeout_s=1) == 0
    with pytest.raises(PublishFailed) as closed:
        await producer.produce("t", b"k", b"v")
    assert closed.value.permanent and not closed.value.possibly_persisted


async def test_an_oversized_record_is_permanent(kafka_bootstrap, topic):
    producer = AckedProducer(producer_config(kafka_bootstrap, max_message_bytes=1000))
    try:
        with pytest.raises(PublishFailed) as failure:
            await producer.produce(topic, b"k", b"x" * 5000)
        assert failure.value.permanent and not failure.value.possibly_persisted
    finally:
        await producer.close()


async def test_the_scan_by_time_reads_a_partition_from_a_time_to_its_end(kafka_bootstrap, topic):
    producer = AckedProducer(producer_config(kafka_bootstrap))
    try:
        early = await producer.produce(topic, b"k", b"early")
        time.sleep(0.05)
        since_ms = int(time.time() * 1000)
        time.sleep(0.05)
        late = [await producer.produce(topic, b"k", f"late{i}".encode()) for i in range(3)]
    finally:
        await producer.close()
    reader = TopicReader(kafka_bootstrap, timeout_s=15)
    try:
        assert reader.partitions(topic) == PARTITIONS
        partition = partition_for(b"k", PARTITIONS)
        assert [m.value() for m in reader.read(topic, partition)] == [b"early", b"late0", b"late1", b"late2"]
        assert [(m.partition(), m.offset()) for m in reader.read(topic, partition, from_time_ms=since_ms)] == late
        assert [m.value() for m in reader.read_topic(topic, from_time_ms=since_ms)] == [b"late0", b"late1", b"late2"]
        assert [m.value() for m in reader.read(topic, partition, from_offset=early[1] + 2)] == [b"late1", b"late2"]
        assert list(reader.read(topic, partition, from_time_ms=int(time.time() * 1000) + 60_000)) == []
        with pytest.raises(TransportError, match="does not exist"):
            reader.partitions(topic + ".missing")
    finally:
        reader.close()


def test_the_admin_client_factory_answers(kafka_bootstrap, topic):
    assert topic in admin_client(kafka_bootstrap).list_topics(timeout=10).topics
