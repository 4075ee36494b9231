"""Publish events to Kafka and await ``acks=all`` from asyncio: the interceptor's face of the Kafka bridge.

``KafkaPublisher`` is ``schemas.kafka.bridge.AckedProducer`` (one acked producer
for the whole system) plus ``publish(topic, event)``, which encodes a
``RolloutEvent`` and keys it by its rollout id. ``publish``/``publish_raw``
return ``(partition, offset)`` only once the broker acknowledged the record;
any failure raises ``PublishFailed`` (a ``TransportError``) that says whether the
record may have been persisted anyway (its ack was lost) and whether a retry
can ever succeed. Events of one rollout are produced in call order from one
producer, so they are acknowledged in that order.

``producer_config`` is ``schemas.kafka.config.producer_config``: the interceptor
passes its ``linger_ms`` and ``publish_timeout_ms`` settings as keywords.
"""

from __future__ import annotations

from typing import Any

from schemas.codec import encode_event
from schemas.kafka.bridge import AckedProducer, PublishFailed
from schemas.kafka.config import producer_config
from schemas.records import RolloutEvent
from schemas.kafka.topics import key_for

__all__ = ["KafkaPublisher", "PublishFailed", "producer_config"]


class KafkaPublisher(AckedProducer):
    """Thread-bridged idempotent producer; ``await publish(...)`` resolves on the broker's ack."""

    def __init__(self, config: dict[str, Any], *, client: Any = None) -> None:
        super().__init__(config, client=client, name="kafka-publisher-poll")

    async def publish_raw(self, topic: str, key: bytes, value: bytes) -> tuple[int, int]:
        """Produce one record; return (partition, offset) once acknowledged by all in-sync replicas."""
        return await self.produce(topic, key, value)

    async def publish(self, topic: str, event: RolloutEvent) -> tuple[int, int]:
        return await self.produce(topic, key_for(event.rollout_id), encode_event(event))
