"""Kafka trainer sink: rebuilt rollouts as Avro ``RebuiltRollout`` records on ``tokentrail.rebuilt``.

Each record is single-object encoded (``schemas.codec.encode_rebuilt``), keyed by
the UTF-8 rollout id, produced idempotently with ``acks=all`` and the
``murmur2_random`` partitioner, and ``deliver`` returns only once the broker
acknowledged it. Readers deduplicate by ``(snapshot_id, version)``: after a
consumer crash the same rollout can be produced again (at-least-once); within
one process a repeated delivery is skipped.

A record larger than the topic's limit (the projection grows with calls x
tokens) is sent without its projection, with a warning; the compact trajectory
is always there. A record still too large fails ``deliver`` with the size.

Records are produced with the interceptor's ``KafkaPublisher`` (also used by the
NeMo Gym adapters): confluent-kafka's synchronous ``Producer`` plus a poll
thread that resolves asyncio futures (``reference/stack.md`` §3).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict

from producers.publisher import KafkaPublisher, producer_config
from schemas.codec import encode_rebuilt
from schemas.errors import TransportError
from schemas.records import RebuiltRollout
from schemas.topics import MAX_MESSAGE_BYTES, REBUILT, key_for

log = logging.getLogger("tokentrail.consumer.kafka_sink")

_RECENT = 100_000  # identities remembered to skip in-process redeliveries
_HEADROOM = 64 * 1024  # the topic limit applies to a whole record batch, not only the value


class KafkaSink:
    """``TrainerSink`` that produces to a Kafka topic and awaits ``acks=all``."""

    def __init__(self, bootstrap: str, topic: str = REBUILT, include_response: bool = True,
                 max_in_flight: int = 16, delivery_timeout_s: float = 30.0,
                 max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight={max_in_flight}: must be >= 1")
        self.topic = topic
        self.include_response = include_response
        self.max_in_flight = max_in_flight
        self.idempotent_across_restarts = False  # at-least-once on the topic: readers deduplicate by identity
        self.max_message_bytes = max_message_bytes
        self._limit = max_message_bytes - _HEADROOM
        self.projections_dropped = 0
        self._recent: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._producer = KafkaPublisher(producer_config(
            bootstrap, delivery_timeout_ms=int(delivery_timeout_s * 1000), max_message_bytes=max_message_bytes))

    async def deliver(self, rollout: RebuiltRollout) -> None:
        identity = (rollout.snapshot_id, rollout.version)
        if identity in self._recent:
            return
        await self._producer.publish_raw(self.topic, key_for(rollout.rollout_id), self._encode(rollout))
        self._recent[identity] = None
        while len(self._recent) > _RECENT:
            self._recent.popitem(last=False)

    def _encode(self, rollout: RebuiltRollout) -> bytes:
        if not self.include_response and rollout.response_json is not None:
            rollout = dataclasses.replace(rollout, response_json=None)
        data = encode_rebuilt(rollout)
        if len(data) > self._limit and rollout.response_json is not None:
            log.warning("rollout %s: %d bytes with its projection, over %d; sent without the projection",
                        rollout.rollout_id, len(data), self._limit)
            self.projections_dropped += 1
            data = encode_rebuilt(dataclasses.replace(rollout, response_json=None))
        if len(data) > self._limit:
            raise TransportError(f"rollout {rollout.rollout_id} encodes to {len(data)} bytes, over the "
                                 f"{self._limit}-byte limit of {self.topic}")
        return data

    async def close(self) -> None:
        await self._producer.close()
