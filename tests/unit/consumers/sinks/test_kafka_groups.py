"""The grouped Kafka sink without a broker: one record per group, deliveries held until it is acked."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from consumers.sinks.conformance import sample_rollout
from consumers.sinks.kafka_groups import GroupedKafkaSink, decode_group, encode_group
from consumers.sinks.plugin import load_sink
from schemas.errors import TransportError


def member(rid: str, reward, *, masked: bool = False, size: int = 3, tokens: int = 12):
    return dataclasses.replace(sample_rollout(rid, masked=masked, tokens=tokens),
                               result_json=json.dumps({"group_id": "g", "group_size": size, "reward": reward}))


class FakeProducer:
    """Holds each produce until the test acks it (or fails it)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes, bytes]] = []
        self.acks: list[asyncio.Future[None]] = []
        self.closed = 0

    async def produce(self, topic: str, key: bytes, value: bytes) -> None:
        self.records.append((topic, key, value))
        ack = asyncio.get_running_loop().create_future()
        self.acks.append(ack)
        await ack

    async def close(self) -> int:
        self.closed += 1
        return 0


@pytest.fixture
async def sink():
    sink = GroupedKafkaSink("127.0.0.1:9", topic="t.groups")
    sink._producer = FakeProducer()
    yield sink
    await sink.close()


async def test_one_record_per_group_and_deliveries_wait_for_its_ack(sink):
    deliveries = [asyncio.create_task(sink.deliver(member(rid, reward, masked=rid == "b")))
                  for rid, reward in (("c", 1.0), ("b", 0.0), ("a", 0.0))]
    for _ in range(5):
        await asyncio.sleep(0)
    ((topic, key, value),) = sink._producer.records
    assert not any(d.done() for d in deliveries)  # written, not yet acknowledged: nothing may commit
    record = decode_group(value)
    assert topic == "t.groups" and key == b"g" and record["complete"] and record["size"] == 3
    assert [m["rollout_id"] for m in record["members"]] == ["a", "b", "c"] and record["masked"] == ["b"]
    assert record["members"][1]["mask_sample"] and record["reward_mean"] == 0.5 and record["reward_std"] == 0.5
    sink._producer.acks[0].set_result(None)
    await asyncio.wait_for(asyncio.gather(*deliveries), 1)
    await asyncio.wait_for(sink.deliver(member("a", 0.0)), 1)  # a redelivery after the ack: no second record
    assert len(sink._producer.records) == 1 and sink.groups_written == 1


async def test_a_failed_group_write_fails_every_member_and_every_later_delivery(sink):
    deliveries = [asyncio.create_task(sink.deliver(member(rid, 1.0, size=2))) for rid in ("a", "b")]
    for _ in range(5):
        await asyncio.sleep(0)
    sink._producer.acks[0].set_exception(TransportError("broker gone"))
    for d in deliveries:
        with pytest.raises(TransportError, match="broker gone"):
            await asyncio.wait_for(d, 1)
    with pytest.raises(TransportError, match="restart the consumer"):
        await sink.deliver(member("z", 1.0, size=1))


async def test_close_fails_deliveries_of_a_group_still_open(sink):
    delivery = asyncio.create_task(sink.deliver(member("a", 1.0)))
    await asyncio.sleep(0)
    await sink.close()
    with pytest.raises(TransportError, match="closed before"):
        await delivery
    assert sink._producer.records == []


async def test_a_dropped_group_releases_its_deliveries_without_a_record():
    now = [0.0]
    sink = GroupedKafkaSink("127.0.0.1:9", group_timeout_s=10, on_timeout="drop", clock=lambda: now[0])
    sink._producer = FakeProducer()
    try:
        delivery = asyncio.create_task(sink.deliver(member("a", 1.0)))
        await asyncio.sleep(0)
        now[0] = 10.0
        sink.check_timeouts()
        await asyncio.wait_for(delivery, 1)
        assert sink.dropped_groups == 1 and sink._producer.records == []
    finally:
        await sink.close()


async def test_an_oversized_group_masks_its_largest_member_until_it_fits():
    sink = GroupedKafkaSink("127.0.0.1:9", max_message_bytes=64 * 1024 + 24 * 1024)  # 64 KiB headroom
    try:
        group = sink._assembler.summarize("g", 2, [member("big", 1.0, size=2, tokens=8000),
                                                   member("small", 0.0, size=2)])
        assert len(encode_group(group)) > sink._limit
        record = decode_group(sink._encode(group))
    finally:
        await sink.close()
    big, small = record["members"]
    assert big["mask_sample"] and big["trajectory"] is None and big["mask_reasons"][-1]["code"] == "record_too_large"
    assert not small["mask_sample"] and record["masked"] == ["big"] and record["reward_mean"] == 0.0
    assert record["complete"] and sink.records_shrunk == 1


def test_the_sink_loads_by_its_built_in_name():
    sink = load_sink("kafka-groups", {"bootstrap": "127.0.0.1:9", "group_timeout_s": 30, "on_timeout": "emit"})
    assert isinstance(sink, GroupedKafkaSink) and sink.max_in_flight == 1024
    asyncio.run(sink.close())


def test_a_limit_below_the_framing_headroom_is_refused():
    with pytest.raises(ValueError, match="max_message_bytes=1000"):
        GroupedKafkaSink("127.0.0.1:9", max_message_bytes=1000)


def test_decode_group_refuses_other_records():
    with pytest.raises(TransportError, match="format=None"):
        decode_group(b'{"rollout_id": "a"}')
