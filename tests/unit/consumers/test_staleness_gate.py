"""max_staleness in the consumer loop (consumers.staleness_gate) with in-memory Kafka clients."""

from __future__ import annotations

import json

import httpx
import pytest

from consumers.loop import RebuildConsumer
from consumers.rebuild import rebuild
from consumers.settings import ConsumerSettings
from schemas.codec import decode_event, encode_rebuilt
from schemas.errors import ConfigError
from schemas.policy_versions import PolicyVersion, VersionBook
from schemas.records import MaskCode, RetireRequested, VersionSpan
from tests.unit.consumers.fakes import FakeConsumer, FakeProducer, Journal, RecordingSink, messages_for
from tests.unit.consumers.support import declared, root, snapshot_of


def of_version(rid: str, version: str):
    r = root([1, 2], [3, 4], facts={"version_spans": [VersionSpan(version=version, start=0, end=2)],
                                    "version_spans_source": "observed", "dispatch_version": version})
    return snapshot_of(r, rollout=rid, finish=declared(r))


def announced(*steps: int) -> VersionBook:
    return VersionBook([PolicyVersion(label=f"v{s}", step=s) for s in steps])


def consumer_for(snapshots, versions, journal=None, **settings):
    journal = journal or Journal()
    sink = RecordingSink(journal)
    producer = FakeProducer(journal)
    s = ConsumerSettings(bootstrap="127.0.0.1:9", poll_timeout_s=0.01, shutdown_grace_s=0.2, **settings)
    consumer = RebuildConsumer(s, sink, kafka_consumer=FakeConsumer(journal, messages_for(snapshots)),
                               kafka_producer=producer, versions=versions)
    return consumer, sink, producer, journal


def codes(rollout) -> list[str]:
    return [r.code for r in rollout.mask_reasons]


async def test_a_stale_rollout_is_delivered_masked_and_its_staleness_is_in_the_capture_and_metrics():
    consumer, sink, _, _ = consumer_for([of_version("r-old", "v0"), of_version("r-new", "v2")], announced(0, 1, 2),
                                        max_staleness=1)
    stats = await consumer.run(max_rollouts=2)
    old, new = sink.delivered
    assert codes(old) == [MaskCode.STALE_POLICY] and not new.mask_sample
    assert (stats.masked, stats.mask_reasons[MaskCode.STALE_POLICY]) == (1, 1)
    detail = json.loads(old.metrics.detail_json)
    assert (detail["policy_staleness"], detail["oldest_policy_version"], detail["current_policy_version"]) == (
        2, "v0", "v2")
    text = consumer.metrics.render().decode()
    assert "tokentrail_consumer_policy_staleness_count 2.0" in text
    assert 'tokentrail_consumer_stale_rollouts_total{outcome="masked"} 1.0' in text


async def test_staleness_is_judged_against_the_version_current_at_delivery():
    book = announced(0)
    consumer, sink, _, journal = consumer_for([of_version("r-1", "v0"), of_version("r-2", "v0")], book,
                                              max_staleness=0)
    await consumer.run(max_rollouts=1)
    book.apply(PolicyVersion(label="v1", step=1))  # the trainer moved on while r-2 waited
    await consumer.run(max_rollouts=2)
    first, second = sink.delivered
    assert not first.mask_sample and codes(second) == [MaskCode.STALE_POLICY]


async def test_a_dropped_rollout_is_retired_and_committed_but_never_delivered():
    stale, fresh = of_version("r-stale", "v0"), of_version("r-fresh", "v3")
    consumer, sink, producer, journal = consumer_for([stale, fresh], announced(0, 3), max_staleness=1,
                                                     stale_action="drop")
    stats = await consumer.run(max_rollouts=1)
    assert [r.rollout_id for r in sink.delivered] == ["r-fresh"]
    steps = [e for e in journal.entries if e[0] != "poll"]
    assert steps == [("produce", "tokentrail.rollout-events"), ("commit", 0, 1),
                     ("deliver", "r-fresh"), ("produce", "tokentrail.rollout-events"), ("commit", 0, 2)]
    retire = decode_event(producer.produced[0][2])
    assert isinstance(retire.body, RetireRequested)
    assert (retire.rollout_id, retire.body.snapshot_id, retire.body.version) == (
        "r-stale", stale.snapshot_id, stale.version)
    assert (stats.rebuilt, stats.delivered, stats.dropped, stats.masked) == (2, 1, 1, 1)
    assert stats.mask_reasons == {MaskCode.STALE_POLICY: 1}
    assert 'tokentrail_consumer_stale_rollouts_total{outcome="dropped"} 1.0' in consumer.metrics.render().decode()


async def test_dropped_rollouts_count_towards_max_mask_fraction():
    snaps = [of_version(f"r-{i}", "v0") for i in range(3)]
    consumer, sink, _, _ = consumer_for(snaps, announced(0, 5), max_staleness=1, stale_action="drop",
                                        max_mask_fraction=0.5, mask_fraction_min_samples=2)
    with pytest.raises(Exception, match="stale_policy: 2"):
        await consumer.run(max_rollouts=3)
    assert sink.delivered == []


async def test_an_unannounced_version_is_delivered_masked_even_under_drop():
    consumer, sink, _, _ = consumer_for([of_version("r-1", "mystery")], announced(0, 1), max_staleness=1,
                                        stale_action="drop")
    await consumer.run(max_rollouts=1)
    (out,) = sink.delivered
    assert codes(out) == [MaskCode.UNKNOWN_POLICY_VERSION]


async def test_without_announcements_or_a_book_the_record_is_a_plain_rebuild():
    snap = of_version("r-1", "v0")
    for versions in (None, VersionBook()):
        consumer, sink, _, _ = consumer_for([snap], versions)
        await consumer.run(max_rollouts=1)
        assert encode_rebuilt(sink.delivered[0]) == encode_rebuilt(rebuild(snap))


async def test_announcements_without_a_bound_only_report_staleness():
    consumer, sink, _, _ = consumer_for([of_version("r-1", "v0")], announced(0, 7))
    await consumer.run(max_rollouts=1)
    (out,) = sink.delivered
    assert not out.mask_sample and json.loads(out.metrics.detail_json)["policy_staleness"] == 7


def test_max_staleness_with_replaced_clients_needs_a_versions_source():
    s = ConsumerSettings(bootstrap="127.0.0.1:9", max_staleness=1)
    journal = Journal()
    with pytest.raises(ConfigError, match="versions=VersionBook"):
        RebuildConsumer(s, RecordingSink(journal), kafka_consumer=FakeConsumer(journal, []),
                        kafka_producer=FakeProducer(journal))


async def test_metrics_are_served_on_the_metrics_port():
    consumer, _, _, _ = consumer_for([of_version("r-1", "v0")], announced(0, 2), metrics_port=0)
    try:
        await consumer.run(max_rollouts=1)
        async with httpx.AsyncClient() as client:
            r = await client.get(f"http://127.0.0.1:{consumer.metrics.port}/metrics")
        assert 'tokentrail_consumer_policy_staleness_bucket{le="2.0"} 1.0' in r.text
    finally:
        consumer.metrics.close()


def test_max_staleness_makes_the_versions_topic_required_and_names_the_command():
    from consumers.loop import check_topics, required_topics
    from schemas.kafka.topics import TopicsUnavailable, topic_names

    names = topic_names("p.")
    plain = ConsumerSettings(bootstrap="127.0.0.1:9", topics=names)
    bounded = ConsumerSettings(bootstrap="127.0.0.1:9", topics=names, max_staleness=1, topic_wait_s=0)
    assert names.policy_versions not in required_topics(plain)
    assert names.policy_versions in required_topics(bounded)

    class Admin:  # every topic but the versions one
        def list_topics(self, timeout):
            topics = {t: type("T", (), {"error": None})() for t in required_topics(plain)}
            return type("M", (), {"brokers": {1: object()}, "topics": topics})()

    with pytest.raises(TopicsUnavailable, match=r"p\.tokentrail\.policy-versions.*tokentrail topics"):
        check_topics(bounded, admin=Admin())
