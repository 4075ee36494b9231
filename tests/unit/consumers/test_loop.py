"""The consumer loop with in-memory Kafka clients (gym_inventory §8 "Consumer / delivery", adapted)."""

from __future__ import annotations

import asyncio
import logging
import threading
from types import SimpleNamespace

import pytest

import consumers.loop as loop_module
from consumers.loop import DeliveryFailed, MaskFractionExceeded, RebuildConsumer
from consumers.offsets import OffsetTracker
from consumers.settings import ConsumerSettings
from consumers.sinks.plugin import JsonlSink
from consumers.sinks.stream import RolloutStream
from consumers.trainer_stream import rollout_stream
from processors.fold import fold
from processors.replay import MemoryState, replay
from schemas.codec import decode_event
from schemas.records import RetireRequested
from tests.factories import event, finished, incomplete
from tests.unit.consumers.fakes import FakeConsumer, FakeMessage, FakeProducer, Journal, RecordingSink, messages_for
from tests.unit.consumers.support import child, root, snapshot_of


def clean(rid: str, reward: float = 1.0, **result):
    r = root([1, 2], [3])
    return snapshot_of(r, child(r, [4], [5]), rollout=rid, finish=finished({"reward": reward, **result}))


def masked(rid: str):
    return snapshot_of(root([1], [2]), incomplete("a" * 32), rollout=rid)


def consumer_for(sink, snapshots, journal=None, fail_topics=(), **settings):
    journal = journal or Journal()
    kafka = FakeConsumer(journal, messages_for(snapshots))
    producer = FakeProducer(journal, fail_topics)
    s = ConsumerSettings(bootstrap="127.0.0.1:9", poll_timeout_s=0.01, shutdown_grace_s=0.2, **settings)
    return RebuildConsumer(s, sink, kafka_consumer=kafka, kafka_producer=producer), kafka, producer, journal


async def test_each_snapshot_is_delivered_then_retired_then_committed():
    journal = Journal()
    sink = RecordingSink(journal)
    consumer, kafka, producer, _ = consumer_for(sink, [clean("r-1"), clean("r-2", 0.5)], journal)
    stats = await consumer.run(max_rollouts=2)
    assert (stats.delivered, stats.rebuilt, stats.masked) == (2, 2, 0)
    steps = [e for e in journal.entries if e[0] != "poll"]
    assert steps == [("deliver", "r-1"), ("produce", "tokentrail.rollout-events"), ("commit", 0, 1),
                     ("deliver", "r-2"), ("produce", "tokentrail.rollout-events"), ("commit", 0, 2)]
    retire = decode_event(producer.produced[0][2])
    assert isinstance(retire.body, RetireRequested)
    first = sink.delivered[0]
    assert (retire.rollout_id, retire.body.snapshot_id, retire.body.version) == (
        "r-1", first.snapshot_id, first.version)
    assert producer.produced[0][1] == b"r-1"  # keyed by the rollout id
    assert sink.delivered[1].result_json == '{"reward": 0.5}'  # the rollout result is preserved


async def test_a_failed_delivery_is_neither_retired_nor_committed():
    sink = RecordingSink(fail=True)
    consumer, kafka, producer, journal = consumer_for(sink, [clean("r-1")])
    with pytest.raises(DeliveryFailed, match="disk full"):
        await consumer.run(max_rollouts=1)
    assert kafka.committed == {} and producer.produced == []


async def test_a_crash_between_delivery_and_commit_redelivers_without_duplicates(tmp_path):
    path = tmp_path / "out.jsonl"
    snaps = [clean("r-1"), clean("r-2")]
    sink = JsonlSink(str(path))
    consumer, kafka, _, _ = consumer_for(sink, snaps, fail_topics=("rollout-events",))
    with pytest.raises(Exception, match="not acknowledged"):
        await consumer.run(max_rollouts=2)  # delivered r-1, then retiring it failed: no commit
    assert kafka.committed == {} and len(path.read_text().splitlines()) == 1
    await sink.close()
    restarted = JsonlSink(str(path))
    consumer2, kafka2, _, _ = consumer_for(restarted, snaps)
    await consumer2.run(max_rollouts=2)
    assert len(path.read_text().splitlines()) == 2 and kafka2.committed == {("tokentrail.snapshots", 0): 2}


async def test_an_undecodable_snapshot_goes_to_the_dead_letter_topic_and_the_stream_goes_on():
    sink = RecordingSink()
    snaps = messages_for([clean("r-2")])
    bad = FakeMessage(b"\x00garbage", 0, _key=b"r-1")
    good = FakeMessage(snaps[0].value(), 1, _key=b"r-2")
    journal = Journal()
    kafka = FakeConsumer(journal, [bad, good])
    producer = FakeProducer(journal)
    s = ConsumerSettings(bootstrap="127.0.0.1:9", poll_timeout_s=0.01)
    consumer = RebuildConsumer(s, sink, kafka_consumer=kafka, kafka_producer=producer)
    stats = await consumer.run(max_rollouts=1)
    assert stats.deadletters == 1 and [r.rollout_id for r in sink.delivered] == ["r-2"]
    topic, key, value, headers = producer.produced[0]
    assert topic == "tokentrail.deadletter" and key == b"r-1" and value == b"\x00garbage"
    assert dict(headers)["tokentrail-reason"] == b"CodecError"
    assert kafka.committed == {("tokentrail.snapshots", 0): 2}


async def test_rebuild_runs_once_per_snapshot_off_the_event_loop(monkeypatch):
    threads = []
    real = loop_module.rebuild

    def spy(snapshot, rules):
        threads.append(threading.current_thread())
        return real(snapshot, rules)

    monkeypatch.setattr(loop_module, "rebuild", spy)
    consumer, *_ = consumer_for(RecordingSink(), [clean("r-1"), clean("r-2")])
    await consumer.run(max_rollouts=2)
    assert len(threads) == 2 and threading.main_thread() not in threads


async def test_masked_rollouts_are_delivered_with_their_reasons_and_retired():
    sink = RecordingSink()
    consumer, _, producer, _ = consumer_for(sink, [masked("r-m")])
    stats = await consumer.run(max_rollouts=1)
    assert sink.delivered[0].mask_sample and stats.mask_reasons == {"capture_incomplete": 1}
    assert len(producer.produced) == 1  # evidence stays in the event log; processor state is retired


async def test_max_mask_fraction_stops_with_the_reasons_before_delivering():
    sink = RecordingSink()
    snaps = [clean("r-0"), masked("r-1"), masked("r-2"), masked("r-3")]
    consumer, kafka, _, _ = consumer_for(sink, snaps, max_mask_fraction=0.5, mask_fraction_min_samples=3)
    with pytest.raises(MaskFractionExceeded, match=r"2 of 3 .*capture_incomplete: 2"):
        await consumer.run()
    assert [r.rollout_id for r in sink.delivered] == ["r-0", "r-1"]
    assert kafka.committed == {("tokentrail.snapshots", 0): 2}  # the third was not committed


def test_mask_fraction_defaults():
    s = ConsumerSettings(bootstrap="h:1")
    assert s.max_mask_fraction is None and s.mask_fraction_min_samples == 50
    with pytest.raises(ValueError):
        ConsumerSettings(bootstrap="h:1", max_mask_fraction=1.5)
    with pytest.raises(ValueError, match="unknown rebuild rule"):
        ConsumerSettings(bootstrap="h:1", rules={"side_calls": ["haiku"]})


async def test_a_sink_without_the_projection_gets_none_built():
    sink = RecordingSink()
    sink.include_response = False
    consumer, *_ = consumer_for(sink, [clean("r-1")])
    await consumer.run(max_rollouts=1)
    assert sink.delivered[0].response_json is None and sink.delivered[0].trajectory is not None


async def test_grouped_deliveries_commit_only_when_the_trainer_took_the_whole_group():
    stream = RolloutStream(group_key="group", group_size=2)
    snaps = [clean("g-a", group="x"), clean("g-b", group="y"), clean("g-c", group="x")]
    consumer, kafka, _, _ = consumer_for(stream, snaps)
    runner = asyncio.create_task(consumer.run(max_rollouts=3))
    group = await asyncio.wait_for(stream.__anext__(), 5)
    assert [r.rollout_id for r in group] == ["g-a", "g-c"]
    await asyncio.sleep(0.05)
    assert kafka.committed == {}  # taken, not yet owned: the trainer has not moved on
    stream.ack()
    await asyncio.sleep(0.05)
    assert kafka.committed == {("tokentrail.snapshots", 0): 1}  # g-b (offset 1) still pending
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner


async def test_stopping_with_deliveries_pending_commits_nothing_of_them():
    stream = RolloutStream()
    consumer, kafka, _, _ = consumer_for(stream, [clean("r-1")])
    stop = asyncio.Event()
    runner = asyncio.create_task(consumer.run(stop=stop))
    await asyncio.wait_for(stream.__anext__(), 5)  # taken but never acknowledged
    stop.set()
    await asyncio.wait_for(runner, 5)
    assert kafka.committed == {}


def test_retire_removes_only_the_exact_snapshot_so_a_newer_attempt_survives():
    state = MemoryState()
    snaps = [s for step in replay([event("r-x", b) for b in (root([1], [2]), finished())], state=state)
             for s in step.snapshots]
    old = snaps[-1]
    state.apply(fold(state, event("r-x", root([5], [6]))))  # a newer write after the freeze
    res = fold(state, event("r-x", RetireRequested(snapshot_id=old.snapshot_id, version=old.version)))
    assert any("stale retire" in n for n in res.notes) and not res.writes


def test_offset_tracker_commits_contiguous_prefixes_only():
    t = OffsetTracker()
    tp = ("s", 0)
    for off in (5, 6, 7):
        t.start(tp, off)
    assert t.finish(tp, 6) is None and t.finish(tp, 5) == 7 and t.finish(tp, 7) == 8
    t.start(tp, 8)
    t.forget([tp])
    assert t.finish(tp, 8) is None


def test_a_rebalance_is_logged_and_a_revoke_forgets_the_pending_offsets(caplog):
    consumer, *_ = consumer_for(RecordingSink(Journal()), [])
    tp = SimpleNamespace(topic="tokentrail.snapshots", partition=2)
    with caplog.at_level(logging.INFO, logger="tokentrail.consumer"):
        consumer._on_assign(None, [tp])
        consumer._offsets.start(("tokentrail.snapshots", 2), 7)
        consumer._on_revoke(None, [tp])
    # A consumer that never joined its group logs nothing else: these lines tell a stuck join apart.
    assert "assigned tokentrail.snapshots[2]" in caplog.text and "revoked tokentrail.snapshots[2]" in caplog.text
    assert consumer._offsets.pending(("tokentrail.snapshots", 2)) == []  # the new owner delivers them


async def test_retire_can_be_turned_off():
    consumer, kafka, producer, _ = consumer_for(RecordingSink(), [clean("r-1")], retire=False)
    await consumer.run(max_rollouts=1)
    assert producer.produced == [] and kafka.committed == {("tokentrail.snapshots", 0): 1}


async def test_rollout_stream_feeds_a_trainer_and_surfaces_the_consumers_failure():
    journal = Journal()
    snaps = [clean("r-0"), masked("r-1"), masked("r-2")]
    clients = {"kafka_consumer": FakeConsumer(journal, messages_for(snaps)), "kafka_producer": FakeProducer(journal)}
    settings = ConsumerSettings(bootstrap="127.0.0.1:9", poll_timeout_s=0.01, max_mask_fraction=0.5,
                                mask_fraction_min_samples=3)
    taken = []
    with pytest.raises(MaskFractionExceeded):
        async with rollout_stream(settings, kafka_clients=clients) as stream:
            async for rollout in stream:
                taken.append(rollout.rollout_id)
    assert taken == ["r-0", "r-1"]
