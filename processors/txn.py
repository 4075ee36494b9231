"""The writes of one event as an overlay on the state, and what a fold returns (pure; no framework).

``Txn`` collects the writes of one event (readable back before they are
applied) and orders them for crash consistency: the header, the commit point,
goes last, or first for the one event that deletes (a retirement), see
``processors.fold``. ``FoldResult`` is what the shell applies and publishes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from processors.snapshot import EmittedSnapshot, build_snapshot
from processors.state import (
    FingerprintIndex,
    RolloutHeader,
    StoredCallHead,
    call_key,
    decode_header,
    encode_header,
    fingerprint_key,
    header_key,
    index_codec,
    set_applied,
)
from processors.stored_call import read_stored_call_head, read_stored_call_link
from schemas.errors import TokentrailError
from schemas.records import Snapshot

Position = tuple[int, int]  # (partition, offset) of the event in rollout-events


class StateReader(Protocol):
    """Read access to the processor state (a RocksDB-backed table, or a dict in replay)."""

    def get(self, key: bytes) -> bytes | None:
        """The value under ``key``, or None."""


class StateReadError(TokentrailError):
    """The state store failed to answer: not the event's fault, so the caller retries (never a dead letter).

    A ``TokentrailError`` (so callers catch one family), deliberately not a ``ContractError``: the fold
    turns contract errors into dead letters, and a failing store must stop the worker instead.
    """


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An event the fold refused, with the reason; the stream goes on."""

    reason: str
    detail: str
    rollout_id: str | None = None


@dataclass(slots=True)
class FoldResult:
    writes: dict[bytes, bytes | None] = field(default_factory=dict)  # in apply order; None deletes
    emitted: list[EmittedSnapshot] = field(default_factory=list)
    deadletters: list[DeadLetter] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.writes)

    @property
    def snapshots(self) -> list[Snapshot]:
        """The emitted snapshots, decoded (tests, replay); the topic gets ``emitted[i].data``."""
        return [s.decode() for s in self.emitted]


class Txn:
    """The writes of one event, readable back before they are applied (an overlay)."""

    def __init__(self, state: StateReader, rollout_id: str, position: Position | None) -> None:
        self._state = state
        self.rollout_id = rollout_id
        self.position = position
        self.result = FoldResult()
        self._writes = self.result.writes
        self.header_first = False  # the commit point comes first for an event that deletes
        self._header_key = header_key(rollout_id)
        raw = self._read(self._header_key)
        self._original_header = decode_header(raw) if raw is not None else None
        self.header = self._original_header or RolloutHeader(rollout_id=rollout_id)
        h = self.header
        self.redelivered = (
            position is not None and h.applied_partition == position[0] and position[1] <= h.applied_offset
        )

    def _read(self, key: bytes) -> bytes | None:
        try:
            return self._state.get(key)
        except Exception as exc:
            raise StateReadError(f"state read of {key!r} failed: {exc!r}") from exc

    def get(self, key: bytes) -> bytes | None:
        if key in self._writes:
            return self._writes[key]
        return self._read(key)

    def put(self, key: bytes, value: bytes | None) -> None:
        self._writes[key] = value

    def call_head(self, call_id: str) -> StoredCallHead | None:
        raw = self.get(call_key(self.rollout_id, call_id))
        return read_stored_call_head(raw) if raw is not None else None

    def call_link(self, call_id: str) -> tuple[int, str] | None:
        """The stored call's ``(cum_len, digest)``, or None when it has none."""
        raw = self.get(call_key(self.rollout_id, call_id))
        return read_stored_call_link(raw) if raw is not None else None

    def get_index(self, fingerprint: str) -> FingerprintIndex | None:
        raw = self.get(fingerprint_key(self.rollout_id, fingerprint))
        return index_codec().decode(raw) if raw is not None else None

    def emit(self, header: RolloutHeader) -> None:
        self.result.emitted.append(build_snapshot(self, header))

    def commit(self) -> FoldResult:
        if self.header is not self._original_header and self.header != self._original_header:
            if self.position is not None:
                # The fold only ever assigns ``header`` a header it has just built (replace_header, or the
                # constructor), so this one is new and unshared: it takes the position in place.
                set_applied(self.header, *self.position)
            encoded = encode_header(self.header)
            key = self._header_key
            self._writes.pop(key, None)
            if self.header_first:
                rest = dict(self._writes)
                self._writes.clear()
                self._writes[key] = encoded
                self._writes.update(rest)
            else:
                # Last, so that a crash between writes leaves a detectable, redoable body.
                self._writes[key] = encoded
        return self.result


def apply_writes(store: dict[bytes, bytes], result: FoldResult) -> None:
    """Apply a fold result's writes to a dict state (replay, tests)."""
    for key, value in result.writes.items():
        if value is None:
            store.pop(key, None)
        else:
            store[key] = value
