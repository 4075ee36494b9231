"""Kafka trainer sink: rebuilt rollouts as Avro ``RebuiltRollout`` records on ``tokentrail.rebuilt``.

Each record is single-object encoded (``schemas.codec.encode_rebuilt``), keyed by
the UTF-8 rollout id, produced idempotently with ``acks=all`` and the
``murmur2_random`` partitioner, and ``deliver`` returns only once the broker
acknowledged it. Readers deduplicate by ``(snapshot_id, version)``: after a
consumer crash the same rollout can be produced again (at-least-once); within
one process a repeated delivery is skipped.

A record larger than the topic's limit (the projection grows with calls x
tokens) is sent without its projection, with a warning. A record still too
large is sent masked (``record_too_large``, naming the size, the limit and the
fix) without its trajectory and detail (and, if that is not enough, without its
result, quoted by size): the evidence stays on rollout-events, where replay
rebuilds it, and the consumer goes on. A record's content never stops the sink:
every record passes ``consumers.rebuild.validity.checked_record`` first (a
result that is not JSON, a non-finite number: masked with the reason).

The producer is the one Kafka bridge, ``schemas.kafka.bridge.AckedProducer``
(also used by the NeMo Gym adapters, the interceptor and the consumer's retire
path), configured by ``schemas.kafka.config.producer_config``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import OrderedDict

from consumers.rebuild.validity import checked_record
from schemas.codec import encode_rebuilt
from schemas.errors import TransportError
from schemas.kafka.bridge import AckedProducer
from schemas.kafka.config import producer_config
from schemas.kafka.framing import value_limit
from schemas.kafka.security import KafkaSecurity
from schemas.kafka.topics import MAX_MESSAGE_BYTES, REBUILT, key_for
from schemas.records import MaskCode, MaskReason, RebuiltRollout

log = logging.getLogger("tokentrail.consumer.kafka_sink")

_RECENT = 100_000  # identities remembered to skip in-process redeliveries


class KafkaSink:
    """``TrainerSink`` that produces to a Kafka topic and awaits ``acks=all``."""

    def __init__(self, bootstrap: str, topic: str = REBUILT, include_response: bool = True,
                 max_in_flight: int = 16, delivery_timeout_s: float = 30.0,
                 max_message_bytes: int = MAX_MESSAGE_BYTES,
                 security: KafkaSecurity | None = None) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight={max_in_flight}: must be >= 1")
        self.topic = topic
        self.include_response = include_response
        self.max_in_flight = max_in_flight
        self.idempotent_across_restarts = False  # at-least-once on the topic: readers deduplicate by identity
        self.max_message_bytes = max_message_bytes
        self._limit = value_limit(max_message_bytes)  # the topic limit bounds the whole batch, not only the value
        self.projections_dropped = 0
        self.records_shrunk = 0
        self._recent: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._producer = AckedProducer(producer_config(bootstrap, delivery_timeout_ms=int(delivery_timeout_s * 1000),
                                                       max_message_bytes=max_message_bytes, security=security))

    async def deliver(self, rollout: RebuiltRollout) -> None:
        identity = (rollout.snapshot_id, rollout.version)
        if identity in self._recent:
            return
        await self._producer.produce(self.topic, key_for(rollout.rollout_id), self._encode(rollout))
        self._recent[identity] = None
        while len(self._recent) > _RECENT:
            self._recent.popitem(last=False)

    def _encode(self, rollout: RebuiltRollout) -> bytes:
        rollout = checked_record(rollout)
        if not self.include_response and rollout.response_json is not None:
            rollout = dataclasses.replace(rollout, response_json=None)
        data = encode_rebuilt(rollout)
        if len(data) > self._limit and rollout.response_json is not None:
            log.warning("rollout %s: %d bytes with its projection, over %d; sent without the projection",
                        rollout.rollout_id, len(data), self._limit)
            self.projections_dropped += 1
            rollout = dataclasses.replace(rollout, response_json=None)
            data = encode_rebuilt(rollout)
        if len(data) > self._limit:
            data = self._too_large(rollout, len(data))
        return data

    def _too_large(self, rollout: RebuiltRollout, size: int) -> bytes:
        """The record masked and shrunk to fit the topic (the log keeps the evidence); raises only if nothing fits."""
        reason = MaskReason(
            code=MaskCode.RECORD_TOO_LARGE,
            detail=(f"the rebuilt record is {size} bytes without its projection, over the {self._limit}-byte limit "
                    f"of {self.topic} (max_message_bytes={self.max_message_bytes} less headroom); sent without its "
                    "trajectory and detail. Raise max.message.bytes on the topic and max_message_bytes of the sink, "
                    "or use the JSONL sink; `tokentrail replay --rollout` rebuilds it from rollout-events."),
        )
        metrics = dataclasses.replace(rollout.metrics, detail_json="{}")
        shrunk = dataclasses.replace(rollout, mask_sample=True, mask_reasons=[*rollout.mask_reasons, reason],
                                     trajectory=None, response_json=None, metrics=metrics)
        data = encode_rebuilt(shrunk)
        if len(data) > self._limit:
            shrunk = dataclasses.replace(shrunk, result_json=json.dumps(
                f"withheld: the result is {len(rollout.result_json)} characters, over what {self.topic} holds"))
            data = encode_rebuilt(shrunk)
        if len(data) > self._limit:
            raise TransportError(f"rollout {rollout.rollout_id} encodes to {len(data)} bytes even without its "
                                 f"trajectory, detail and result, over the {self._limit}-byte limit of {self.topic}")
        log.warning("rollout %s: %d bytes without the projection, over %d; sent masked (record_too_large)",
                    rollout.rollout_id, size, self._limit)
        self.records_shrunk += 1
        return data

    async def close(self) -> None:
        await self._producer.close()  # every deliver awaited its ack: this flushes only cancelled ones
