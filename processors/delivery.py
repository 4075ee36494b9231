"""What the Faust shell needs beyond Faust to be at-least-once and in order (used by ``processors.app``).

Gaps in faust-streaming 0.15.3, each seen in this project's worker tests:

- Commits ahead of the changelog. Faust writes a table key to RocksDB at once
  and hands its changelog record to a send buffer; before committing source
  offsets it flushes that buffer, but the flush gives up after 0.1 s with
  records still queued, so under load an event whose changelog records Kafka
  never got can be committed (and a crash then loses them). ``DirectChangelogTable``
  keeps Faust's table (local RocksDB, recovery from the changelog on
  assignment) but lets the agent write a batch of events' state itself
  (``StateBatch``: one RocksDB write per partition) and produce its changelog
  records itself (one record per write, in write order, built into record
  batches without a future or an await per record); ``OrderedAcker`` acks
  events (nothing is acked by Faust) in processing order, each batch once
  Kafka has its changelog records and outputs.
- Holes after a rebalance (``processors.guard``) and per-record delivery
  (``processors.intake``).
- Commits over holes. Faust treats jumps in fetched offsets as gaps to commit
  over (meant for compacted or transactional topics); rollout-events is
  neither, so ``ProcessorApp`` switches that off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import faust
import rocksdict
from faust.tables.table import Table
from faust.types import TP, RecordMetadata

if TYPE_CHECKING:
    from faust.stores.rocksdb import Store as RocksDBStore

log = logging.getLogger("tokentrail.processor")

# Every private faust name this shell relies on, as (class, attribute), for the pinned
# faust-streaming 0.15.3: private names change without notice, so
# tests/unit/processors/test_faust_private.py proves the pinned faust still has each and that
# the shell's modules touch no private faust name missing from this list.
FAUST_PRIVATE_NAMES: tuple[tuple[str, str], ...] = (
    ("faust.App", "_new_consumer"),  # ProcessorApp overrides it to patch each consumer it makes
    ("faust.transport.consumer.Consumer", "_add_gap"),  # replaced: rollout-events has holes, never gaps
    ("faust.transport.consumer.Consumer", "_unacked_messages"),  # OffsetGuard releases a rewound message
    ("faust.transport.consumer.Consumer", "_committed_offset"),  # where OffsetGuard resumes a partition
    # processors.intake's drain loop is faust's own, but for how it hands rollout-events over
    ("faust.transport.consumer.Consumer", "_drain_messages"),
    ("faust.transport.consumer.Consumer", "_read_offset"),
    ("faust.transport.consumer.Consumer", "_commit_every"),
    ("faust.transport.consumer.Consumer", "_n_acked"),
    # ProcessorApp lowers the fetch long-poll faust hard-codes (1500 ms) on the aiokafka consumer it builds
    ("faust.transport.drivers.aiokafka.Consumer", "_thread"),
    ("faust.transport.drivers.aiokafka.AIOKafkaConsumerThread", "_create_worker_consumer"),
    ("aiokafka.AIOKafkaConsumer", "_fetch_max_wait_ms"),
    ("faust.stores.rocksdb.Store", "_db_for_partition"),  # DirectChangelogTable reads and writes it directly
    # the aiokafka producer under faust's, for its public create_batch/send_batch (changelog record batches)
    ("faust.transport.drivers.aiokafka.Producer", "_producer"),
    # processors.app: DeclaredTables starts as faust's TableManager does, without its 1 s sleep, and
    # ProcessorWorker closes its loop without mode's 1 s sentinel
    ("faust.tables.TableManager", "_update_channels"),
    ("faust.worker.Worker", "_sentinel_task"),
)

Record = tuple[bytes, bytes | None]  # a state write: key, value (None deletes)


class StateBatch:
    """The writes of a batch of events to one partition's state, readable back before they are applied.

    A ``StateReader`` for the fold (``get`` sees the batch's own writes first, then RocksDB), and the
    batch's changelog records in write order.
    ``apply`` takes one event's writes: the same local bytes and changelog records as ``table[key] =
    value`` per write and ``del table[key]`` per delete of a key that exists (an absent key is neither
    deleted nor logged), with one RocksDB write for the whole batch (``write``).
    """

    __slots__ = ("partition", "records", "pending", "_db", "_batch")

    def __init__(self, partition: int, db: Any) -> None:
        self.partition, self._db = partition, db
        self.pending: dict[bytes, bytes | None] = {}
        self._batch = rocksdict.WriteBatch(raw_mode=True)
        self.records: list[Record] = []

    def get(self, key: bytes) -> bytes | None:
        pending = self.pending
        if key in pending:
            return pending[key]
        value: bytes | None = self._db.get(key)
        return value

    def write(self) -> None:
        """Apply the batch's writes to the partition's RocksDB, in one write."""
        if self.records:
            self._db.write(self._batch)

    def apply(self, writes: Mapping[bytes, bytes | None]) -> None:
        for key, value in writes.items():
            if type(key) is not bytes:
                raise TypeError(f"the state table takes raw bytes keys, written from the agent only (got {key!r})")
            if value is None:
                if self.get(key) is None:
                    continue
                self._batch.delete(key)
            else:
                self._batch.put(key, value)
            self.pending[key] = value
            self.records.append((key, value))


@dataclass(frozen=True, slots=True)
class ChangelogSend:
    """One changelog record batch handed to the producer: its partition, size and acknowledgement."""

    partition: int
    records: int
    future: asyncio.Future[RecordMetadata]  # resolves with the batch's base offset once Kafka has it


class DirectChangelogTable(Table[bytes, bytes]):
    """A faust Table whose state the agent writes in batches, and whose changelog it produces itself."""

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
        """Records of writes made through Faust's own ``table[key] = value`` (the agent makes none)."""
        records, self._records = self._records, []
        return records

    def reader(self, partition: int) -> Any:
        """The partition's RocksDB as a ``StateReader``: what the store's get does for an event of that partition.

        Faust's ``table.get`` reaches the same ``Rdict.get`` through the table, the store and the
        serializer registry (raw here): that path was a fifth of a busy worker's time.
        """
        return cast("RocksDBStore", self.data)._db_for_partition(partition)  # the app's store is rocksdb://

    def batch(self, partition: int) -> StateBatch:
        """A batch of writes to the partition's state (see ``StateBatch``)."""
        return StateBatch(partition, self.reader(partition))

    def commit(self, batch: StateBatch) -> None:
        """Apply the batch's writes to the partition's RocksDB, in one write."""
        batch.write()

    def write(self, partition: int, writes: Mapping[bytes, bytes | None]) -> list[tuple[int, bytes, bytes | None]]:
        """One event's writes as a batch of its own (applied at once); its changelog records, in order."""
        batch = self.batch(partition)
        batch.apply(writes)
        self.commit(batch)
        return [(partition, key, value) for key, value in batch.records]

    async def produce_changelog(self, batches: Sequence[StateBatch]) -> list[ChangelogSend]:
        """Hand the batches' records to the producer, in order: a record batch per partition (more past
        the producer's batch size), no per-record future or await. Each send resolves once Kafka has it."""
        producer = self.app.producer._producer  # type: ignore[attr-defined]  # faust's aiokafka producer
        topic = self.changelog_topic.get_topic_name()
        sends: list[ChangelogSend] = []

        async def send(builder: Any, partition: int) -> None:
            builder.close()  # complete: sent without lingering
            future = await producer.send_batch(builder, topic, partition=partition)
            sends.append(ChangelogSend(partition, builder.record_count(), future))

        for batch in batches:
            if not batch.records:
                continue
            builder = producer.create_batch()
            for key, value in batch.records:
                if builder.append(key=key, value=value, timestamp=None) is None:  # full: the next one
                    await send(builder, batch.partition)
                    builder = producer.create_batch()
                    builder.append(key=key, value=value, timestamp=None)  # a batch's first record always fits
            await send(builder, batch.partition)
        return sends

    def mark_persisted(self, sends: Sequence[ChangelogSend]) -> None:
        """Remember the changelog offsets Kafka acknowledged, so a clean restart recovers from there."""
        last: dict[int, int] = {}
        for send in sends:
            meta = send.future.result()
            last[send.partition] = max(meta.offset + send.records - 1, last.get(send.partition, -1))
        topic = self.changelog_topic.get_topic_name()
        for partition, offset in last.items():
            self.data.set_persisted_offset(TP(topic, partition), offset)


# A batch in the acker: its messages, its changelog sends, and its events' outputs by key.
_Entry = tuple[list[Any], list["ChangelogSend"], list[tuple[bytes | None, list[Awaitable[Any]]]]]


class OrderedAcker:
    """Acks batches of events in the order they were processed, each once Kafka has all it sent.

    Outputs (snapshots, dead letters) are also tracked per record key, which is
    the rollout: ``settle`` waits for a rollout's outputs before the agent folds
    its next event, so a state change never overtakes the snapshot of the freeze
    before it (what lets a redelivered finish decide whether it still owes its
    snapshot), while other rollouts go on.
    """

    def __init__(self, app: faust.App, table: DirectChangelogTable, limit: int = 64,
                 ack: Callable[[Any], object] | None = None) -> None:
        self._app, self._table = app, table
        # bounds the batches in flight
        self._queue: asyncio.Queue[_Entry] = asyncio.Queue(limit)
        self._task: asyncio.Task[None] | None = None
        self._outputs: dict[bytes | None, list[Awaitable[Any]]] = {}
        self._in_flight = 0
        # The consumer's own ack (what a message's ack ends in: this agent is its only reader).
        self._ack = ack if ack is not None else (lambda message: app.consumer.ack(message))

    @property
    def idle(self) -> bool:
        """True when every submitted event is acked."""
        return self._in_flight == 0

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def owes(self, key: bytes | None) -> bool:
        """Whether this key has outputs not yet known to be acknowledged (``settle`` would wait)."""
        return key in self._outputs

    async def settle(self, key: bytes | None) -> None:
        """Wait until the outputs of this key's earlier events are acknowledged."""
        for fut in self._outputs.pop(key, ()):
            await fut

    def outputs(self, key: bytes | None, outputs: list[Awaitable[Any]]) -> None:
        """Note an event's outputs (sent), for ``settle`` of its key's next event."""
        self._outputs[key] = outputs

    async def submit(self, messages: list[Any], changelog: list[ChangelogSend],
                     outputs: list[tuple[bytes | None, list[Awaitable[Any]]]]) -> None:
        """Ack ``messages`` (in order) once ``changelog`` and ``outputs`` (per event key, as noted with
        ``outputs``) are acknowledged, and after every batch submitted before."""
        if self._task is not None and self._task.done():
            self._task.result()  # a write failed: stop here, the events come again
        self._in_flight += len(messages)
        await self._queue.put((messages, changelog, outputs))

    async def _run(self) -> None:
        while True:
            messages, changelog, outputs = await self._queue.get()
            try:
                for send in changelog:
                    await send.future
                for _, futures in outputs:
                    for fut in futures:
                        await fut
            except Exception as exc:
                log.error("Kafka did not acknowledge a write (%r): stopping, the events are redelivered", exc)
                await self._app.crash(exc)
                raise
            if changelog:
                self._table.mark_persisted(changelog)
            for key, futures in outputs:
                if self._outputs.get(key) is futures:
                    del self._outputs[key]
            for message in messages:
                self._ack(message)
            self._in_flight -= len(messages)
