"""The consumer's startup topic check: which topics it needs, and that `run` stops before polling (no broker)."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from consumers.loop import RebuildConsumer, check_topics, required_topics
from consumers.settings import ConsumerSettings
from consumers.trainer_stream import rollout_stream
from schemas.kafka.topics import REBUILT, TopicsUnavailable, topic_names
from tests.unit.consumers.fakes import FakeConsumer, FakeProducer, Journal, RecordingSink

REPO = Path(__file__).resolve().parents[3]
NAMES = topic_names("c1.")


@dataclass
class Meta:
    error: object = None


@dataclass
class Metadata:
    topics: dict
    brokers: dict = field(default_factory=lambda: {1: "b"})


class FakeAdmin:
    def __init__(self, topics: set[str]) -> None:
        self.topics = topics
        self.calls = 0

    def list_topics(self, timeout: float) -> Metadata:
        self.calls += 1
        return Metadata({name: Meta() for name in self.topics})


def settings(**kw) -> ConsumerSettings:
    return ConsumerSettings(**{"bootstrap": "127.0.0.1:9", "topics": NAMES, "poll_timeout_s": 0.01,
                               "topic_wait_s": 0, **kw})


def test_the_consumer_needs_snapshots_dead_letters_and_rollout_events_to_retire():
    assert required_topics(settings()) == [NAMES.snapshots, NAMES.deadletter, NAMES.rollout_events]
    assert required_topics(settings(retire=False)) == [NAMES.snapshots, NAMES.deadletter]


def test_a_kafka_sink_the_settings_build_on_this_cluster_needs_its_topic():
    same = settings(sink="kafka", sink_kwargs={"bootstrap": "127.0.0.1:9", "topic": NAMES.rebuilt})
    assert required_topics(same)[-1] == NAMES.rebuilt
    other = settings(sink="kafka", sink_kwargs={"bootstrap": "elsewhere:9092", "topic": "x"})
    assert "x" not in required_topics(other)
    # no kwargs: the sink object is built by the caller (it may be on another cluster)
    assert REBUILT not in required_topics(settings(sink="kafka"))


def test_the_grouped_kafka_sink_on_this_cluster_needs_the_groups_topic():
    grouped = settings(sink="kafka-groups", sink_kwargs={"bootstrap": "127.0.0.1:9", "topic": NAMES.rebuilt_groups})
    assert required_topics(grouped)[-1] == NAMES.rebuilt_groups


def test_a_missing_kafka_sink_topic_is_named():
    s = settings(sink="kafka", sink_kwargs={"bootstrap": "127.0.0.1:9", "topic": NAMES.rebuilt})
    with pytest.raises(TopicsUnavailable) as info:
        check_topics(s, admin=FakeAdmin({NAMES.snapshots, NAMES.deadletter, NAMES.rollout_events}))
    assert info.value.missing == (NAMES.rebuilt,)


def test_check_topics_names_what_is_missing():
    with pytest.raises(TopicsUnavailable) as info:
        check_topics(settings(), admin=FakeAdmin({NAMES.snapshots}))
    assert info.value.missing == (NAMES.deadletter, NAMES.rollout_events)
    assert "`tokentrail topics --bootstrap 127.0.0.1:9 --topic-prefix c1.`" in str(info.value)
    check_topics(settings(), admin=FakeAdmin({NAMES.snapshots, NAMES.deadletter, NAMES.rollout_events}))


async def test_run_stops_before_the_first_poll_when_a_topic_is_missing():
    journal = Journal()
    admin = FakeAdmin({NAMES.deadletter})
    s = settings()
    consumer = RebuildConsumer(s, RecordingSink(journal), kafka_consumer=FakeConsumer(journal, []),
                               kafka_producer=FakeProducer(journal),
                               topic_check=lambda st: check_topics(st, admin=admin))
    with pytest.raises(TopicsUnavailable, match=NAMES.snapshots):
        await consumer.run(max_rollouts=1)
    assert journal.entries == [] and admin.calls == 1  # never polled


async def test_the_check_runs_once_and_only_when_asked():
    journal = Journal()
    admin = FakeAdmin({NAMES.snapshots, NAMES.deadletter, NAMES.rollout_events})
    consumer = RebuildConsumer(settings(), RecordingSink(journal), kafka_consumer=FakeConsumer(journal, []),
                               kafka_producer=FakeProducer(journal),
                               topic_check=lambda st: check_topics(st, admin=admin))
    await consumer.run(max_rollouts=0)
    await consumer.run(max_rollouts=0)
    assert admin.calls == 1
    # replaced clients and no topic_check: no check (the unit tests' fakes have no broker)
    plain = RebuildConsumer(settings(), RecordingSink(journal), kafka_consumer=FakeConsumer(journal, []),
                            kafka_producer=FakeProducer(journal))
    await plain.run(max_rollouts=0)


async def test_rollout_stream_surfaces_missing_topics_to_the_trainer():
    admin = FakeAdmin(set())
    journal = Journal()
    clients = {"kafka_consumer": FakeConsumer(journal, []), "kafka_producer": FakeProducer(journal),
               "topic_check": lambda st: check_topics(st, admin=admin)}
    with pytest.raises(TopicsUnavailable):
        async with rollout_stream(settings(), kafka_clients=clients) as stream:
            async for _ in stream:
                pass


def test_consume_without_a_broker_exits_4_within_its_wait(tmp_path):
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "compose.cli", "consume", "--bootstrap", "127.0.0.1:1", "--sink", "jsonl",
         "--sink-path", str(tmp_path / "out.jsonl"), "--topic-prefix", "nb.", "--topic-wait", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 4, out.stderr
    assert "tokentrail consume: no Kafka broker answered at 127.0.0.1:1 within 1 s" in out.stderr
    assert "tokentrail topics --bootstrap 127.0.0.1:1 --topic-prefix nb." in out.stderr
    assert "Traceback" not in out.stderr
    assert time.monotonic() - start < 30
