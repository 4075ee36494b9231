"""NeMo Gym's transport conformance, the Kafka sink and the event log, against the real broker."""

from __future__ import annotations

import asyncio
import uuid

import confluent_kafka
import pytest

from consumers.gym.adapters import TokenLineage, TokenSink, TokenSource
from consumers.gym.conformance import run_gym_conformance
from consumers.loop import RebuildConsumer
from consumers.replay.eventlog import EventLog
from consumers.settings import ConsumerSettings
from consumers.sinks.conformance import run_conformance, sample_rollout
from consumers.sinks.kafka import KafkaSink
from schemas.codec import decode_rebuilt, encode_rebuilt, encode_snapshot
from schemas.kafka.topics import key_for
from tests.factories import event, finished
from tests.unit.consumers.support import child, root, snapshot_of

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]


async def test_gym_adapters_pass_all_ten_gym_conformance_checks(kafka_bootstrap, topics):
    t = topics.rollout_events
    passed = await run_gym_conformance(lambda: TokenSink(kafka_bootstrap, topic=t),
                                       lambda: TokenSource(kafka_bootstrap, topic=t),
                                       lambda: TokenLineage(kafka_bootstrap, topic=t),
                                       rollout_id=f"gymconf-{uuid.uuid4().hex[:6]}")
    assert passed == ["put_then_freeze_visibility", "idempotent_reput", "conflicting_reput",
                      "mark_incomplete_durability", "freeze_idempotency", "post_freeze_write_safety",
                      "conditional_retirement", "lineage_visibility", "fresh_client_lineage_visibility",
                      "begin_call_custody"]


async def test_a_broken_transport_is_rejected(kafka_bootstrap, topics):
    from consumers.gym.conformance import GymConformanceError

    class Amnesiac(TokenSink):
        async def put(self, entry) -> None:
            return None  # acknowledges, writes nothing

    t = topics.rollout_events
    with pytest.raises(GymConformanceError, match="put_then_freeze_visibility"):
        await run_gym_conformance(lambda: Amnesiac(kafka_bootstrap, topic=t),
                                  lambda: TokenSource(kafka_bootstrap, topic=t),
                                  rollout_id=f"amnesiac-{uuid.uuid4().hex[:6]}")


async def test_an_intent_that_is_not_durable_fails_the_custody_check(kafka_bootstrap, topics):
    from consumers.gym.conformance import GymConformanceError

    class ForgetsIntents(TokenSink):
        async def begin_call(self, rollout_id, model_call_id) -> None:
            return None  # says yes, publishes nothing: a lost call would go unnoticed

    t = topics.rollout_events
    with pytest.raises(GymConformanceError, match="begin_call_custody"):
        await run_gym_conformance(lambda: ForgetsIntents(kafka_bootstrap, topic=t),
                                  lambda: TokenSource(kafka_bootstrap, topic=t),
                                  lambda: TokenLineage(kafka_bootstrap, topic=t),
                                  rollout_id=f"forgetful-{uuid.uuid4().hex[:6]}")


def _read_topic(bootstrap: str, topic: str) -> list:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": f"rb-{uuid.uuid4().hex}",
                                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                         "enable.partition.eof": True})
    meta = consumer.list_topics(topic, timeout=10)
    consumer.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                     for p in meta.topics[topic].partitions])
    out, eof = [], set()
    try:
        while len(eof) < len(meta.topics[topic].partitions):
            msg = consumer.poll(5)
            if msg is None:
                break
            if msg.error():
                if msg.error().code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    eof.add(msg.partition())
                continue
            out.append(msg)
    finally:
        consumer.close()
    return out


async def test_kafka_sink_passes_the_conformance_kit(kafka_bootstrap):
    from schemas.kafka.admin import ensure_topics
    from schemas.kafka.topics import topic_names

    names = topic_names(f"itk{uuid.uuid4().hex[:8]}.")
    ensure_topics(kafka_bootstrap, names)

    def read_back():
        return [decode_rebuilt(m.value()) for m in _read_topic(kafka_bootstrap, names.rebuilt)]

    passed = await run_conformance(lambda: KafkaSink(kafka_bootstrap, topic=names.rebuilt),
                                   read_back=lambda: asyncio.to_thread(read_back))
    assert "durable_when_deliver_returns" in passed and "concurrent_deliveries" in passed
    keys = {m.key() for m in await asyncio.to_thread(_read_topic, kafka_bootstrap, names.rebuilt)}
    assert key_for(sample_rollout("conformance-clean").rollout_id) in keys


async def test_consumer_to_kafka_sink_delivers_avro_keyed_by_rollout(kafka_bootstrap):
    from schemas.kafka.admin import ensure_topics
    from schemas.kafka.topics import topic_names

    names = topic_names(f"itk{uuid.uuid4().hex[:8]}.")
    ensure_topics(kafka_bootstrap, names)
    r = root([1, 2], [3])
    snapshot = snapshot_of(r, child(r, [4], [5]), rollout="k-1")
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(names.snapshots, key=b"k-1", value=encode_snapshot(snapshot))
    assert producer.flush(10) == 0
    settings = ConsumerSettings(bootstrap=kafka_bootstrap, group_id=f"k-{uuid.uuid4().hex[:6]}", topics=names,
                                sink="kafka", poll_timeout_s=0.1)
    sink = KafkaSink(kafka_bootstrap, topic=names.rebuilt, include_response=False)
    consumer = RebuildConsumer(settings, sink)
    try:
        await asyncio.wait_for(consumer.run(max_rollouts=1), 60)
    finally:
        await consumer.close()
    (msg,) = await asyncio.to_thread(_read_topic, kafka_bootstrap, names.rebuilt)
    delivered = decode_rebuilt(msg.value())
    assert msg.key() == b"k-1" and delivered.response_json is None and not delivered.mask_sample
    from consumers.rebuild import RebuildRules, rebuild

    assert msg.value() == encode_rebuilt(rebuild(snapshot, RebuildRules(project_response=False)))


def test_event_log_reads_one_rollouts_events_from_its_murmur2_partition(kafka_bootstrap, topics, publisher):
    tag = uuid.uuid4().hex[:6]
    rollouts = [f"log-{tag}-{i}" for i in range(12)]
    events = [event(rid, body) for n, rid in enumerate(rollouts) for body in (root([1, n], [2]), finished())]
    acks = publisher.publish(events)
    log = EventLog(kafka_bootstrap, topics.rollout_events)
    try:
        for ev, (partition, _offset) in zip(events, acks):
            assert log.partition_of(ev.rollout_id) == partition  # where librdkafka's murmur2_random put it
        target = rollouts[5]
        records = list(log.rollout_events(target))
        assert [r.decode().event_id for r in records] == [e.event_id for e in events if e.rollout_id == target]
        later = list(log.rollout_events(target, from_offset=records[1].offset))
        assert [r.offset for r in later] == [records[1].offset]
        assert list(log.rollout_events(target, from_time_ms=records[-1].timestamp_ms + 60_000)) == []
    finally:
        log.close()
