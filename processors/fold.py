"""The fold: everything about a rollout is decided from its ordered events.

``fold(state, event)`` is pure and deterministic: it reads the rollout's state
through a ``StateReader`` and returns the writes to apply (header last: the
header is the commit point), the snapshots to emit and the dead letters to
publish. Live (Faust over RocksDB) and replay (a dict) run the same code, so
the same events give the same snapshots, byte for byte.

Guarantees:
- Idempotent: a repeated event (same event id; or same model_call_id with the
  same payload bytes) changes nothing. A different payload for a known call
  marks the rollout incomplete with reason ``conflicting_payload``.
- Lineage: every parent claim is verified (full prompts: the digest of the
  parent's cumulative ids against the child's prompt prefix; delta prompts: the
  parent digest and lengths), and calls that arrived unresolved are resolved
  from the events alone (``processors.lineage``). Nothing is guessed.
- Lifecycle: RolloutFinished freezes (re-freezing an unchanged rollout re-emits
  the same snapshot identity); every state change bumps the version; writes
  after a freeze are kept as evidence; RetireRequested removes state only for
  the exact snapshot id and version and leaves a tombstone.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Protocol

from processors import lineage
from processors.state import (
    FingerprintEntry,
    FingerprintIndex,
    RolloutHeader,
    StoredCall,
    StoredIncomplete,
    call_codec,
    call_key,
    fingerprint_key,
    header_codec,
    header_key,
    incomplete_codec,
    incomplete_key,
    index_codec,
    seq_key,
)
from schemas.codec import decode_event, event_body_bytes
from schemas.errors import CodecError, ContractError
from schemas.ids import validate_rollout_id
from schemas.records import (
    CallCaptured,
    CallIncomplete,
    RetireRequested,
    RolloutEvent,
    RolloutFinished,
    Snapshot,
    SnapshotCall,
)

CONFLICTING_PAYLOAD = "conflicting_payload"


class StateReader(Protocol):
    """Read access to the processor state (a RocksDB-backed table, or a dict in replay)."""

    def get(self, key: bytes) -> bytes | None:
        """The value under ``key``, or None."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An event the fold refused, with the reason; the stream goes on."""

    reason: str
    detail: str
    rollout_id: str | None = None


@dataclass(slots=True)
class FoldResult:
    writes: dict[bytes, bytes | None] = field(default_factory=dict)  # None deletes; header last
    snapshots: list[Snapshot] = field(default_factory=list)
    deadletters: list[DeadLetter] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.writes)


def fold_raw(state: StateReader, key: bytes | None, value: bytes) -> FoldResult:
    """Decode one Kafka record and fold it; undecodable or invalid records become dead letters."""
    try:
        event = decode_event(value)
        validate_rollout_id(event.rollout_id)
        if key is not None and key != event.rollout_id.encode():
            raise ContractError(
                f"record key {key!r} differs from rollout_id {event.rollout_id!r}: producers must key "
                "every event by its UTF-8 rollout id"
            )
    except (CodecError, ContractError) as exc:
        return FoldResult(deadletters=[DeadLetter(type(exc).__name__, str(exc), _safe_key(key))])
    payload = hashlib.sha256(event_body_bytes(value)).hexdigest()
    return fold(state, event, payload_digest=payload)


def fold(state: StateReader, event: RolloutEvent, *, payload_digest: str | None = None) -> FoldResult:
    """Fold one decoded event into the state; see the module docstring for the guarantees."""
    txn = _Txn(state, event.rollout_id)
    body = event.body
    if txn.header.retired and not isinstance(body, RetireRequested):
        txn.header = dataclasses.replace(txn.header, writes_after_retire=txn.header.writes_after_retire + 1)
        txn.result.deadletters.append(
            DeadLetter(
                "write_after_retire",
                f"{type(body).__name__} event {event.event_id} arrived after rollout {event.rollout_id!r} "
                f"was retired (snapshot {txn.header.snapshot_id} v{txn.header.version}); a late writer of a "
                "retired attempt: use a new rollout id per attempt",
                event.rollout_id,
            )
        )
    elif isinstance(body, CallCaptured):
        _fold_capture(txn, event, body, payload_digest or _payload_digest(event))
    elif isinstance(body, CallIncomplete):
        _fold_incomplete(txn, event.event_id, body)
    elif isinstance(body, RolloutFinished):
        _fold_finished(txn, event, body)
    elif isinstance(body, RetireRequested):
        _fold_retire(txn, body)
    return txn.commit()


def _fold_capture(txn: _Txn, event: RolloutEvent, call: CallCaptured, payload: str) -> None:
    header = txn.header
    existing = txn.get_call(call.model_call_id)
    if existing is not None and existing.seq < header.n_calls:
        if existing.payload_digest == payload:
            txn.result.notes.append(f"duplicate call {call.model_call_id}")
            return
        marker = CallIncomplete(
            model_call_id=call.model_call_id,
            reason=CONFLICTING_PAYLOAD,
            route=call.facts.route,
            detail=f"payload {payload[:16]} differs from the stored {existing.payload_digest[:16]}",
            created_at=call.created_at,
        )
        _fold_incomplete(txn, event.event_id, marker)
        return
    # New call, or a body left by an event whose header write never happened: (re)apply.
    stored_form, note = lineage.decide(txn, call)
    seq = header.n_calls
    txn.put(call_key(txn.rollout_id, call.model_call_id), call_codec().encode(
        StoredCall(seq=seq, payload_digest=payload, call=stored_form, late=header.frozen, lineage_note=note)
    ))
    txn.put(seq_key(txn.rollout_id, seq), call.model_call_id.encode())
    if call.continuation_fingerprint:
        _index_call(txn, call)
    txn.header = dataclasses.replace(
        header,
        n_calls=seq + 1,
        version=header.version + 1,
        late_writes=header.late_writes + (1 if header.frozen else 0),
    )


def _index_call(txn: _Txn, call: CallCaptured) -> None:
    key = fingerprint_key(txn.rollout_id, call.continuation_fingerprint)
    index = txn.get_index(call.continuation_fingerprint)
    entries = list(index.entries) if index else []
    if any(e.call_id == call.model_call_id for e in entries):
        return
    entries.append(FingerprintEntry(call_id=call.model_call_id, cum_len=call.cum_len, digest=call.digest))
    txn.put(key, index_codec().encode(FingerprintIndex(entries=entries)))


def _fold_incomplete(txn: _Txn, event_id: str, marker: CallIncomplete) -> None:
    header = txn.header
    if event_id in header.incomplete_event_ids:
        txn.result.notes.append(f"duplicate incomplete event {event_id}")
        return
    seq = header.n_incomplete
    txn.put(
        incomplete_key(txn.rollout_id, seq),
        incomplete_codec().encode(StoredIncomplete(event_id=event_id, marker=marker, late=header.frozen)),
    )
    txn.header = dataclasses.replace(
        header,
        n_incomplete=seq + 1,
        incomplete_event_ids=[*header.incomplete_event_ids, event_id],
        version=header.version + 1,
        late_writes=header.late_writes + (1 if header.frozen else 0),
    )


def _fold_finished(txn: _Txn, event: RolloutEvent, finished: RolloutFinished) -> None:
    header = txn.header
    if header.frozen and not header.changed_since_freeze:
        # Unchanged since the freeze: the same snapshot identity again (a redelivered
        # or repeated finish must never mint a second identity for the same state).
        txn.result.snapshots.append(build_snapshot(txn, header))
        return
    if event.event_id in header.finish_event_ids:
        # A redelivered finish after later writes: that freeze already happened.
        txn.result.notes.append(f"duplicate finish event {event.event_id}")
        return
    version = header.version + 1
    txn.header = dataclasses.replace(
        header,
        version=version,
        frozen=True,
        frozen_version=version,
        snapshot_id=snapshot_id_for(txn.rollout_id, version),
        frozen_at=event.emitted_at,
        finished=finished,
        finish_event_ids=[*header.finish_event_ids, event.event_id],
    )
    txn.result.snapshots.append(build_snapshot(txn, txn.header))


def _fold_retire(txn: _Txn, retire: RetireRequested) -> None:
    header = txn.header
    if header.retired:
        txn.result.notes.append("already retired")
        return
    if not (header.frozen and retire.snapshot_id == header.snapshot_id and retire.version == header.version):
        txn.result.notes.append(
            f"stale retire of {retire.snapshot_id} v{retire.version} kept the evidence "
            f"(current: {header.snapshot_id or 'not frozen'} v{header.version})"
        )
        return
    for seq in range(header.n_calls):
        call_id = txn.get(seq_key(txn.rollout_id, seq))
        if call_id is None:
            continue
        stored = txn.get_call(call_id.decode())
        if stored is not None and stored.call.continuation_fingerprint:
            txn.put(fingerprint_key(txn.rollout_id, stored.call.continuation_fingerprint), None)
        txn.put(call_key(txn.rollout_id, call_id.decode()), None)
        txn.put(seq_key(txn.rollout_id, seq), None)
    for seq in range(header.n_incomplete):
        txn.put(incomplete_key(txn.rollout_id, seq), None)
    # The tombstone keeps the identity so late writers of this attempt are detected.
    txn.header = RolloutHeader(
        rollout_id=txn.rollout_id,
        version=header.version,
        frozen=True,
        frozen_version=header.frozen_version,
        snapshot_id=header.snapshot_id,
        frozen_at=header.frozen_at,
        retired=True,
    )


def build_snapshot(state: _Txn, header: RolloutHeader) -> Snapshot:
    """The frozen rollout: every call in seq order with its verified lineage, and the markers."""
    calls = []
    for seq in range(header.n_calls):
        call_id = state.get(seq_key(header.rollout_id, seq))
        stored = state.get_call(call_id.decode()) if call_id else None
        if stored is None:
            raise ContractError(f"state of rollout {header.rollout_id!r} lost call seq {seq}: state is corrupt")
        calls.append(SnapshotCall(seq=seq, call=stored.call, late=stored.late, lineage_note=stored.lineage_note))
    markers = []
    for seq in range(header.n_incomplete):
        raw = state.get(incomplete_key(header.rollout_id, seq))
        if raw is None:
            raise ContractError(f"state of rollout {header.rollout_id!r} lost marker {seq}: state is corrupt")
        markers.append(incomplete_codec().decode(raw).marker)
    conflicts = sorted({m.model_call_id for m in markers if m.reason == CONFLICTING_PAYLOAD and m.model_call_id})
    return Snapshot(
        rollout_id=header.rollout_id,
        snapshot_id=header.snapshot_id,
        version=header.version,
        frozen_at=header.frozen_at,
        calls=calls,
        incomplete=bool(markers),
        incomplete_markers=markers,
        conflicting_call_ids=conflicts,
        late_writes=header.late_writes,
        finished=header.finished or RolloutFinished(),
    )


def snapshot_id_for(rollout_id: str, version: int) -> str:
    """Deterministic: the fold is deterministic, so (rollout, version) names one state."""
    return hashlib.sha256(f"tokentrail-snapshot\x00{rollout_id}\x00{version}".encode()).hexdigest()[:32]


class _Txn:
    """The writes of one event, readable back before they are applied (an overlay)."""

    def __init__(self, state: StateReader, rollout_id: str) -> None:
        self._state = state
        self.rollout_id = rollout_id
        self.result = FoldResult()
        self._writes = self.result.writes
        raw = state.get(header_key(rollout_id))
        self._original_header = header_codec().decode(raw) if raw is not None else None
        self.header = self._original_header or RolloutHeader(rollout_id=rollout_id)

    def get(self, key: bytes) -> bytes | None:
        if key in self._writes:
            return self._writes[key]
        return self._state.get(key)

    def put(self, key: bytes, value: bytes | None) -> None:
        self._writes[key] = value

    def get_call(self, call_id: str) -> StoredCall | None:
        raw = self.get(call_key(self.rollout_id, call_id))
        return call_codec().decode(raw) if raw is not None else None

    def get_index(self, fingerprint: str) -> FingerprintIndex | None:
        raw = self.get(fingerprint_key(self.rollout_id, fingerprint))
        return index_codec().decode(raw) if raw is not None else None

    def commit(self) -> FoldResult:
        if self.header != self._original_header:
            # Last, so that a crash between writes leaves a detectable, redoable body.
            self._writes.pop(header_key(self.rollout_id), None)
            self._writes[header_key(self.rollout_id)] = header_codec().encode(self.header)
        return self.result


def _payload_digest(event: RolloutEvent) -> str:
    from schemas.codec import encode_event

    return hashlib.sha256(event_body_bytes(encode_event(event))).hexdigest()


def _safe_key(key: bytes | None) -> str | None:
    if key is None:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return key.hex()


def apply_writes(store: dict[bytes, bytes], result: FoldResult) -> None:
    """Apply a fold result's writes to a dict state (replay, tests)."""
    for key, value in result.writes.items():
        if value is None:
            store.pop(key, None)
        else:
            store[key] = value
