"""Admitting each partition's rollout events in offset order, without holes (used by ``processors.app``).

Around a rebalance (recovery, a new consumer generation) Faust can drop fetched
events without processing them while its fetcher moves past them; later events
of the partition arrive, so a rollout would silently miss a call.
``OffsetGuard`` admits each partition's events only in offset order from the
committed offset and, on a hole, seeks the consumer back to it and lets
nothing past it through; a watch finds holes at a partition's tail once the
stream is quiet. Nothing past a hole is ever acked, so commits never pass it
either: a hole costs time, never an event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, cast

import faust
from faust.types import TP

if TYPE_CHECKING:
    from faust.transport.consumer import Consumer

log = logging.getLogger("tokentrail.processor")


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

    async def admit_all(self, messages: Any) -> list[Any]:
        """The messages ``admit`` admits, in order; one in the expected order costs no await."""
        admitted = []
        generation, following, rewinding = self._generation, self._next, self._rewinding
        for message in messages:
            tp, offset = message.tp, message.offset
            expected = following.get(tp)
            if (message.generation_id and message.generation_id == generation and expected is not None
                    and offset <= expected and tp not in rewinding):
                following[tp] = max(expected, offset + 1)  # what admit does for an event it admits
                admitted.append(message)
                self._last_event = time.monotonic()
            elif await self.admit(message):
                admitted.append(message)
                generation = self._generation
        return admitted

    async def admit(self, message: Any) -> bool:
        """Whether to fold this rollout-events message (a faust Message) now; False: it comes again later."""
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
