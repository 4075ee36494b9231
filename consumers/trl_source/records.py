"""Waiting for one rollout's delivered record on the Kafka sink's topic (``tokentrail.rebuilt``).

``RebuiltTopic(bootstrap).wait(rollout_id, since_ms, deadline)`` reads the one partition the
rollout's key lands on (Kafka's partitioner, ``schemas.kafka.partitioning``) from ``since_ms``
(the session's start: no group, no offsets to commit, any number of readers) until the record
arrives or the deadline passes (``TimeoutError``). The first record of the rollout is returned:
records are idempotent by ``(snapshot_id, version)``, and the first finish decides the result.
It is picklable (the client is made lazily, per process), as TRL pickles the session factory
into its rollout worker's spawned child.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

from schemas.codec import decode_rebuilt
from schemas.kafka.partitioning import partition_for
from schemas.kafka.scan import TopicReader
from schemas.kafka.topics import REBUILT, key_for
from schemas.records import RebuiltRollout

__all__ = ["RebuiltTopic", "RecordSource"]


class RecordSource(Protocol):
    def wait(self, rollout_id: str, since_ms: int, deadline: float) -> RebuiltRollout:
        """The rollout's delivered record; ``TimeoutError`` once ``time.monotonic()`` passes ``deadline``."""
        ...


class RebuiltTopic:
    """Delivered records from the Kafka sink's topic (``tokentrail consume --sink kafka``)."""

    def __init__(self, bootstrap: str, topic: str = REBUILT, *, poll_s: float = 0.5) -> None:
        self.bootstrap, self.topic, self.poll_s = bootstrap, topic, poll_s
        self._local = threading.local()  # one reader per thread (a TopicReader is not thread-safe)

    def __getstate__(self) -> dict[str, Any]:
        return {"bootstrap": self.bootstrap, "topic": self.topic, "poll_s": self.poll_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["bootstrap"], state["topic"], poll_s=state["poll_s"])  # type: ignore[misc]

    def wait(self, rollout_id: str, since_ms: int, deadline: float) -> RebuiltRollout:
        reader = self._reader()
        key = key_for(rollout_id)
        partition = partition_for(key, reader.partitions(self.topic))
        while True:
            for message in reader.read(self.topic, partition, from_time_ms=since_ms, key=key):
                return decode_rebuilt(message.value())
            if time.monotonic() + self.poll_s > deadline:
                raise TimeoutError(f"rollout {rollout_id}: no record on {self.topic} before the deadline; is "
                                   "`tokentrail consume --sink kafka` running, and was the rollout finished?")
            time.sleep(self.poll_s)

    def _reader(self) -> TopicReader:
        reader = getattr(self._local, "reader", None)
        if reader is None:
            reader = self._local.reader = TopicReader(self.bootstrap)
        return reader
