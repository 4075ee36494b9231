"""schemas.kafka.config is the one place for Kafka client settings: every caller's effective config comes from it.

Each caller is built with confluent-kafka's Producer replaced by a recorder, and the
config it handed over must equal ``producer_config`` with that caller's documented
keywords, and nothing else. The builder itself is pure (tests/unit/test_architecture.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import schemas.kafka.bridge as bridge
from schemas.errors import CodecError
from schemas.kafka.config import (
    PARTITIONER,
    QUIET_LOGGER,
    admin_config,
    consumer_config,
    delivery_timeout_s,
    producer_config,
)
from schemas.kafka.topics import MAX_MESSAGE_BYTES

BOOT = "127.0.0.1:9"


class RecordingProducer:
    """Stands in for confluent_kafka.Producer: keeps the config, acks every record on the next poll/flush."""

    configs: list[dict[str, Any]] = []

    def __init__(self, config: dict[str, Any]) -> None:
        RecordingProducer.configs.append(dict(config))
        self.sent: list[tuple[str, Any, bytes, Any]] = []
        self._pending: list[Any] = []

    def produce(self, topic, key=None, value=None, headers=None, on_delivery=None):
        self.sent.append((topic, key, value, headers))
        self._pending.append(on_delivery)

    def poll(self, timeout: float = 0) -> int:
        pending, self._pending = self._pending, []
        for callback in pending:
            callback(None, None)
        return len(pending)

    def flush(self, timeout: float = 0) -> int:
        self.poll()
        return 0


@pytest.fixture
def recorded(monkeypatch):
    RecordingProducer.configs = []
    monkeypatch.setattr(bridge.confluent_kafka, "Producer", RecordingProducer)
    return RecordingProducer.configs


def test_the_contract_settings_are_fixed():
    config = producer_config(BOOT)
    assert config == {
        "bootstrap.servers": BOOT, "enable.idempotence": True, "acks": "all", "partitioner": PARTITIONER,
        "linger.ms": 1.0, "message.max.bytes": MAX_MESSAGE_BYTES, "delivery.timeout.ms": 30_000,
        "request.timeout.ms": 30_000, "compression.type": "none", "socket.nagle.disable": True,
    }
    assert PARTITIONER == "murmur2_random"  # Java's / aiokafka's / Faust's partitioner, not librdkafka's CRC32
    assert producer_config(BOOT, delivery_timeout_ms=5_000)["request.timeout.ms"] == 5_000
    assert producer_config(BOOT, delivery_timeout_ms=120_000)["request.timeout.ms"] == 30_000
    assert producer_config(BOOT, extra={"batch.size": 1})["batch.size"] == 1
    for key, value in (("acks", "1"), ("enable.idempotence", False), ("partitioner", "consistent_random")):
        with pytest.raises(ValueError, match=key):
            producer_config(BOOT, extra={key: value})
    assert delivery_timeout_s(producer_config(BOOT, delivery_timeout_ms=7_000)) == 7.0
    assert delivery_timeout_s({}) == 300.0  # librdkafka's default


def test_reader_and_admin_settings():
    config = consumer_config(BOOT, "g", partition_eof=True, session_timeout_ms=6000)
    assert config["enable.auto.commit"] is False and config["isolation.level"] == "read_committed"
    assert config["fetch.message.max.bytes"] == config["max.partition.fetch.bytes"] == MAX_MESSAGE_BYTES
    assert config["enable.partition.eof"] is True and config["session.timeout.ms"] == 6000
    assert "enable.partition.eof" not in consumer_config(BOOT, "g")
    with pytest.raises(ValueError, match="enable.auto.commit"):
        consumer_config(BOOT, "g", extra={"enable.auto.commit": True})
    assert admin_config(BOOT) == {"bootstrap.servers": BOOT, "reconnect.backoff.max.ms": 1000, "logger": QUIET_LOGGER}
    assert QUIET_LOGGER.disabled


async def test_the_interceptor_publisher_uses_the_builder(recorded):
    from producers.http.app import Interceptor
    from producers.settings import InterceptorSettings

    # The interceptor passes its linger_ms and publish_timeout_ms settings (latency knobs of the capture path).
    app = Interceptor(InterceptorSettings(bootstrap=BOOT, upstream_url="http://127.0.0.1:9", linger_ms=2,
                                          publish_timeout_ms=10_000, follow_versions=False))
    await app.startup()
    await app.shutdown()
    assert recorded == [producer_config(BOOT, linger_ms=2, delivery_timeout_ms=10_000)]


def test_the_kafka_sink_uses_the_builder(recorded):
    from consumers.sinks.kafka import KafkaSink

    KafkaSink(BOOT)
    KafkaSink(BOOT, delivery_timeout_s=5.0, max_message_bytes=1 << 20)
    assert recorded == [producer_config(BOOT),
                        producer_config(BOOT, delivery_timeout_ms=5_000, max_message_bytes=1 << 20)]


def test_the_consumer_retire_path_uses_the_builder(recorded):
    from consumers.loop import RebuildConsumer
    from consumers.settings import ConsumerSettings
    from tests.unit.consumers.fakes import FakeConsumer, Journal, RecordingSink

    RebuildConsumer(ConsumerSettings(bootstrap=BOOT), RecordingSink(), kafka_consumer=FakeConsumer(Journal(), []))
    # linger 0: each retire / dead letter is produced and waited for alone, there is nothing to batch.
    assert recorded == [producer_config(BOOT, linger_ms=0)]


def test_the_gym_adapters_use_the_builder(recorded):
    from consumers.gym.adapters import TokenSink

    sink = TokenSink(BOOT)

    async def publish() -> None:
        await sink._client.publish("rollout-cfg", None)

    # a None body does not encode; the producer was built first
    with pytest.raises(CodecError, match="cannot encode RolloutEvent"):
        asyncio.run(publish())
    assert recorded == [producer_config(BOOT)]


def test_compose_produce_all_goes_through_the_bridge(recorded):
    from schemas.kafka.admin import produce_all

    producer = RecordingProducer(producer_config(BOOT, linger_ms=20))
    produce_all(producer, "t", [(b"k", b"v"), (b"k2", b"v2")])
    assert producer.sent == [("t", b"k", b"v", None), ("t", b"k2", b"v2", None)]
