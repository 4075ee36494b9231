"""Commit points of a consumer whose deliveries may complete out of order.

Kafka commits one offset per partition, meaning "everything before it is
done". With several deliveries in flight, a later snapshot can finish before an
earlier one; the commit point may only advance over a *contiguous* prefix of
finished offsets. ``OffsetTracker`` keeps, per partition, the offsets started
(in poll order, which is offset order) and those finished, and says when the
commit point moves. Thread-safe: a rebalance callback may ``forget``
partitions from the client's thread.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

TopicPartition = tuple[str, int]


class OffsetTracker:
    """Per-partition contiguous-completion tracking; see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started: dict[TopicPartition, deque[int]] = {}
        self._finished: dict[TopicPartition, set[int]] = {}

    def start(self, tp: TopicPartition, offset: int) -> None:
        """Record that ``offset`` was polled and is being processed."""
        with self._lock:
            self._started.setdefault(tp, deque()).append(offset)
            self._finished.setdefault(tp, set())

    def finish(self, tp: TopicPartition, offset: int) -> int | None:
        """Mark ``offset`` done; return the new commit offset (next to read) if the commit point moved."""
        with self._lock:
            started = self._started.get(tp)
            if started is None or offset not in started:
                return None  # forgotten (revoked) meanwhile: the new owner decides
            finished = self._finished[tp]
            finished.add(offset)
            moved = None
            while started and started[0] in finished:
                moved = started.popleft()
                finished.discard(moved)
            return moved + 1 if moved is not None else None

    def pending(self, tp: TopicPartition) -> list[int]:
        with self._lock:
            return list(self._started.get(tp, ()))

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """Drop partitions this consumer no longer owns."""
        with self._lock:
            for tp in tps:
                self._started.pop(tp, None)
                self._finished.pop(tp, None)
