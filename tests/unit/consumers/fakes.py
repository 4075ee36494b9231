"""In-memory stand-ins for the confluent-kafka clients the consumer loop drives (unit tests only)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from schemas.codec import encode_snapshot
from schemas.records import RebuiltRollout


@dataclass
class FakeMessage:
    _value: bytes
    _offset: int
    _partition: int = 0
    _topic: str = "tokentrail.snapshots"
    _key: bytes | None = None

    def value(self) -> bytes:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def offset(self) -> int:
        return self._offset

    def partition(self) -> int:
        return self._partition

    def topic(self) -> str:
        return self._topic

    def error(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return 1, 1_700_000_000_000  # (TIMESTAMP_CREATE_TIME, ms), as confluent-kafka gives it


@dataclass
class Journal:
    """One ordered record of what every fake did, to assert cross-component ordering."""

    entries: list[tuple] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, *entry: Any) -> None:
        with self.lock:
            self.entries.append(entry)

    def kinds(self) -> list[str]:
        return [e[0] for e in self.entries]


class FakeConsumer:
    def __init__(self, journal: Journal, messages: list[FakeMessage]) -> None:
        self.journal = journal
        self.messages = list(messages)
        self.committed: dict[tuple[str, int], int] = {}
        self.closed = False

    def poll(self, timeout: float) -> FakeMessage | None:
        if self.messages:
            msg = self.messages.pop(0)
            self.journal.add("poll", msg.offset())
            return msg
        threading.Event().wait(min(timeout, 0.01))
        return None

    def commit(self, offsets: list[Any], asynchronous: bool = False) -> None:
        for tp in offsets:
            self.committed[(tp.topic, tp.partition)] = tp.offset
            self.journal.add("commit", tp.partition, tp.offset)

    def close(self) -> None:
        self.closed = True


class FakeProducer:
    def __init__(self, journal: Journal, fail_topics: tuple[str, ...] = ()) -> None:
        self.journal = journal
        self.fail_topics = fail_topics
        self.produced: list[tuple[str, bytes | None, bytes, list | None]] = []
        self._callbacks: list[Any] = []

    def produce(self, topic: str, key: bytes | None = None, value: bytes = b"", headers: list | None = None,
                on_delivery: Any = None) -> None:
        self.produced.append((topic, key, value, headers))
        self.journal.add("produce", topic)
        error = "broker down" if any(topic.endswith(t) for t in self.fail_topics) else None
        self._callbacks.append(lambda: on_delivery(error, None))

    def flush(self, timeout: float = 0) -> int:
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb()
        return 0


class RecordingSink:
    """A TrainerSink keeping delivered rollouts in memory; idempotent by identity."""

    def __init__(self, journal: Journal | None = None, fail: bool = False) -> None:
        self.journal = journal
        self.fail = fail
        self.delivered: list[RebuiltRollout] = []
        self.include_response = True

    async def deliver(self, rollout: RebuiltRollout) -> None:
        if self.fail:
            raise OSError("disk full")
        if any((r.snapshot_id, r.version) == (rollout.snapshot_id, rollout.version) for r in self.delivered):
            return
        self.delivered.append(rollout)
        if self.journal:
            self.journal.add("deliver", rollout.rollout_id)

    async def close(self) -> None:
        pass


def messages_for(snapshots: list[Any], partition: int = 0) -> list[FakeMessage]:
    return [FakeMessage(encode_snapshot(s), offset, partition, _key=s.rollout_id.encode())
            for offset, s in enumerate(snapshots)]
