"""Replaying the fold offline: an in-memory state and one fold loop over a sequence of events (pure).

Replay/diagnosis, batch summaries, the NeMo Gym source adapter, the fold
benchmark and the tests re-run the live processor's fold over logged events.
This module is the one loop they share, so they fold exactly as the Faust
worker does (``processors.fold``: the same decode, key check and dead
letters) and none of them touches the state's key layout or codecs:

- ``MemoryState`` is the dict-backed ``StateReader`` (a ``dict`` of state key
  to value bytes, so byte-level comparisons stay plain dict equality), with
  typed accessors (``header``, ``retired``, ``frozen_snapshot``) and ``forget``;
- ``replay(records)`` folds records in order into a state, applying each
  result's writes before the next record, and yields one ``Replayed`` step per
  record (its ``FoldResult``: writes, snapshots, dead letters, notes).

Guarantees: the same records give the same states, snapshot bytes and dead
letters as the live worker (the fold is deterministic); ``replay`` is lazy (one
record at a time, so memory follows the state, not the log); without
``offsets_from`` it folds without Kafka positions, as a replay of a log does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from processors.fold import fold, fold_raw
from processors.snapshot import build_snapshot
from processors.state import RolloutHeader, header_codec, header_key, is_rollout_key
from processors.txn import FoldResult, apply_writes
from schemas.codec import decode_event
from schemas.errors import CodecError
from schemas.event_bytes import event_id_of
from schemas.records import RolloutEvent, Snapshot

__all__ = ["LogRecord", "MemoryState", "Record", "Replayed", "RolloutHeader", "replay"]


class MemoryState(dict[bytes, bytes]):
    """The processor state in memory: a ``StateReader`` over a plain dict (replay, tests, benchmarks).

    It is a ``dict`` so that ``get`` is the builtin one (the benchmark folds
    through it) and two states compare byte for byte with ``==``.
    """

    def apply(self, result: FoldResult) -> None:
        """Apply a fold result's writes, in order (None deletes)."""
        apply_writes(self, result)

    def header(self, rollout_id: str) -> RolloutHeader | None:
        """The rollout's decoded header (counters, lifecycle, finish payload); None if it has no state."""
        raw = self.get(header_key(rollout_id))
        return header_codec().decode(raw) if raw is not None else None

    def retired(self, rollout_id: str) -> bool:
        """Whether the rollout was retired (its state is a tombstone)."""
        header = self.header(rollout_id)
        return header is not None and header.retired

    def frozen_snapshot(self, rollout_id: str) -> Snapshot | None:
        """The snapshot the rollout's current freeze emitted, rebuilt from the state (the same bytes), or None
        when it is not frozen, changed since its freeze, or retired.

        A finish repeated with the same payload emits nothing (one record per rollout attempt,
        ``processors.fold``): a reader that finished again and wants the decision reads it here.
        """
        header = self.header(rollout_id)
        if header is None or not header.frozen or header.retired or header.changed_since_freeze:
            return None
        return build_snapshot(self, header).decode()

    def forget(self, rollout_id: str) -> None:
        """Drop every key of the rollout, tombstone included: afterwards the rollout is unknown.

        For memory that follows the rollouts in flight. A retired rollout costs
        O(1): its retirement, applied whole, deleted every key but the tombstone
        (``processors.fold``'s sweep). Any other rollout is found by a scan.
        """
        header = self.header(rollout_id)
        self.pop(header_key(rollout_id), None)
        if header is not None and header.retired:
            return
        for key in [k for k in self if is_rollout_key(k, rollout_id)]:
            del self[key]


class LogRecord(Protocol):
    """A record as read from rollout-events (``consumers.replay.eventlog.LoggedEvent`` is one)."""

    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes: ...


# A logged record, a (key, value) pair, or an already decoded event (folded without its bytes).
Record = LogRecord | tuple[bytes | None, bytes] | RolloutEvent


@dataclass(frozen=True, slots=True)
class Replayed:
    """One folded record: the record as given, and what the fold did with it."""

    record: Any
    value: bytes | None  # the encoded event (None when a decoded RolloutEvent was given)
    result: FoldResult

    @property
    def snapshots(self) -> list[Snapshot]:
        return self.result.snapshots

    @property
    def event_id(self) -> str | None:
        """The record's event id; None when it is not a decodable event (the fold dead-lettered it)."""
        if self.value is None:
            event: RolloutEvent = self.record  # no bytes: a decoded event was given
            return event.event_id
        try:
            return event_id_of(self.value)
        except (CodecError, IndexError, UnicodeDecodeError):
            return None

    def event(self) -> RolloutEvent | None:
        """The decoded event; None when it is not decodable (the fold said why in a dead letter)."""
        if self.value is None:
            event: RolloutEvent = self.record  # no bytes: a decoded event was given
            return event
        try:
            return decode_event(self.value)
        except Exception:
            return None


def replay(
    records: Iterable[Record],
    *,
    state: MemoryState | None = None,
    key: bytes | None = None,
    offsets_from: int | None = None,
    stop_after: str | None = None,
    forget_retired: bool = False,
) -> Iterator[Replayed]:
    """Fold ``records`` in order into ``state`` (a fresh one by default), yielding one step per record.

    - ``key``: fold every record as keyed by this (a rollout's key), instead of each record's own key;
    - ``offsets_from``: fold with Kafka positions (partition 0, consecutive offsets from this), as a
      live worker does; None folds without positions, as a replay of a log does;
    - ``stop_after``: stop once the record with this event id has been folded (and yielded);
    - ``forget_retired``: drop a rollout's state as soon as it is retired (nothing more can change
      its snapshot, so memory follows the rollouts in flight; a later write starts a fresh state).
    """
    state = MemoryState() if state is None else state
    rollout_key: bytes | None
    for i, record in enumerate(records):
        position = None if offsets_from is None else (0, offsets_from + i)
        if isinstance(record, RolloutEvent):
            value, result, rollout_key = None, fold(state, record, position=position), record.rollout_id.encode()
        else:
            own_key, value = record if isinstance(record, tuple) else (record.key, record.value)
            rollout_key = own_key if key is None else key
            result = fold_raw(state, rollout_key, value, position=position)
        state.apply(result)
        step = Replayed(record, value, result)
        if forget_retired and result.changed:
            # Only a write can retire, and a record that wrote is a valid event of its key's rollout.
            if rollout_key is not None:
                rollout_id = rollout_key.decode()
            else:
                written = step.event()
                assert written is not None  # it wrote, so it decoded
                rollout_id = written.rollout_id
            if state.retired(rollout_id):
                state.forget(rollout_id)
        yield step
        if stop_after is not None and step.event_id == stop_after:
            return
