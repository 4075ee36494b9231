"""The rebuild consumer: snapshots in, rebuilt rollouts to a sink, then retire.

For each snapshot, in partition order: rebuild (pure) → ``sink.deliver`` (durable
when it returns) → publish ``RetireRequested(snapshot_id, version)`` and await
its ack → commit the snapshot's offset. A crash anywhere before the commit
re-delivers the snapshot (sinks are idempotent by snapshot identity); nothing
is ever committed that was not delivered. An undecodable snapshot goes to the
dead-letter topic with the reason and the stream goes on.

Masked rollouts are delivered and retired too: the rollout-events topic keeps
the evidence (``tokentrail replay`` rebuilds any of them), so the processor's
state stays bounded.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka

from consumers.rebuild import RebuildRules, rebuild
from consumers.settings import ConsumerSettings
from consumers.sinks import TrainerSink
from schemas.codec import decode_snapshot, encode_event
from schemas.errors import CodecError, TransportError
from schemas.ids import new_event_id
from schemas.records import RebuiltRollout, RetireRequested, RolloutEvent
from schemas.topics import MAX_MESSAGE_BYTES, PRODUCER_PARTITIONER, key_for

log = logging.getLogger("tokentrail.consumer")


@dataclass(slots=True)
class ConsumerStats:
    delivered: int = 0
    masked: int = 0
    deadletters: int = 0
    mask_reasons: dict[str, int] = field(default_factory=dict)


class RebuildConsumer:
    """Consumes ``tokentrail.snapshots`` in a consumer group and feeds one sink."""

    def __init__(self, settings: ConsumerSettings, sink: TrainerSink) -> None:
        self.settings = settings
        self.sink = sink
        self.rules = RebuildRules(project_response=settings.project_response)
        self.stats = ConsumerStats()
        self.source = f"consumer:{settings.group_id}@{socket.gethostname()}"
        self._consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": settings.bootstrap,
                "group.id": settings.group_id,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "fetch.message.max.bytes": MAX_MESSAGE_BYTES,
                "max.partition.fetch.bytes": MAX_MESSAGE_BYTES,
                "session.timeout.ms": settings.session_timeout_ms,
            }
        )
        self._producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": settings.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "partitioner": PRODUCER_PARTITIONER,
                "linger.ms": 0,
                "message.max.bytes": MAX_MESSAGE_BYTES,
            }
        )
        self._consumer.subscribe([settings.topics.snapshots])

    async def run(self, *, stop: asyncio.Event | None = None, max_rollouts: int | None = None) -> ConsumerStats:
        """Consume until ``stop`` is set or ``max_rollouts`` rollouts were delivered."""
        stop = stop or asyncio.Event()
        while not stop.is_set():
            if max_rollouts is not None and self.stats.delivered >= max_rollouts:
                break
            msg = await asyncio.to_thread(self._consumer.poll, self.settings.poll_timeout_s)
            if msg is None:
                continue
            if msg.error():
                log.warning("consumer error: %s", msg.error())
                continue
            await self.handle(msg)
        return self.stats

    async def handle(self, msg: Any) -> RebuiltRollout | None:
        try:
            snapshot = decode_snapshot(msg.value())
        except CodecError as exc:
            await asyncio.to_thread(self._deadletter, msg, type(exc).__name__, str(exc))
            self.stats.deadletters += 1
            await asyncio.to_thread(self._commit, msg)
            return None
        rollout = rebuild(snapshot, self.rules)
        await self.sink.deliver(rollout)
        self._count(rollout)
        if self.settings.retire:
            await asyncio.to_thread(self._retire, rollout)
        await asyncio.to_thread(self._commit, msg)
        return rollout

    def _count(self, rollout: RebuiltRollout) -> None:
        self.stats.delivered += 1
        if rollout.mask_sample:
            self.stats.masked += 1
            for reason in rollout.mask_reasons:
                self.stats.mask_reasons[reason.code] = self.stats.mask_reasons.get(reason.code, 0) + 1

    def _retire(self, rollout: RebuiltRollout) -> None:
        event = RolloutEvent(
            event_id=new_event_id(),
            rollout_id=rollout.rollout_id,
            emitted_at=_now_us(),
            source=self.source,
            body=RetireRequested(snapshot_id=rollout.snapshot_id, version=rollout.version,
                                 consumer=self.settings.group_id),
        )
        self._produce_acked(self.settings.topics.rollout_events, key_for(rollout.rollout_id), encode_event(event))

    def _deadletter(self, msg: Any, reason: str, detail: str) -> None:
        headers = [("tokentrail-reason", reason.encode()), ("tokentrail-detail", detail.encode()[:4000]),
                   ("tokentrail-source", f"{msg.topic()}/{msg.partition()}/{msg.offset()}".encode())]
        self._produce_acked(self.settings.topics.deadletter, msg.key(), msg.value(), headers)

    def _produce_acked(self, topic: str, key: bytes | None, value: bytes, headers: list | None = None) -> None:
        errors: list[Any] = []
        self._producer.produce(topic, key=key, value=value, headers=headers,
                               on_delivery=lambda err, _m: errors.append(err))
        if self._producer.flush(30) or not errors or errors[0] is not None:
            raise TransportError(f"publish to {topic} was not acknowledged: {errors[0] if errors else 'timeout'}")

    def _commit(self, msg: Any) -> None:
        self._consumer.commit(message=msg, asynchronous=False)

    async def close(self) -> None:
        await asyncio.to_thread(self._consumer.close)
        await asyncio.to_thread(self._producer.flush, 10)
        await self.sink.close()


def _now_us() -> int:
    import time

    return time.time_ns() // 1000
