"""In-process trainer sink: ``async for rollout in stream`` for trainers living in the consumer's process.

``RolloutStream`` is a ``TrainerSink`` and an async iterator. ``deliver`` hands a
rollout to the iterator and returns only when the trainer has *taken ownership*:
when it asks for the next item after this one (or calls ``ack()``). So the
consumer commits a rollout's offset only after the trainer moved past it; a
crash before that delivers it again (at-least-once, deduplicated by
``(snapshot_id, version)`` while the process lives).

Grouping (GRPO): with ``group_key`` the stream yields lists, one per group, when
every rollout of the group is there. The key and the size come from the
rollout's result payload (``group_key="group_id"``, ``group_size="group_size"``
name keys of the finish result) or from callables; ``group_size`` may also be a
constant. A rollout without a group key is yielded as a group of one. Groups are
yielded in completion order, members sorted by rollout id; a redelivered member
replaces the version it had. A rollout whose group cannot be told (its group
size is not a positive integer, a key or size callable raised) is yielded
alone, masked with ``invalid_group`` naming the value and the setting: a
record's content never stops the stream. Every rollout passes
``consumers.rebuild.validity.checked_record`` first, so the trainer gets what
the JSONL sink would write. Rollouts of one group must reach this process: run
one consumer (or route a group's snapshots to one partition), and keep
``max_buffered`` above the rollouts of all groups open at once (the consumer
keeps that many deliveries in flight).

``rollout_stream(settings, ...)`` runs the rebuild consumer in the background
of the trainer's event loop and yields the stream; if the consumer stops with
an error (a failed retire, ``MaskFractionExceeded``), the iteration raises it.

    async with rollout_stream(settings, group_key="group_id", group_size="group_size") as stream:
        async for group in stream:
            train_on(group)
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from consumers.rebuild.validity import checked_record
from schemas.errors import ConfigError
from schemas.records import MaskCode, MaskReason, RebuiltRollout

if TYPE_CHECKING:
    from consumers.settings import ConsumerSettings

log = logging.getLogger("tokentrail.consumer.inprocess")

_CLOSED = object()
_ACKED_MEMORY = 100_000

GroupKey = str | Callable[[RebuiltRollout], Hashable | None]
GroupSize = int | str | Callable[[RebuiltRollout], int]


class RolloutStream:
    """``TrainerSink`` + ``AsyncIterator[RebuiltRollout | list[RebuiltRollout]]``."""

    def __init__(self, *, group_key: GroupKey | None = None, group_size: GroupSize | None = None,
                 include_response: bool = True, max_buffered: int = 1024) -> None:
        if (group_key is None) != (group_size is None):
            raise ConfigError("group_key and group_size go together: both set (grouping) or both unset")
        if isinstance(group_size, int) and group_size < 1:
            raise ConfigError(f"group_size={group_size}: must be >= 1")
        if max_buffered < 1:
            raise ConfigError(f"max_buffered={max_buffered}: must be >= 1")
        self.include_response = include_response
        self.max_in_flight = max_buffered
        self.idempotent_across_restarts = False  # deduplication lives in this process only
        self._group_key = group_key
        self._group_size = group_size
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._pending: dict[tuple[str, int], asyncio.Future[None]] = {}
        self._groups: dict[Hashable, dict[str, RebuiltRollout]] = {}
        self._acked: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._current: list[tuple[str, int]] = []
        self._closed = False
        self._error: BaseException | None = None

    # -- TrainerSink ------------------------------------------------------------------
    async def deliver(self, rollout: RebuiltRollout) -> None:
        rollout = checked_record(rollout)  # the trainer gets what the JSONL sink would write
        identity = (rollout.snapshot_id, rollout.version)
        if identity in self._acked:
            return
        if self._closed:
            raise ConfigError("the rollout stream is closed; nothing can be delivered")
        future = self._pending.get(identity)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self._pending[identity] = future
            self._admit(rollout)
        await asyncio.shield(future)

    async def close(self) -> None:
        """End the iteration; deliveries not yet taken fail (the consumer will deliver them again)."""
        if self._closed:
            return
        self._closed = True
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConfigError("the rollout stream closed before the trainer took this rollout"))
                future.exception()  # retrieved: a closed stream is not an unhandled error
        self._queue.put_nowait(_CLOSED)

    async def fail(self, error: BaseException) -> None:
        """End the iteration with ``error`` (the consumer feeding this stream stopped on it)."""
        self._error = error
        await self.close()

    # -- iterator ---------------------------------------------------------------------
    def __aiter__(self) -> RolloutStream:
        return self

    async def __anext__(self) -> Any:
        self.ack()
        item = await self._queue.get()
        if item is _CLOSED:
            self._queue.put_nowait(_CLOSED)  # every later __anext__ ends too
            if self._error is not None:
                raise self._error
            raise StopAsyncIteration
        rollouts = item if isinstance(item, list) else [item]
        self._current = [(r.snapshot_id, r.version) for r in rollouts]
        return item

    def ack(self) -> None:
        """The trainer owns the last item it received: let the consumer commit it."""
        for identity in self._current:
            future = self._pending.pop(identity, None)
            if future is not None and not future.done():
                future.set_result(None)
            self._acked[identity] = None
        while len(self._acked) > _ACKED_MEMORY:
            self._acked.popitem(last=False)
        self._current = []

    # -- grouping ---------------------------------------------------------------------
    def _admit(self, rollout: RebuiltRollout) -> None:
        if self._group_key is None:
            self._queue.put_nowait(rollout)
            return
        try:
            key = self._key_of(rollout)
            size = None if key is None else self._size_of(rollout)
        except Exception as exc:  # fail closed: this rollout alone, masked; the stream goes on
            log.warning("rollout %s: %s; yielded alone, masked (invalid_group)", rollout.rollout_id, exc)
            reason = MaskReason(code=MaskCode.INVALID_GROUP, detail=f"{exc}; yielded as a group of one. Fix the finish "
                                "result (or the group_key / group_size settings of the RolloutStream)")
            self._queue.put_nowait([dataclasses.replace(rollout, mask_sample=True,
                                                        mask_reasons=[*rollout.mask_reasons, reason])])
            return
        if key is None:
            self._queue.put_nowait([rollout])
            return
        members = self._groups.setdefault(key, {})
        replaced = members.get(rollout.rollout_id)
        if replaced is not None and (replaced.snapshot_id, replaced.version) != (rollout.snapshot_id, rollout.version):
            # The older version will never be taken: release its delivery as superseded.
            old = self._pending.pop((replaced.snapshot_id, replaced.version), None)
            if old is not None and not old.done():
                old.set_result(None)
        members[rollout.rollout_id] = rollout
        if len(members) >= size:
            del self._groups[key]
            self._queue.put_nowait([members[rid] for rid in sorted(members)])

    def _key_of(self, rollout: RebuiltRollout) -> Hashable | None:
        if callable(self._group_key):
            key = self._group_key(rollout)
            hash(key)  # an unhashable key is this rollout's problem, not the stream's
            return key
        value = _result(rollout).get(self._group_key)
        return json.dumps(value, sort_keys=True) if value is not None else None

    def _size_of(self, rollout: RebuiltRollout) -> int:
        size = self._group_size
        if callable(size):
            size = size(rollout)
        elif isinstance(size, str):
            size = _result(rollout).get(size)
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ConfigError(f"rollout {rollout.rollout_id}: group size {size!r} is not a positive integer "
                              f"(group_size={self._group_size!r}; the finish result must carry it as an integer "
                              ">= 1)")
        return size

    @property
    def open_groups(self) -> int:
        return len(self._groups)


def _result(rollout: RebuiltRollout) -> dict[str, Any]:
    try:
        value = json.loads(rollout.result_json)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@asynccontextmanager
async def rollout_stream(settings: ConsumerSettings, *, kafka_clients: dict[str, Any] | None = None,
                         **stream_kwargs: Any) -> AsyncIterator[RolloutStream]:
    """A ``RolloutStream`` fed by a rebuild consumer running in this event loop (see the module docstring).

    ``kafka_clients`` (``kafka_consumer``/``kafka_producer``) replace the Kafka clients, for tests.
    """
    from consumers.loop import RebuildConsumer

    stream = RolloutStream(**stream_kwargs)
    consumer = RebuildConsumer(settings, stream, **(kafka_clients or {}))
    stop = asyncio.Event()

    async def feed() -> None:
        try:
            await consumer.run(stop=stop)
        except Exception as exc:  # surfaced to the trainer through the iteration
            await stream.fail(exc)
            raise

    task = asyncio.create_task(feed())
    try:
        yield stream
    finally:
        stop.set()
        try:
            await task
        finally:
            await consumer.close()
