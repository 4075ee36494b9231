"""Against a live broker: produce/consume, topic creation, 16 MiB-class messages, the
partitioner invariant, and the jar launcher's own up -> reuse -> status -> down cycle.

(Named ``*_live`` because pytest's default import mode cannot collect two test modules
with the same basename, and tests/unit/compose/rig/test_kafka_broker.py exists.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from schemas.kafka.admin import ensure_topics
from schemas.kafka.config import PARTITIONER as PRODUCER_PARTITIONER
from schemas.kafka.topics import MAX_MESSAGE_BYTES, ROLLOUT_EVENTS_RETENTION_MS, TopicNames, key_for

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[4]


def _unique(prefix: str) -> str:
    return f"test.{prefix}.{uuid.uuid4().hex[:8]}"


def _create_topic(bootstrap: str, flavor: str, name: str, partitions: int = 4,
                  config: dict[str, str] | None = None) -> None:
    if flavor == "mock":  # the mock has no CreateTopics; it auto-creates with 4 partitions
        return
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=-1, config=config or {})])
    futures[name].result(timeout=30)


def _consume(bootstrap: str, topic: str, n: int, **extra) -> list:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": _unique("group"),
                         "auto.offset.reset": "earliest", "enable.auto.commit": False, **extra})
    consumer.subscribe([topic])
    got = []
    try:
        for _ in range(60):  # up to ~60 s; returns as soon as n messages are in
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append(msg)
            if len(got) == n:
                break
    finally:
        consumer.close()
    return got


def _producer(bootstrap: str, **extra) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                     "partitioner": PRODUCER_PARTITIONER, **extra})


def _produce_sync(producer: Producer, topic: str, key: bytes, value: bytes) -> tuple[int, int]:
    delivered = []
    producer.produce(topic, key=key, value=value,
                     on_delivery=lambda err, msg: delivered.append((err, msg)))
    producer.flush(30)
    (err, msg), = delivered
    assert err is None, err
    return msg.partition(), msg.offset()


def test_produce_and_consume_one_message(kafka_bootstrap: str, kafka_flavor: str) -> None:
    topic = _unique("roundtrip")
    _create_topic(kafka_bootstrap, kafka_flavor, topic)
    _produce_sync(_producer(kafka_bootstrap), topic, key_for("rollout-1"), b"hello")
    (msg,) = _consume(kafka_bootstrap, topic, 1)
    assert (msg.key(), msg.value()) == (b"rollout-1", b"hello")


@pytest.mark.real_broker
def test_ensure_topics_creates_four_topics_with_their_configs(kafka_bootstrap: str) -> None:
    suffix = uuid.uuid4().hex[:8]
    names = TopicNames(rollout_events=f"test.events.{suffix}", snapshots=f"test.snap.{suffix}",
                       rebuilt=f"test.rebuilt.{suffix}", deadletter=f"test.dlq.{suffix}")
    ensure_topics(kafka_bootstrap, names, partitions=4)
    ensure_topics(kafka_bootstrap, names, partitions=4)  # idempotent: already exists is success

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    topics = admin.list_topics(timeout=10).topics
    all_names = [names.rollout_events, names.snapshots, names.rebuilt, names.deadletter]
    for name in all_names:
        assert len(topics[name].partitions) == 4, name
    resources = [ConfigResource("topic", name) for name in all_names]
    configs = {res.name: fut.result(timeout=30) for res, fut in admin.describe_configs(resources).items()}
    assert configs[names.rollout_events]["retention.ms"].value == str(ROLLOUT_EVENTS_RETENTION_MS)
    for name in (names.rollout_events, names.snapshots, names.rebuilt):
        assert configs[name]["max.message.bytes"].value == str(MAX_MESSAGE_BYTES), name


@pytest.mark.real_broker
def test_ten_mib_message_round_trips(kafka_bootstrap: str, kafka_flavor: str) -> None:
    topic = _unique("big")
    _create_topic(kafka_bootstrap, kafka_flavor, topic, partitions=1,
                  config={"max.message.bytes": str(MAX_MESSAGE_BYTES)})
    value = os.urandom(10 * 1024 * 1024)  # incompressible, so the broker sees all of it
    producer = _producer(kafka_bootstrap, **{"message.max.bytes": MAX_MESSAGE_BYTES + 65536})
    _produce_sync(producer, topic, b"big-rollout", value)
    (msg,) = _consume(kafka_bootstrap, topic, 1, **{"fetch.max.bytes": 2 * MAX_MESSAGE_BYTES,
                                                   "max.partition.fetch.bytes": 2 * MAX_MESSAGE_BYTES})
    assert msg.value() == value


async def test_confluent_murmur2_and_aiokafka_agree_on_partitions(kafka_bootstrap: str,
                                                                  kafka_flavor: str) -> None:
    # ARCHITECTURE §4: all events of a rollout on one partition, whoever produces them.
    from aiokafka import AIOKafkaProducer
    from aiokafka.partitioner import DefaultPartitioner

    topic = _unique("partitioner")
    _create_topic(kafka_bootstrap, kafka_flavor, topic, partitions=4)
    keys = [key_for(f"rollout-{i}") for i in range(8)]
    producer = _producer(kafka_bootstrap)
    confluent = [_produce_sync(producer, topic, key, b"x")[0] for key in keys]

    aio = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await aio.start()
    try:
        aiokafka_sent = [(await aio.send_and_wait(topic, b"x", key=key)).partition for key in keys]
    finally:
        await aio.stop()
    partitions = list(range(4))
    aiokafka_default = [DefaultPartitioner()(key, partitions, partitions) for key in keys]

    assert confluent == aiokafka_sent == aiokafka_default
    assert len(set(confluent)) > 1  # a non-trivial spread, not everything on one partition


# ---------------------------------------------------------------- the launcher itself

def _tokentrail(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "compose.cli", *args], capture_output=True,
                          text=True, cwd=REPO_ROOT, timeout=180)


def test_jar_broker_up_reuse_status_down(tmp_path: Path) -> None:
    from compose.rig.kafka.broker import BrokerError, ensure_jars, find_java

    try:
        find_java()
        ensure_jars()
    except BrokerError as exc:
        pytest.skip(f"the jar broker cannot run here: {exc}")
    state = tmp_path / "kafka"
    try:
        up = _tokentrail("kafka", "up", "--dir", str(state), "--partitions", "2")
        assert up.returncode == 0, up.stderr
        bootstrap = up.stdout.strip().splitlines()[-1]
        assert bootstrap.startswith("127.0.0.1:")
        print(f"jar broker: {up.stderr.strip()}")  # includes the launch-to-ready time

        # The broker outlived the `up` process and answers; a second `up` reuses it.
        again = _tokentrail("kafka", "up", "--dir", str(state))
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip().splitlines()[-1] == bootstrap
        assert "reusing" in again.stderr

        status = _tokentrail("kafka", "status", "--dir", str(state))
        assert status.returncode == 0 and status.stdout.startswith(bootstrap)
        md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
        assert md.brokers
    finally:
        down = _tokentrail("kafka", "down", "--dir", str(state))
    assert down.returncode == 0 and down.stdout.strip() == "stopped"
    assert not (state / "broker.json").exists() and not (state / "data").exists()
    after = _tokentrail("kafka", "status", "--dir", str(state))
    assert after.returncode == 3 and after.stdout.strip() == "not running"
