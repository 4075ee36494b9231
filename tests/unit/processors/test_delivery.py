"""The shell's delivery plumbing without a broker: in-order acks, hole-free admission, persisted offsets."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from faust.types import TP

from processors.app import create_app
from processors.delivery import ChangelogSend, OrderedAcker
from processors.guard import OffsetGuard
from processors.settings import ProcessorSettings

EVENTS = TP("rollout-events", 0)


@dataclass(eq=False)
class FakeMessage:
    tp: TP
    offset: int
    generation_id: int = 1
    acked: bool = False
    key: bytes = b"r"
    acks: list = field(default_factory=list)

    def ack(self, consumer) -> None:
        self.acks.append(self.offset)


class FakeConsumer:
    def __init__(self, committed: int | None, earliest: int = 0, end: int | None = None) -> None:
        self._committed_offset = {EVENTS: committed}
        self._unacked_messages: set = set()
        self.earliest, self.end, self.seeks = earliest, end, []

    def assignment(self):
        return {EVENTS, TP("changelog", 0)}

    def highwater(self, tp):
        return self.end

    async def earliest_offsets(self, *tps):
        return {tp: self.earliest for tp in tps}

    async def seek_wait(self, partitions):
        self.seeks.extend((tp.partition, offset) for tp, offset in partitions.items())

    async def seek(self, tp, offset):
        raise AssertionError("Consumer.seek drives aiokafka from the event loop's thread: use seek_wait")


def fake_app(consumer: FakeConsumer, generation: int = 1) -> SimpleNamespace:
    return SimpleNamespace(consumer=consumer, consumer_generation_id=generation, rebalancing=False,
                           in_recovery=False)


def event(offset: int, generation: int = 1) -> FakeMessage:
    return FakeMessage(EVENTS, offset, generation)


def sent(future, partition: int = 0, records: int = 1) -> ChangelogSend:
    return ChangelogSend(partition, records, future)


async def test_the_guard_admits_offsets_in_order_and_rewinds_over_a_hole():
    consumer = FakeConsumer(committed=10)
    guard = OffsetGuard(fake_app(consumer), EVENTS.topic)
    dropped = event(12)
    assert not await guard.admit(dropped)  # 10 and 11 never reached the stream
    # Records fetched before the seek still arrive, each moving faust's read offset past the hole: seek again.
    assert not await guard.admit(event(13))
    assert consumer.seeks == [(0, 10), (0, 10)] and guard.rewinds == 1
    assert dropped.acked and not dropped.acks, "released for rebalances, never made committable"
    assert [await guard.admit(event(o)) for o in (10, 11, 12, 13)] == [True] * 4
    assert await guard.admit(event(11)), "a redelivery below the expected offset is the fold's to ignore"
    assert not await guard.admit(event(15)) and consumer.seeks[-1] == (0, 14) and guard.rewinds == 2


async def test_a_rewind_is_repeated_until_the_hole_arrives():
    consumer = FakeConsumer(committed=10)
    guard = OffsetGuard(fake_app(consumer), EVENTS.topic, reseek_s=0.01)
    guard.start()
    assert not await guard.admit(event(12))
    await asyncio.sleep(0.05)
    assert len(consumer.seeks) > 2 and set(consumer.seeks) == {(0, 10)}
    assert await guard.admit(event(10))
    seeks = len(consumer.seeks)
    await asyncio.sleep(0.05)
    assert len(consumer.seeks) == seeks, "no more seeks once the hole is being filled"
    guard.stop()


async def test_a_hole_at_the_tail_is_found_once_the_stream_is_quiet():
    consumer = FakeConsumer(committed=10, end=14)
    guard = OffsetGuard(fake_app(consumer), EVENTS.topic, reseek_s=0.01)
    assert await guard.admit(event(10)) and await guard.admit(event(11))  # 12 and 13 were dropped
    guard.start()
    await asyncio.sleep(0.05)
    assert consumer.seeks and set(consumer.seeks) == {(0, 12)} and guard.rewinds == 1
    assert await guard.admit(event(12)) and await guard.admit(event(13))
    seeks = len(consumer.seeks)
    await asyncio.sleep(0.05)
    assert len(consumer.seeks) == seeks and guard.rewinds == 1, "caught up with the log end: nothing to do"
    guard.stop()


async def test_a_new_generation_restarts_from_the_committed_offset():
    consumer = FakeConsumer(committed=10)
    guard = OffsetGuard(fake_app(consumer), EVENTS.topic)
    assert await guard.admit(event(10)) and await guard.admit(event(11))
    consumer._committed_offset[EVENTS] = 20  # another member processed up to 19 meanwhile
    assert not await guard.admit(event(21, generation=2))
    assert consumer.seeks == [(0, 20)]
    assert await guard.admit(event(20, generation=2))


async def test_the_watch_stands_still_during_a_rebalance_and_starts_over_from_the_new_generation():
    consumer = FakeConsumer(committed=10, end=14)
    app = fake_app(consumer)
    guard = OffsetGuard(app, EVENTS.topic, reseek_s=0.01)
    assert await guard.admit(event(10))
    app.rebalancing = app.in_recovery = True  # the stream is paused: quiet by design, not a hole
    app.consumer_generation_id = 2
    guard.start()
    await asyncio.sleep(0.05)
    assert consumer.seeks == [] and guard.rewinds == 0
    consumer._committed_offset[EVENTS] = 12  # the previous owner got as far as 11
    app.rebalancing = app.in_recovery = False
    await asyncio.sleep(0.05)
    assert set(consumer.seeks) == {(0, 12)} and guard.rewinds == 1, "the tail check uses the new committed offset"
    guard.stop()


async def test_retention_moving_the_log_start_past_the_committed_offset_is_not_a_hole():
    consumer = FakeConsumer(committed=None, earliest=500)
    guard = OffsetGuard(fake_app(consumer), EVENTS.topic)
    assert await guard.admit(event(500)) and consumer.seeks == []


async def test_the_acker_acks_in_order_after_kafka_and_settles_a_rollouts_outputs():
    app = SimpleNamespace(crash=None, consumer=SimpleNamespace(ack=lambda message: message.ack(None)))
    table = SimpleNamespace(mark_persisted=lambda futures: None)
    acker = OrderedAcker(app, table)
    acker.start()
    loop = asyncio.get_running_loop()
    first, second = loop.create_future(), loop.create_future()
    snapshot = loop.create_future()
    a, b = event(0), event(1)
    acker.outputs(a.key, [snapshot])
    await acker.submit([a], [sent(first)], [(a.key, [snapshot])])
    await acker.submit([b], [sent(second)], [])
    second.set_result(None)
    await asyncio.sleep(0)
    assert not a.acks and not b.acks and not acker.idle
    settle = asyncio.ensure_future(acker.settle(b"r"))
    first.set_result(None)
    await asyncio.sleep(0.01)
    assert not a.acks and not settle.done(), "the rollout's next event waits for its snapshot"
    snapshot.set_result(None)
    await asyncio.sleep(0.01)
    assert a.acks == [0] and b.acks == [1] and settle.done() and acker.idle
    acker.stop()


async def test_a_write_kafka_refused_stops_the_worker_and_acks_nothing_after_it():
    crashed = []

    async def crash(exc):
        crashed.append(exc)

    acker = OrderedAcker(SimpleNamespace(crash=crash, consumer=SimpleNamespace(ack=lambda message: message.ack(None))),
                         SimpleNamespace(mark_persisted=lambda futures: None))
    acker.start()
    failed = asyncio.get_running_loop().create_future()
    failed.set_exception(OSError("broker gone"))
    a, b = event(0), event(1)
    await acker.submit([a], [sent(failed)], [])
    await asyncio.sleep(0.01)
    assert crashed and not a.acks
    with pytest.raises(OSError):
        await acker.submit([b], [], [])
    assert not b.acks


async def test_acknowledged_changelog_offsets_are_persisted_per_partition(tmp_path):
    app = create_app(ProcessorSettings(bootstrap="localhost:1", data_dir=tmp_path, app_id="unit-delivery"))
    app.finalize()
    table = app.tokentrail_table
    loop = asyncio.get_running_loop()
    sends = []
    for partition, base, records in [(0, 5, 1), (1, 7, 3), (0, 9, 2)]:
        fut = loop.create_future()
        fut.set_result(SimpleNamespace(partition=partition, offset=base))  # a record batch's base offset
        sends.append(sent(fut, partition, records))
    table.mark_persisted(sends)
    topic = table.changelog_topic.get_topic_name()
    assert table.data.persisted_offset(TP(topic, 0)) == 10, "the last record of the partition's last batch"
    assert table.data.persisted_offset(TP(topic, 1)) == 9
