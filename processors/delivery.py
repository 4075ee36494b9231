"""What the Faust shell needs beyond Faust to be at-least-once and in order (used by ``processors.app``).

Three gaps in faust-streaming 0.15.3, each seen in this project's worker tests:

- Commits ahead of the changelog. Faust writes a table key to RocksDB at once
  and hands its changelog record to a send buffer; before committing source
  offsets it flushes that buffer, but the flush gives up after 0.1 s with
  records still queued, so under load an event whose changelog records Kafka
  never got can be committed (and a crash then loses them). ``DirectChangelogTable``
  keeps Faust's table (local RocksDB, recovery from the changelog on
  assignment) but collects each write's changelog record for the agent to
  produce itself; ``OrderedAcker`` acks events (the stream runs ``noack``) in
  processing order, each once Kafka has its changelog records and outputs.
  It is also the faster path: Faust's per-record buffer, future and
  persisted-offset write were most of a busy worker's time.
- Holes after a rebalance. Around recovery, Faust's stream drops some fetched
  events (flow suspended, or a generation check) without processing or acking
  them, and its fetcher has moved past them; later events of the partition
  are processed, so a rollout silently misses a call. ``OffsetGuard`` admits
  each partition's events only in offset order from the committed offset and,
  on a hole, seeks the consumer back to it and lets nothing past it through;
  a watch finds holes at a partition's tail once the stream is quiet.
- Commits over holes. Faust treats jumps in fetched offsets as gaps to commit
  over (meant for compacted or transactional topics); rollout-events is
  neither, so ``ProcessorApp`` switches that off.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, cast

import faust
import rocksdict
from faust.tables.table import Table
from faust.types import TP, RecordMetadata

if TYPE_CHECKING:
    from faust.stores.rocksdb import Store as RocksDBStore
    from faust.transport.consumer import Consumer

# A changelog record's send: faust types it Awaitable[RecordMetadata]; its producer's send returns a Future.
Sent = asyncio.Future[RecordMetadata]

log = logging.getLogger("tokentrail.processor")

# Every private faust name this shell relies on, as (class, attribute), for the pinned
# faust-streaming 0.15.3: private names change without notice, so
# tests/unit/processors/test_faust_private.py proves the pinned faust still has each and that
# processors.app / processors.delivery touch no private faust name missing from this list.
FAUST_PRIVATE_NAMES: tuple[tuple[str, str], ...] = (
    ("faust.App", "_new_consumer"),  # ProcessorApp overrides it to patch each consumer it makes
    ("faust.transport.consumer.Consumer", "_add_gap"),  # replaced: rollout-events has holes, never gaps
    ("faust.transport.consumer.Consumer", "_unacked_messages"),  # OffsetGuard releases a rewound message
    ("faust.transport.consumer.Consumer", "_committed_offset"),  # where OffsetGuard resumes a partition
    # ProcessorApp lowers the fetch long-poll faust hard-codes (1500 ms) on the aiokafka consumer it builds
    ("faust.transport.drivers.aiokafka.Consumer", "_thread"),
    ("faust.transport.drivers.aiokafka.AIOKafkaConsumerThread", "_create_worker_consumer"),
    ("aiokafka.AIOKafkaConsumer", "_fetch_max_wait_ms"),
    ("faust.stores.rocksdb.Store", "_db_for_partition"),  # DirectChangelogTable reads and writes it directly
)


class DirectChangelogTable(Table[bytes, bytes]):
    """A faust Table whose changelog records are collected for the caller to produce."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._records: list[tuple[int, bytes, bytes | None]] = []

    def on_key_set(self, key: Any, value: Any) -> None:
        self._records.append((self._partition(key), key, value))

    def on_key_del(self, key: Any) -> None:
        self._records.append((self._partition(key), key, None))

    def _partition(self, key: Any) -> int:
        partition = self.partition_for_key(key)  # the current event's partition: tables are co-partitioned
        if partition is None or not isinstance(key, bytes):
            raise TypeError(f"{self.name} takes raw bytes keys, written from the agent only")
        return partition

    def take_changelog(self) -> list[tuple[int, bytes, bytes | None]]:
        records, self._records = self._records, []
        return records

    def reader(self, partition: int) -> Any:
        """The partition's RocksDB as a ``StateReader``: what the store's get does for an event of that partition.

        Faust's ``table.get`` reaches the same ``Rdict.get`` through the table, the store and the
        serializer registry (raw here): that path was a fifth of a busy worker's time.
        """
        return cast("RocksDBStore", self.data)._db_for_partition(partition)  # the app's store is rocksdb://

    def write(self, partition: int, writes: Mapping[bytes, bytes | None]) -> list[tuple[int, bytes, bytes | None]]:
        """Apply one event's writes to the partition's RocksDB as one batch; their changelog records, in order.

        The same local bytes and changelog records as ``table[key] = value`` for each write and
        ``del table[key]`` for each delete of a key that exists (an absent key is neither deleted nor
        logged), in one RocksDB write instead of one per key. Keys are raw bytes, as the agent writes them.
        """
        db = cast("RocksDBStore", self.data)._db_for_partition(partition)  # the app's store is rocksdb://
        batch = rocksdict.WriteBatch(raw_mode=True)
        records: list[tuple[int, bytes, bytes | None]] = []
        for key, value in writes.items():
            if not isinstance(key, bytes):
                raise TypeError(f"{self.name} takes raw bytes keys, written from the agent only")
            if value is None:
                if db.get(key) is None:
                    continue
                batch.delete(key)
            else:
                batch.put(key, value)
            records.append((partition, key, value))
        if records:
            db.write(batch)
        return records

    async def produce_changelog(self, records: list[tuple[int, bytes, bytes | None]]) -> list[Sent]:
        """Hand the records to the producer in order; the futures resolve when Kafka has them."""
        topic = self.changelog_topic.get_topic_name()
        send = self.app.producer.send
        return cast("list[Sent]", [await send(topic, key, value, partition, None, None)
                                   for partition, key, value in records])

    def mark_persisted(self, futures: list[Sent]) -> None:
        """Remember the changelog offsets Kafka acknowledged, so a clean restart recovers from there."""
        last: dict[int, int] = {}
        for fut in futures:
            meta = fut.result()
            last[meta.partition] = max(meta.offset, last.get(meta.partition, -1))
        topic = self.changelog_topic.get_topic_name()
        for partition, offset in last.items():
            self.data.set_persisted_offset(TP(topic, partition), offset)


class OrderedAcker:
    """Acks events in the order they were processed, each once all it sent is acknowledged by Kafka.

    Outputs (snapshots, dead letters) are also tracked per record key, which is
    the rollout: ``settle`` waits for a rollout's outputs before the agent folds
    its next event, so a state change never overtakes the snapshot of the freeze
    before it (what lets a redelivered finish decide whether it still owes its
    snapshot), while other rollouts go on.
    """

    def __init__(self, app: faust.App, table: DirectChangelogTable, limit: int = 2000) -> None:
        self._app, self._table = app, table
        # bounds the events in flight
        self._queue: asyncio.Queue[tuple[Any, list[Sent], list[Awaitable[Any]]]] = asyncio.Queue(limit)
        self._task: asyncio.Task[None] | None = None
        self._outputs: dict[bytes | None, list[Awaitable[Any]]] = {}
        self._in_flight = 0

    @property
    def idle(self) -> bool:
        """True when every submitted event is acked."""
        return self._in_flight == 0

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def settle(self, key: bytes | None) -> None:
        """Wait until the outputs of this key's earlier events are acknowledged."""
        for fut in self._outputs.pop(key, ()):
            await fut

    async def submit(self, event: Any, changelog: list[Sent], outputs: list[Awaitable[Any]]) -> None:
        if self._task is not None and self._task.done():
            self._task.result()  # a write failed: stop here, the events come again
        if outputs:
            self._outputs[event.key] = outputs
        self._in_flight += 1
        await self._queue.put((event, changelog, outputs))

    async def _run(self) -> None:
        while True:
            event, changelog, outputs = await self._queue.get()
            try:
                for fut in (*changelog, *outputs):
                    await fut
            except Exception as exc:
                log.error("Kafka did not acknowledge a write (%r): stopping, the events are redelivered", exc)
                await self._app.crash(exc)
                raise
            self._table.mark_persisted(changelog)
            if outputs and self._outputs.get(event.key) is outputs:
                del self._outputs[event.key]
            event.ack()
            self._in_flight -= 1


class OffsetGuard:
    """Admits each partition's events in offset order without holes; rewinds the consumer over holes.

    After a rebalance (a new consumer generation) a partition restarts at its
    committed offset, so that is the first offset expected; an event beyond the
    expected offset means Faust dropped the ones between: the consumer is sought
    back to the hole and nothing of that partition is admitted until the hole's
    first event arrives. An event below it is a redelivery, which the fold
    recognises and turns into a no-op. The log start moving past the committed
    offset (retention) is not a hole. Nothing past a hole is ever acked, so
    commits never pass it either: a hole costs time, never an event.

    A watch task repeats the seeks once a second (records Faust had already
    fetched keep arriving after a seek, each moving its read offset forward,
    past which it would drop the re-fetched hole) and, while the stream is
    quiet, rewinds any partition whose log end is beyond what was admitted: a
    hole at the tail has no later event to reveal it.

    Every seek goes through the consumer thread (``seek_wait``, as Faust's own
    recovery does). Faust's ``Consumer.seek`` changes aiokafka's fetcher from
    the event loop's thread while the consumer thread works on it; repeated,
    that crashed the fetcher (``KeyError`` in ``fetched_records``) or left a
    worker's table recovery waiting forever for changelog records it never
    fetched. The watch also stands still while a rebalance or recovery is under
    way (the stream is paused, so quiet says nothing, and every partition
    restarts at its committed offset afterwards) and, after one, starts over
    from the new generation's committed offsets.
    """

    def __init__(self, app: faust.App, topic: str, reseek_s: float = 1.0) -> None:
        self._app, self._topic = app, topic
        self._generation: int | None = None
        self._next: dict[TP, int] = {}
        self._rewinding: dict[TP, int] = {}
        self._reseek_s = reseek_s
        self._last_event = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self.rewinds = 0

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._watch())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def admit(self, event: Any) -> bool:
        message = event.message
        if not message.generation_id:
            return True  # not from a consumer group (agent test context)
        self._last_event = time.monotonic()
        if message.generation_id != self._generation:
            self._generation = message.generation_id
            self._next.clear()
            self._rewinding.clear()
        tp, offset = message.tp, message.offset
        expected = self._expected(tp)
        if offset > expected and tp not in self._rewinding:
            earliest = (await self._app.consumer.earliest_offsets(tp)).get(tp, 0)
            expected = max(expected, earliest)
            if offset > expected:
                self._rewind(tp, expected, f"the stream skipped offsets {expected}..{offset - 1}")
        if offset > expected:
            # Not acked: its offset must not become committable. Released first, so a rebalance (which
            # waits for unacked messages) never waits on the seek, which needs the consumer thread.
            message.acked = True
            cast("Consumer", self._app.consumer)._unacked_messages.discard(message)
            await self._seek(tp, expected)
            return False
        self._rewinding.pop(tp, None)
        self._next[tp] = max(expected, offset + 1)
        return True

    def _expected(self, tp: TP) -> int:
        """The next offset this partition owes: where it left off, else its committed offset."""
        if tp in self._next:
            return self._next[tp]
        return cast("Consumer", self._app.consumer)._committed_offset.get(tp) or 0

    def _rewind(self, tp: TP, offset: int, why: str) -> None:
        log.warning("partition %s: %s; rewinding to %d", tp.partition, why, offset)
        self.rewinds += 1
        self._rewinding[tp] = self._next[tp] = offset

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._reseek_s)
            try:
                await self._check()
            except Exception as exc:  # e.g. no consumer during a rebalance: the next round retries
                log.warning("offset guard: %r", exc)

    async def _seek(self, tp: TP, offset: int) -> None:
        await self._app.consumer.seek_wait({tp: offset})  # in the consumer's own thread

    async def _check(self) -> None:
        app = self._app
        if app.rebalancing or app.in_recovery:
            return
        if app.consumer_generation_id != self._generation:
            # A rebalance ended: what this guard knew was for the previous generation. The stream
            # restarts at the committed offsets; give the first fetch a round before the tail check.
            self._generation = app.consumer_generation_id
            self._next.clear()
            self._rewinding.clear()
            self._last_event = time.monotonic()
            return
        consumer = app.consumer
        if time.monotonic() - self._last_event >= self._reseek_s:
            for tp in consumer.assignment():
                end = consumer.highwater(tp) if tp.topic == self._topic else None
                if end is not None and tp not in self._rewinding and end > self._expected(tp):
                    self._rewind(tp, self._expected(tp), f"the stream stopped below the log end {end}")
        for tp, offset in list(self._rewinding.items()):
            await self._seek(tp, offset)
