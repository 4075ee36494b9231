"""The fold agent's work on a batch of rollout events: fold, store, emit, ack (used by ``processors.app``).

Not pure: this is the Faust edge of the fold (faust's topics, the changelog table); the fold it
drives (``processors.fold``, ``processors.decode``) is pure and listed in the ``pure`` import contract.

``FoldLoop.fold(messages)`` takes the messages of one fetch (``processors.intake``)
and, in order:

1. admits each through the ``OffsetGuard`` (offset order, no holes);
2. folds each admitted event (``processors.fold.fold_raw``) over its
   partition's ``StateBatch``, so it reads the writes of the events before it
   in the batch; a rollout's next event waits for the outputs of its previous
   one (``OrderedAcker.settle``); snapshots and dead letters are sent as they
   are folded;
3. writes each partition's state in one RocksDB write, then hands the batch's
   changelog records to the producer, one record per write in write order,
   in record batches (``DirectChangelogTable.produce_changelog``);
4. submits the batch to the ``OrderedAcker``, which acks its events, in
   order, once Kafka has its changelog records and outputs.

So per event: one decode, one fold, no await but a rollout's ``settle`` (and
the sends of its outputs); per batch: one RocksDB write and one changelog
record batch per partition, one acker entry. A batch is cut into chunks of at
most ``max_batch`` events, which bounds the writes held in memory and how long
the first event of a large fetch waits for its changelog.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Sequence
from typing import Any, cast

import faust
from faust.types import RecordMetadata

from processors.delivery import ChangelogSend, DirectChangelogTable, OrderedAcker, StateBatch
from processors.fold import fold_raw
from processors.guard import OffsetGuard
from schemas.kafka.framing import deadletter_headers
from schemas.stage_log import STAGES

log = logging.getLogger("tokentrail.processor")


class FoldCount:
    """Events this worker folded, logged ("folded N events") at most once a second and at stop.

    Per-worker throughput from the worker's own log (``tokentrail bench scaleout``); a worker
    killed with -9 has logged all but its last second. Redelivered events count: they were folded.
    A count not logged because the last line is under a second old is logged when that second
    ends (inside an event loop), so the log is never more than a second behind the fold, also
    when the worker goes quiet: what a stalled pipeline's logs are read for.
    """

    __slots__ = ("n", "_next", "_logged", "_due")

    def __init__(self) -> None:
        self.n, self._next, self._logged, self._due = 0, time.monotonic() + 1.0, 0, False

    def add(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now >= self._next:
            self.log()
        elif not self._due:
            try:
                asyncio.get_running_loop().call_later(self._next - now, self._log_due)
                self._due = True
            except RuntimeError:  # no loop (tests): logged at the next add or at stop
                pass

    def _log_due(self) -> None:
        self._due = False
        if self.n != self._logged:
            self.log()

    def log(self) -> None:
        self._next, self._logged = time.monotonic() + 1.0, self.n
        log.info("folded %d events", self.n)


class FoldLoop:
    """Folds batches of rollout-events messages into the table (see the module docstring)."""

    def __init__(self, table: DirectChangelogTable, acker: OrderedAcker, guard: OffsetGuard,
                 snapshots: faust.TopicT, deadletter: faust.TopicT, max_batch: int = 500) -> None:
        self.table, self.acker, self.guard = table, acker, guard
        self.snapshots, self.deadletter = snapshots, deadletter
        self.max_batch = max_batch
        self.count = FoldCount()
        self._lock = asyncio.Lock()  # one batch at a time, whichever path it came by

    async def fold(self, messages: Sequence[Any]) -> None:
        async with self._lock:
            for start in range(0, len(messages), self.max_batch):
                await self._fold(messages[start:start + self.max_batch])

    async def _fold(self, messages: Sequence[Any]) -> None:
        fetched = time.time() if STAGES.on else 0.0
        admitted = await self.guard.admit_all(messages)
        if not admitted:
            return
        table, acker = self.table, self.acker
        states: dict[int, StateBatch] = {}
        outputs: list[tuple[bytes | None, list[Awaitable[Any]]]] = []
        marks: list[tuple[Any, float, list[Awaitable[RecordMetadata]]]] = []
        for message in admitted:
            key, partition = message.key, message.partition
            if acker.owes(key):
                await acker.settle(key)
            state = states.get(partition)
            if state is None:
                state = states[partition] = table.batch(partition)
            result = fold_raw(state, key, message.value, position=(partition, message.offset))
            state.apply(result.writes)
            if result.emitted or result.deadletters:
                sent = await self._emit(message, result)
                acker.outputs(key, sent)
                outputs.append((key, sent))
                if STAGES.on and result.emitted:
                    marks.append((message, time.time(), sent[:len(result.emitted)]))
        for state in states.values():
            table.commit(state)
        sends = await table.produce_changelog(list(states.values()))
        self.count.add(len(admitted))
        for message, folded, snapshots in marks:
            _mark_stages(message, (fetched, folded), [s.future for s in sends if s.partition == message.partition],
                         snapshots)
        await acker.submit(admitted, sends, outputs)

    async def _emit(self, message: Any, result: Any) -> list[Awaitable[Any]]:
        """Send the event's snapshots, then its dead letters; their acknowledgements."""
        sent: list[Awaitable[Any]] = [await self.snapshots.send(key=message.key, value=snapshot.data)
                                      for snapshot in result.emitted]
        for dead in result.deadletters:
            sent.append(await self.deadletter.send(
                key=message.key, value=message.value,
                headers=deadletter_headers(dead.reason, dead.detail, message.topic, message.partition,
                                           message.offset),
            ))
            log.warning("dead letter %s at %s[%d]@%d: %s", dead.reason, message.topic, message.partition,
                        message.offset, dead.detail)
        return sent


def _mark_stages(message: Any, times: tuple[float, float], changelog: Sequence[Awaitable[RecordMetadata]],
                 snapshots: Sequence[Awaitable[RecordMetadata]]) -> None:
    """Stage marks of an event that emitted a snapshot (a finish), for ``tokentrail bench e2e``."""
    key, sent = message.key, time.time()
    STAGES.mark(key, "finish.record", message.timestamp)
    STAGES.mark(key, "proc.fetched", times[0])
    STAGES.mark(key, "proc.folded", times[1])
    STAGES.mark(key, "proc.sent", sent)  # changelog and snapshot handed to the producer (sends only enqueue)
    for futures, stage in ((changelog, "proc.changelog_acked"), (snapshots, "proc.snapshot_acked")):
        if futures:
            last = cast("asyncio.Future[RecordMetadata]", futures[-1])  # faust's sends return futures

            def mark(_f: object, stage: str = stage) -> None:
                STAGES.mark(key, stage)

            last.add_done_callback(mark)


__all__ = ["ChangelogSend", "FoldCount", "FoldLoop"]
