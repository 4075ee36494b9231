"""In-process trainer sink: ``async for rollout in stream`` for trainers living in the consumer's process.

``RolloutStream`` is a ``TrainerSink`` and an async iterator. ``deliver`` hands a
rollout to the iterator and returns only when the trainer has *taken ownership*:
when it asks for the next item after this one (or calls ``ack()``). So the
consumer commits a rollout's offset only after the trainer moved past it; a
crash before that delivers it again (at-least-once, deduplicated by
``(snapshot_id, version)`` while the process lives).

Grouping (GRPO): with ``group_key`` the stream yields one
``consumers.sinks.grouping.RolloutGroup`` per group, by the rule of
``consumers.sinks.grouping`` (the same rule as the grouped Kafka sink): every
member that arrived, sorted by rollout id, masked members included and named in
``group.masked`` (each keeps ``mask_sample=True``), ``reward_mean`` /
``reward_std`` over the valid members (``reward=`` names the result key, or is a
callable), ``complete`` / ``timed_out`` / ``missing``. A ``RolloutGroup`` is a
read-only sequence of its members, so ``for r in group``, ``len(group)``,
``group[0]`` and ``(only,) = group`` work as they did on the lists this stream
used to yield. The key and the size come from the finish result
(``group_key="group_id"``, ``group_size="group_size"``) or from callables;
``group_size`` may also be a constant. A rollout without a group key is a group
of one; one whose group cannot be told is yielded alone, masked
``invalid_group``: a record's content never stops the stream. With
``group_timeout_s`` a group still short that long after its first member
arrived is yielded incomplete (``on_timeout="emit"``) or dropped, its
deliveries released (``"drop"``, counted in ``dropped_groups``); a timer in the
trainer's event loop enforces it even when no delivery arrives, and
``check_timeouts()`` applies it now. Every rollout passes
``consumers.rebuild.validity.checked_record`` first, so the trainer gets what
the JSONL sink would write. Rollouts of one group must reach this process: run
one consumer (or route a group's snapshots to one partition), and keep
``max_buffered`` above the rollouts of all groups open at once (the consumer
keeps that many deliveries in flight).

``consumers.trainer_stream.rollout_stream(settings, ...)`` runs the rebuild
consumer in the background of the trainer's event loop and yields the stream;
if the consumer stops with an error (a failed retire, ``MaskFractionExceeded``),
the iteration raises it.

    async with rollout_stream(settings, group_key="group_id", group_size="group_size") as stream:
        async for group in stream:
            train_on(group)
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from consumers.rebuild.validity import checked_record
from consumers.sinks.grouping import (
    GroupAssembler,
    GroupKey,
    GroupSize,
    OnTimeout,
    RewardOf,
    RolloutGroup,
    Step,
    expire_when_due,
)
from schemas.errors import ConfigError
from schemas.records import RebuiltRollout

_CLOSED = object()
_ACKED_MEMORY = 100_000

__all__ = ["RolloutStream"]


class RolloutStream:
    """``TrainerSink`` + ``AsyncIterator[RebuiltRollout | RolloutGroup]`` (a group when ``group_key`` is set)."""

    def __init__(self, *, group_key: GroupKey | None = None, group_size: GroupSize | None = None,
                 include_response: bool = True, max_buffered: int = 1024, reward: RewardOf = "reward",
                 group_timeout_s: float | None = None, on_timeout: OnTimeout = "emit",
                 clock: Callable[[], float] = time.monotonic) -> None:
        if (group_key is None) != (group_size is None):
            raise ConfigError("group_key and group_size go together: both set (grouping) or both unset")
        if group_key is None and group_timeout_s is not None:
            raise ConfigError(f"group_timeout_s={group_timeout_s!r} needs grouping: set group_key and group_size")
        if max_buffered < 1:
            raise ConfigError(f"max_buffered={max_buffered}: must be >= 1")
        self.include_response = include_response
        self.max_in_flight = max_buffered
        self.idempotent_across_restarts = False  # deduplication lives in this process only
        self._assembler = None if group_key is None or group_size is None else GroupAssembler(
            group_key=group_key, group_size=group_size, reward=reward, group_timeout_s=group_timeout_s,
            on_timeout=on_timeout, clock=clock)
        self._timer: asyncio.Task[None] | None = None
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._pending: dict[tuple[str, int], asyncio.Future[None]] = {}
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
        if self._timer is not None:
            self._timer.cancel()
            with suppress(asyncio.CancelledError):
                await self._timer
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
        rollouts = item if isinstance(item, RolloutGroup) else [item]
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
    def check_timeouts(self) -> None:
        """Apply the group timeout policy now (a timer does it too; each delivery does it first)."""
        if self._assembler is not None:
            self._apply(self._assembler.expire())

    def _admit(self, rollout: RebuiltRollout) -> None:
        if self._assembler is None:
            self._queue.put_nowait(rollout)
            return
        self._apply(self._assembler.add(rollout))
        if self._assembler.next_deadline() is not None and (self._timer is None or self._timer.done()):
            self._timer = asyncio.get_running_loop().create_task(expire_when_due(self._assembler, self._apply))

    def _apply(self, step: Step) -> None:
        for replaced in step.released:
            # The older version will never be taken: release its delivery as superseded.
            self._release((replaced.snapshot_id, replaced.version), remember=False)
        for group in step.dropped:  # the timeout policy said drop: the consumer may commit them
            for member in group:
                self._release((member.snapshot_id, member.version), remember=True)
        for group in step.emitted:
            self._queue.put_nowait(group)

    def _release(self, identity: tuple[str, int], *, remember: bool) -> None:
        future = self._pending.pop(identity, None)
        if future is not None and not future.done():
            future.set_result(None)
        if remember:
            self._acked[identity] = None

    @property
    def open_groups(self) -> int:
        return 0 if self._assembler is None else self._assembler.open_groups

    @property
    def dropped_groups(self) -> int:
        """Groups the timeout policy dropped (``on_timeout="drop"``)."""
        return 0 if self._assembler is None else self._assembler.dropped_groups
