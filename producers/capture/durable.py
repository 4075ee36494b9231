"""Durable evidence: Kafka when it acknowledges, the local spool when it cannot, in order.

``write`` returns only when the event is durable: acknowledged by Kafka
(acks=all), or fsynced to the spool. It raises ``DurabilityError`` when neither
is possible; the interceptor then answers 503 (no success without evidence).

Order: while anything is spooled, every new event goes to the spool too, and
the drainer publishes the spool in order, so a rollout's events reach the topic
in the order they were acknowledged to the harness. Exactly once: a record
whose Kafka ack was lost (possibly persisted) is spooled as *uncertain*; before
the drainer republishes uncertain records it scans the topic's recent records
for their event ids and skips the ones already there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from producers.capture import c_heap
from producers.capture.spool import UNCERTAIN, Spool
from schemas.errors import DurabilityError, TransportError
from schemas.event_bytes import event_id_of
from schemas.kafka.bridge import AckedProducer, PublishFailed
from schemas.kafka.scan import TopicReader
from schemas.kafka.security import KafkaSecurity

log = logging.getLogger("tokentrail.interceptor")

# How far back the presence scan looks for records whose ack was lost.
_PRESENCE_LOOKBACK_MS = 10 * 60 * 1000
# Bound of each broker round trip of the presence scan (metadata, offsets, a stalled fetch).
_PRESENCE_TIMEOUT_S = 10.0


class DurableWriter:
    def __init__(
        self,
        producer: AckedProducer,
        spool: Spool | None,
        *,
        bootstrap: str,
        security: KafkaSecurity | None = None,
        on_depth: Callable[[int], None] = lambda depth: None,
    ) -> None:
        self._producer = producer
        self._spool = spool
        self._bootstrap = bootstrap
        self._security = security
        self._on_depth = on_depth
        self._lock = asyncio.Lock()
        self._drainer: asyncio.Task | None = None
        self._uncertain_since_ms: int | None = None
        self.trims = 0  # C heap releases after a drain (tests count them)
        if spool is not None and len(spool):
            log.warning("spool holds %d event(s) from an earlier run; draining them first", len(spool))

    @property
    def spooled(self) -> int:
        return len(self._spool) if self._spool is not None else 0

    def start(self) -> None:
        """Drain what an earlier run left in the spool."""
        if self.spooled:
            self._kick()

    async def write(self, topic: str, key: bytes, value: bytes) -> str:
        """Make one event durable; returns "kafka" or "spool"."""
        if self.spooled:  # keep order behind what is already spooled
            await self._append(topic, key, value, 0)
            return "spool"
        try:
            await self._producer.produce(topic, key, value)
            return "kafka"
        except PublishFailed as exc:
            if exc.permanent or self._spool is None:
                raise DurabilityError(f"{exc} (and {'the record can never be accepted' if exc.permanent else 'no spool is configured'})") from exc
            log.warning("Kafka unavailable (%s); spooling", exc)
            await self._append(topic, key, value, UNCERTAIN if exc.possibly_persisted else 0)
            return "spool"

    async def close(self, timeout_s: float = 10.0) -> None:
        """Try to drain for a while; what stays is drained by the next run."""
        if self._drainer is not None and not self._drainer.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._drainer), timeout_s)
            except TimeoutError:
                log.warning("%d event(s) remain spooled; the next start drains them", self.spooled)
            self._drainer.cancel()
        if self._spool is not None:
            self._spool.close()

    # -- internals ----------------------------------------------------------------
    async def _append(self, topic: str, key: bytes, value: bytes, flags: int) -> None:
        assert self._spool is not None
        async with self._lock:
            await asyncio.to_thread(self._spool.append, topic, key, value, flags=flags)
            if flags & UNCERTAIN and self._uncertain_since_ms is None:
                self._uncertain_since_ms = int(time.time() * 1000) - _PRESENCE_LOOKBACK_MS
        self._on_depth(self.spooled)
        self._kick()

    def _kick(self) -> None:
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        assert self._spool is not None
        backoff = 0.1
        present: set[str] | None = None
        while self.spooled:
            record = self._spool.head()
            assert record is not None
            try:
                if record.uncertain and present is None:
                    present = await asyncio.to_thread(self._present_event_ids, record.topic)
                if not (record.uncertain and present is not None and event_id_of(record.value) in present):
                    await self._producer.produce(record.topic, record.key, record.value)
            except TransportError as exc:  # the scan wraps client errors too
                log.info("drain waiting for Kafka (%s)", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            async with self._lock:
                await asyncio.to_thread(self._spool.pop, record)
                if not self.spooled:
                    self._uncertain_since_ms = None
            self._on_depth(self.spooled)
            backoff = 0.1
        log.info("spool drained")
        # What the outage held is freed by now (the producer's queued records, the presence scan's fetches);
        # glibc keeps the pages: an hour's soak kept its interceptor ~15 MiB up after each broker outage.
        self.trims += await asyncio.to_thread(c_heap.trim)

    def _present_event_ids(self, topic: str) -> set[str]:
        """Event ids on ``topic`` written since the first uncertain record (minus a margin)."""
        reader = TopicReader(self._bootstrap, timeout_s=_PRESENCE_TIMEOUT_S, security=self._security)
        try:
            present: set[str] = set()
            for msg in reader.read_topic(topic, from_time_ms=self._uncertain_since_ms or 0):
                try:
                    present.add(event_id_of(msg.value()))
                except Exception:  # a foreign or corrupt record cannot be one of ours
                    pass
            return present
        finally:
            reader.close()
