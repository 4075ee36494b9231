"""The rebuild consumer: snapshots in, rebuilt rollouts to a sink, then retire and commit.

For each snapshot, in partition order: decode → ``rebuild`` (pure, in a worker
thread) → ``sink.deliver`` (durable when it returns) → publish
``RetireRequested(snapshot_id, version)`` and await its ack → commit. Up to
``max_in_flight`` deliveries may be pending at once (a grouping sink needs a
whole group in flight); a partition's offset is committed only up to its
lowest snapshot whose delivery has not returned, so nothing is ever committed
that was not delivered, and a crash anywhere re-delivers from the commit point
(sinks are idempotent by snapshot identity). An undecodable snapshot goes to the
dead-letter topic with the reason and the stream goes on.

Masked rollouts are delivered and retired too: the rollout-events topic keeps
the evidence (replay rebuilds any of them), so the processor's state stays
bounded. With ``max_mask_fraction`` set, once ``mask_fraction_min_samples``
rollouts were rebuilt, a masked fraction above the limit stops the consumer
with ``MaskFractionExceeded`` listing the mask reasons, before that rollout is
delivered.

Before its first poll, a consumer on real Kafka clients waits at most
``topic_wait_s`` for the topics it reads and writes (`required_topics`) to
exist, and otherwise raises ``TopicsUnavailable`` naming them and the
`tokentrail topics` command, instead of polling UNKNOWN_TOPIC for ever. It never
creates them: their partition count is the per-rollout ordering contract,
decided by `tokentrail topics`.

Policy staleness (``consumers.staleness_gate``): each rollout is judged right
before delivery against the version current then. A stale one is masked
``stale_policy`` or, with ``stale_action="drop"``, not delivered: it is retired
and committed as a delivered one (the log keeps its evidence for replay) and
counts as masked for ``max_mask_fraction``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka

from consumers.metrics import ConsumerMetrics
from consumers.offsets import OffsetTracker
from consumers.rebuild import rebuild
from consumers.settings import ConsumerSettings
from consumers.sinks.plugin import KAFKA_SINK_TOPICS, TrainerSink
from consumers.staleness_gate import StalenessGate
from schemas.codec import decode_snapshot, encode_event
from schemas.errors import ConfigError, ContractError, TokentrailError, TransportError
from schemas.ids import new_event_id
from schemas.kafka.bridge import AckedProducer, admin_client
from schemas.kafka.config import consumer_config, producer_config
from schemas.kafka.framing import deadletter_headers
from schemas.kafka.topics import key_for, wait_for_topics
from schemas.records import MaskCode, RebuiltRollout, RetireRequested, RolloutEvent
from schemas.stage_log import STAGES

log = logging.getLogger("tokentrail.consumer")


class MaskFractionExceeded(TokentrailError):
    """Too many rebuilt rollouts are masked: training on the rest would be training on mostly nothing."""


class DeliveryFailed(TransportError):
    """A sink's ``deliver`` raised: the rollout was not committed and will be delivered again."""


@dataclass(slots=True)
class ConsumerStats:
    rebuilt: int = 0
    delivered: int = 0
    masked: int = 0
    deadletters: int = 0
    dropped: int = 0  # stale rollouts not delivered (stale_action="drop"); also counted in masked
    mask_reasons: Counter[str] = field(default_factory=Counter)


def required_topics(settings: ConsumerSettings) -> list[str]:
    """The topics a consumer with ``settings`` reads and writes on ``settings.bootstrap``.

    Snapshots (read), dead letters, rollout-events when it retires, policy-versions when
    ``max_staleness`` is set, and the topic of the built-in Kafka sink the settings build
    (``sink`` "kafka" or "kafka-groups" with ``sink_kwargs`` naming this cluster's bootstrap
    and the topic, as `tokentrail consume` passes them); a sink object built some other way
    is the caller's to check.
    """
    topics = [settings.topics.snapshots, settings.topics.deadletter]
    if settings.retire:
        topics.append(settings.topics.rollout_events)
    if settings.max_staleness is not None:  # the bound cannot be checked without the versions
        topics.append(settings.topics.policy_versions)
    kwargs = settings.sink_kwargs
    if settings.sink in KAFKA_SINK_TOPICS and kwargs.get("bootstrap") == settings.bootstrap and kwargs.get("topic"):
        topics.append(str(kwargs["topic"]))
    return topics


def check_topics(settings: ConsumerSettings, *, admin: Any = None) -> None:
    """Return once `required_topics` exist; ``TopicsUnavailable`` after ``settings.topic_wait_s``.

    ``admin`` replaces the confluent-kafka AdminClient (tests).
    """
    if admin is None:
        admin = admin_client(settings.bootstrap, security=settings.kafka)  # quiet: the outcome reaches the caller, not librdkafka's log
    wait_for_topics(admin, required_topics(settings), bootstrap=settings.bootstrap, names=settings.topics,
                    timeout=settings.topic_wait_s)


class RebuildConsumer:
    """Consumes ``tokentrail.snapshots`` in a consumer group and feeds one sink.

    ``kafka_consumer`` / ``kafka_producer`` replace the confluent-kafka clients
    (tests); the consumer must already be subscribed. ``topic_check`` (default: on
    with a real consumer, off with a replaced one) makes the first `run` wait for
    `required_topics` with `check_topics`; a callable ``(settings) -> None`` replaces
    that check (tests). ``versions`` is where policy versions come from: a
    ``VersionBook`` or anything with a ``.book`` (a running ``VersionFollower``);
    default: the policy-versions topic, followed by `run` with real clients (see the
    module docstring), none with replaced ones.
    """

    def __init__(self, settings: ConsumerSettings, sink: TrainerSink, *, kafka_consumer: Any = None,
                 kafka_producer: Any = None,
                 topic_check: bool | Callable[[ConsumerSettings], None] | None = None,
                 versions: Any = None) -> None:
        self.settings = settings
        if versions is None and kafka_consumer is not None and settings.max_staleness is not None:
            raise ConfigError("max_staleness is set but the consumer has replaced Kafka clients and no versions "
                              "source: pass versions=VersionBook(...) (or a VersionFollower)")
        self._follow = versions is None and kafka_consumer is None
        self.metrics = ConsumerMetrics()
        self.gate = StalenessGate(settings, self.metrics, versions)
        if topic_check is None:
            topic_check = kafka_consumer is None
        self._topic_check = check_topics if topic_check is True else (topic_check or None)
        self.sink = sink
        rules = settings.rebuild_rules()
        if not getattr(sink, "include_response", True):
            rules = dataclasses.replace(rules, project_response=False)
        self.rules = rules
        self.window = settings.max_in_flight or max(1, int(getattr(sink, "max_in_flight", 1)))
        self.stats = ConsumerStats()
        self.source = f"consumer:{settings.group_id}@{socket.gethostname()}"
        self._offsets = OffsetTracker()
        self._consumer = kafka_consumer or self._subscribe()
        # Retires and dead letters are each waited for alone (produce_sync): nothing to batch, so no linger.
        self._producer = (AckedProducer(client=kafka_producer) if kafka_producer is not None
                          else AckedProducer(producer_config(settings.bootstrap, linger_ms=0, security=settings.kafka)))

    def _subscribe(self) -> Any:
        consumer = confluent_kafka.Consumer(consumer_config(self.settings.bootstrap, self.settings.group_id,
                                                            session_timeout_ms=self.settings.session_timeout_ms,
                                                            fetch_wait_ms=self.settings.fetch_wait_ms,
                                                            security=self.settings.kafka))
        consumer.subscribe([self.settings.topics.snapshots], on_assign=self._on_assign, on_revoke=self._on_revoke,
                           on_lost=self._on_revoke)
        return consumer

    def _on_assign(self, _consumer: Any, partitions: list[Any]) -> None:
        # The client applies the assignment itself once this returns; the line is for whoever asks
        # why a snapshot waits (a consumer that never joined its group logs nothing else).
        log.info("assigned %s", _partition_list(partitions))

    def _on_revoke(self, _consumer: Any, partitions: list[Any]) -> None:
        # Deliveries still pending on these partitions will not commit: the new owner re-delivers.
        log.info("revoked %s", _partition_list(partitions))
        self._offsets.forget((p.topic, p.partition) for p in partitions)

    async def run(self, *, stop: asyncio.Event | None = None, max_rollouts: int | None = None) -> ConsumerStats:
        """Consume until ``stop`` is set or ``max_rollouts`` rollouts were delivered.

        Raises ``DeliveryFailed`` when the sink failed and ``MaskFractionExceeded``
        when the masked fraction went over the limit (after pending deliveries
        settled; nothing undelivered is committed either way); ``TopicsUnavailable``
        before consuming anything when a required topic is still missing after
        ``topic_wait_s``.
        """
        stop = stop or asyncio.Event()
        if self._topic_check is not None:  # before the first poll: never poll a missing topic for ever
            await asyncio.to_thread(self._topic_check, self.settings)
            self._topic_check = None
        if self._follow:  # before the first poll too: a rollout is never judged against a half-read topic
            self._follow = False
            await asyncio.to_thread(self.gate.follow)
        if self.settings.metrics_port is not None and self.metrics.port is None:
            port = self.metrics.serve(self.settings.metrics_port, self.settings.metrics_host)
            log.info("consumer metrics on http://%s:%d/metrics", self.settings.metrics_host, port)
        slots = asyncio.Semaphore(self.window)
        pending: set[asyncio.Task[None]] = set()
        failure: list[BaseException] = []

        def settle(task: asyncio.Task[None]) -> None:
            pending.discard(task)
            slots.release()
            if not task.cancelled() and task.exception() is not None:
                failure.append(task.exception())  # type: ignore[arg-type]

        try:
            while not stop.is_set() and not failure:
                if max_rollouts is not None and self.stats.delivered + len(pending) >= max_rollouts:
                    if not pending:
                        break
                    await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    continue
                if not await self._slot(slots, stop, failure):
                    break
                msg = await self._poll()
                if STAGES.on and msg is not None and not msg.error():
                    STAGES.mark(msg.key(), "snapshot.record", msg.timestamp()[1] / 1000)
                    STAGES.mark(msg.key(), "cons.polled")
                rollout = await self._prepare(msg) if msg is not None else None
                if rollout is None:
                    slots.release()
                    continue
                task = asyncio.create_task(self._deliver(msg, rollout))
                pending.add(task)
                task.add_done_callback(settle)
        finally:
            await self._drain(pending)
        if failure:
            exc = failure[0]
            if isinstance(exc, TokentrailError):
                raise exc
            raise DeliveryFailed(f"the sink failed to deliver a rollout: {type(exc).__name__}: {exc}") from exc
        return self.stats

    async def _slot(self, slots: asyncio.Semaphore, stop: asyncio.Event, failure: list) -> bool:
        """Wait for a free delivery slot, or give up when stopping or a delivery failed."""
        while not stop.is_set() and not failure:
            try:
                await asyncio.wait_for(slots.acquire(), timeout=self.settings.poll_timeout_s)
            except TimeoutError:
                continue
            if stop.is_set() or failure:  # the slot may have been freed by the delivery that failed
                slots.release()
                return False
            return True
        return False

    async def _drain(self, pending: set[asyncio.Task[None]]) -> None:
        if not pending:
            return
        _, late = await asyncio.wait(set(pending), timeout=self.settings.shutdown_grace_s)
        for task in late:  # not delivered: not committed, delivered again after a restart
            task.cancel()
        if late:
            await asyncio.wait(late)
            log.warning("stopped with %d deliveries still pending; they will be delivered again", len(late))

    async def handle(self, msg: Any) -> RebuiltRollout | None:
        """Process one polled message to the end (rebuild, deliver, retire, commit); for tools and tests."""
        rollout = await self._prepare(msg)
        if rollout is not None:
            await self._deliver(msg, rollout)
        return rollout

    async def _prepare(self, msg: Any) -> RebuiltRollout | None:
        if msg.error():
            log.warning("consumer error: %s", msg.error())
            return None
        tp = (msg.topic(), msg.partition())
        self._offsets.start(tp, msg.offset())
        try:
            snapshot = decode_snapshot(msg.value())
        except ContractError as exc:  # undecodable, or a record that breaks a contract check: dead letter
            await self._in_thread(self._deadletter, msg, type(exc).__name__, str(exc))
            self.stats.deadletters += 1
            await self._done(msg)
            return None
        rollout = await asyncio.to_thread(rebuild, snapshot, self.rules)
        if STAGES.on:
            STAGES.mark(rollout.rollout_id, "cons.rebuilt")
        judged = self.gate.judge(rollout)
        if judged is None:
            self._count(rollout, dropped=True)
            await self._drop(msg, rollout)
            return None
        self._count(judged)
        return judged

    async def _drop(self, msg: Any, rollout: RebuiltRollout) -> None:
        """A dropped rollout is retired and committed as a delivered one is (at least once: retire, then commit)."""
        if self.settings.retire:
            await self._in_thread(self._retire, rollout)
        await self._done(msg)

    def _count(self, rollout: RebuiltRollout, *, dropped: bool = False) -> None:
        stats = self.stats
        stats.rebuilt += 1
        if dropped:  # untrainable like a masked one: it counts towards max_mask_fraction
            stats.dropped += 1
            stats.masked += 1
            stats.mask_reasons.update([*(r.code for r in rollout.mask_reasons), MaskCode.STALE_POLICY.value])
        elif rollout.mask_sample:
            stats.masked += 1
            stats.mask_reasons.update(r.code for r in rollout.mask_reasons)
        limit = self.settings.max_mask_fraction
        if limit is not None and stats.rebuilt >= self.settings.mask_fraction_min_samples:
            if stats.masked / stats.rebuilt > limit:
                reasons = ", ".join(f"{code}: {n}" for code, n in stats.mask_reasons.most_common())
                raise MaskFractionExceeded(
                    f"{stats.masked} of {stats.rebuilt} rebuilt rollouts ({stats.masked / stats.rebuilt:.1%}) are "
                    f"masked, exceeding max_mask_fraction={limit}. Mask reasons: {{{reasons}}}. Stopping instead of "
                    f"delivering mostly untrainable data (rollout {rollout.rollout_id} was not delivered); "
                    "fix the cause or raise the limit, then restart: delivery resumes where it stopped."
                )

    async def _deliver(self, msg: Any, rollout: RebuiltRollout) -> None:
        await self.sink.deliver(rollout)
        self.stats.delivered += 1
        if STAGES.on:
            STAGES.mark(rollout.rollout_id, "cons.delivered")
        if self.settings.retire:
            await self._in_thread(self._retire, rollout)
            if STAGES.on:
                STAGES.mark(rollout.rollout_id, "cons.retired")
        await self._done(msg)
        if STAGES.on:
            STAGES.mark(rollout.rollout_id, "cons.committed")

    async def _done(self, msg: Any) -> None:
        commit = self._offsets.finish((msg.topic(), msg.partition()), msg.offset())
        if commit is not None:
            await self._in_thread(self._commit, msg.topic(), msg.partition(), commit)

    async def _poll(self) -> Any:
        return await self._in_thread(self._consumer.poll, self.settings.poll_timeout_s)

    @staticmethod
    async def _in_thread(fn: Any, *args: Any) -> Any:
        # Blocking client calls run in worker threads. librdkafka handles are thread-safe, so a
        # delivery's retire and commit need not wait for a poll that is idling on an empty topic.
        return await asyncio.to_thread(fn, *args)

    def _retire(self, rollout: RebuiltRollout) -> None:
        event = RolloutEvent(
            event_id=new_event_id(), rollout_id=rollout.rollout_id, emitted_at=time.time_ns() // 1000,
            source=self.source,
            body=RetireRequested(snapshot_id=rollout.snapshot_id, version=rollout.version,
                                 consumer=self.settings.group_id),
        )
        self._producer.produce_sync(self.settings.topics.rollout_events, key_for(rollout.rollout_id),
                                    encode_event(event))

    def _deadletter(self, msg: Any, reason: str, detail: str) -> None:
        headers = deadletter_headers(reason, detail, msg.topic(), msg.partition(), msg.offset())
        self._producer.produce_sync(self.settings.topics.deadletter, msg.key(), msg.value(), headers)

    def _commit(self, topic: str, partition: int, offset: int) -> None:
        try:
            self._consumer.commit(offsets=[confluent_kafka.TopicPartition(topic, partition, offset)],
                                  asynchronous=False)
        except confluent_kafka.KafkaException as exc:
            # A partition revoked meanwhile: its new owner re-delivers from the last commit.
            log.warning("commit of %s[%d]@%d failed: %s", topic, partition, offset, exc)

    async def close(self) -> None:
        self.metrics.close()
        await asyncio.to_thread(self.gate.close)
        await asyncio.to_thread(self._consumer.close)
        await self._producer.close()
        await self.sink.close()


def _partition_list(partitions: list[Any]) -> str:
    return ", ".join(f"{p.topic}[{p.partition}]" for p in partitions) or "nothing"

