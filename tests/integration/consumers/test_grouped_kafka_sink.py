"""The grouped Kafka sink against the real broker: one complete record per GRPO group, masked members marked."""

from __future__ import annotations

import asyncio
import uuid

import confluent_kafka
import pytest

from consumers.loop import RebuildConsumer
from consumers.settings import ConsumerSettings
from consumers.sinks.conformance import run_conformance
from consumers.sinks.kafka_groups import GroupedKafkaSink, decode_group
from schemas.codec import encode_snapshot
from schemas.kafka.admin import ensure_topics
from schemas.kafka.topics import topic_names
from tests.factories import finished, incomplete
from tests.integration.consumers.test_interop_and_sinks import _read_topic
from tests.unit.consumers.support import child, root, snapshot_of

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]


def _topics(bootstrap: str):
    names = topic_names(f"itg{uuid.uuid4().hex[:8]}.")
    ensure_topics(bootstrap, names)  # `tokentrail topics` creates the groups topic too
    return names, names.rebuilt_groups


def _member(rid: str, reward: float, *, masked: bool = False):
    result = finished({"group_id": "task-7", "group_size": 3, "reward": reward})
    if masked:  # a call that never completed: the rebuild masks the rollout capture_incomplete
        return snapshot_of(root([1], [2]), incomplete("a" * 32), rollout=rid, finish=result)
    r = root([1, 2], [3])
    return snapshot_of(r, child(r, [4], [5]), rollout=rid, finish=result)


async def test_a_group_with_a_masked_member_is_one_complete_record_with_the_member_marked(kafka_bootstrap):
    names, groups_topic = await asyncio.to_thread(_topics, kafka_bootstrap)
    snapshots = [_member("task-7-0", 1.0), _member("task-7-1", 0.0, masked=True), _member("task-7-2", 0.0)]
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka_bootstrap})
    for snap in snapshots:
        producer.produce(names.snapshots, key=snap.rollout_id.encode(), value=encode_snapshot(snap))
    assert producer.flush(10) == 0
    settings = ConsumerSettings(bootstrap=kafka_bootstrap, group_id=f"g-{uuid.uuid4().hex[:6]}", topics=names,
                                sink="kafka-groups", poll_timeout_s=0.1)
    sink = GroupedKafkaSink(kafka_bootstrap, topic=groups_topic, include_response=False)
    consumer = RebuildConsumer(settings, sink)
    try:
        await asyncio.wait_for(consumer.run(max_rollouts=3), 60)
    finally:
        await consumer.close()

    (msg,) = await asyncio.to_thread(_read_topic, kafka_bootstrap, groups_topic)
    group = decode_group(msg.value())
    assert msg.key() == b"task-7" and group["key"] == "task-7"
    assert group["complete"] and not group["timed_out"] and group["size"] == 3 and group["missing"] == 0
    members = group["members"]
    assert [m["rollout_id"] for m in members] == ["task-7-0", "task-7-1", "task-7-2"]  # the masked one kept
    assert group["masked"] == ["task-7-1"] and members[1]["mask_sample"]
    assert [r["code"] for r in members[1]["mask_reasons"]] == ["capture_incomplete"]
    assert not members[0]["mask_sample"] and not members[2]["mask_sample"]
    # the masked member stays out of the baseline: mean and std over the two valid members
    assert group["rewarded"] == 2 and group["reward_mean"] == 0.5 and group["reward_std"] == 0.5


async def test_the_grouped_sink_passes_the_conformance_kit(kafka_bootstrap):
    _, groups_topic = await asyncio.to_thread(_topics, kafka_bootstrap)

    def read_back():
        return [m for msg in _read_topic(kafka_bootstrap, groups_topic) for m in decode_group(msg.value())["members"]]

    # The kit's rollouts carry no group id: each is a group of one, written when delivered.
    passed = await run_conformance(lambda: GroupedKafkaSink(kafka_bootstrap, topic=groups_topic),
                                   read_back=lambda: asyncio.to_thread(read_back))
    assert "durable_when_deliver_returns" in passed and "concurrent_deliveries" in passed
