"""Snapshots assembled from the stored bytes (pure; no framework).

A snapshot is the frozen rollout: every call in seq order with its verified
lineage, the incomplete markers (stored ones, then one per CallStarted intent
whose call was neither captured nor marked incomplete: a stored marker of that
call already says why it is lost) and the finish payload. Building it is the one
O(rollout) step of the fold, so it never decodes a token array: each
``SnapshotCall`` is its small prefix followed by the stored call body bytes,
spliced into the encoding of the snapshot's other fields. The result is exactly
``encode_snapshot(Snapshot(...))`` (a property test pins the byte equality), so
the same state gives the same bytes live and in replay.

Decodable by construction: a stored call body is either the exact body bytes
of an event that ``decode_event_with_body`` accepted (the codec refuses bytes
after an Avro body, so they are one ``CallCaptured`` body and nothing more) or
a re-encoding (``encode_call_body``), and the Snapshot schema embeds the same
named ``tokentrail.CallCaptured`` as the event (a test pins the schemas). Issue
15: an event with bytes after its body was once stored with them, and they
landed inside the snapshot's calls array, which no reader could decode.

Guarantee: the bytes returned are at most ``MAX_SNAPSHOT_BYTES``, which fits the
snapshots topic's ``max.message.bytes`` with room for the record framing. A
rollout whose snapshot would not fit is emitted with the same identity, no
calls and an incomplete marker ``snapshot_too_large`` naming the size, so the
consumer masks it with that reason (and can retire it) instead of the
processor failing on the send; rollout-events keeps the evidence for replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from processors.avro_bytes import long_bytes, str_bytes
from processors.state import (
    RolloutHeader,
    call_key,
    incomplete_codec,
    incomplete_key,
    intent_key,
    seq_key,
)
from processors.stored_call import read_stored_call_entry, read_stored_call_head
from schemas.codec import decode_snapshot, encode_snapshot
from schemas.errors import ContractError
from schemas.event_bytes import avro_long, avro_string
from schemas.kafka.framing import value_limit
from schemas.kafka.topics import MAX_MESSAGE_BYTES
from schemas.records import CallIncomplete, IncompleteReason, RolloutFinished, Snapshot

# Aliases of the schemas.records.IncompleteReason members (their one home), kept for importers.
CONFLICTING_PAYLOAD = IncompleteReason.CONFLICTING_PAYLOAD
SNAPSHOT_TOO_LARGE = IncompleteReason.SNAPSHOT_TOO_LARGE
INTENT_WITHOUT_CAPTURE = IncompleteReason.INTENT_WITHOUT_CAPTURE
# Kafka counts the whole record batch (framing, key, headers) against max.message.bytes.
MAX_SNAPSHOT_BYTES = value_limit(MAX_MESSAGE_BYTES)


class StateGone(ContractError):
    """A call body or marker the header counts is missing: the state is corrupt."""


class _Reader(Protocol):
    def get(self, key: bytes) -> bytes | None: ...


@dataclass(frozen=True, slots=True)
class EmittedSnapshot:
    """A snapshot as it goes on the topic (Avro single-object bytes), with its identity."""

    rollout_id: str
    snapshot_id: str
    version: int
    data: bytes

    def decode(self) -> Snapshot:
        return decode_snapshot(self.data)


def build_snapshot(state: _Reader, header: RolloutHeader, *, limit: int = MAX_SNAPSHOT_BYTES) -> EmittedSnapshot:
    """The frozen rollout described by ``header`` (its calls and markers read from ``state``)."""
    rid = header.rollout_id
    items: list[bytes | memoryview] = []
    for seq in range(header.n_calls):
        call_id = state.get(seq_key(rid, seq))
        raw = state.get(call_key(rid, call_id.decode())) if call_id is not None else None
        if raw is None:
            raise StateGone(f"state of rollout {rid!r} has no call seq {seq} (corrupt state)")
        late, note, body = read_stored_call_entry(raw)
        # SnapshotCall: seq (long), late, lineage_note, call -- the call bytes as stored.
        items.append(long_bytes(seq) + (b"\x01" if late else b"\x00") + str_bytes(note))
        items.append(body)
    markers = []
    for seq in range(header.n_incomplete):
        raw = state.get(incomplete_key(rid, seq))
        if raw is None:
            raise StateGone(f"state of rollout {rid!r} has no marker {seq} (corrupt state)")
        markers.append(incomplete_codec().decode(raw).marker)
    settled = {m.model_call_id for m in markers if m.model_call_id}
    markers.extend(_dangling_intents(state, header, settled))
    shell = _shell(header, markers)
    data = _splice_calls(shell, header, header.n_calls, items)
    if len(data) > limit:
        data = _too_large(header, markers, len(data), limit)
    return EmittedSnapshot(rid, header.snapshot_id, header.version, data)


def _dangling_intents(state: _Reader, header: RolloutHeader, settled: set[str]) -> list[CallIncomplete]:
    """A marker per CallStarted intent whose call has no capture and no marker in ``settled`` (derived, never stored)."""
    rid, out = header.rollout_id, []
    for seq in range(header.n_started):
        call_id = state.get(intent_key(rid, seq))
        if call_id is None:
            raise StateGone(f"state of rollout {rid!r} has no intent {seq} (corrupt state)")
        if call_id.decode() in settled:
            continue
        raw = state.get(call_key(rid, call_id.decode()))
        if raw is None or read_stored_call_head(raw).seq >= header.n_calls:
            out.append(CallIncomplete(
                model_call_id=call_id.decode(), reason=INTENT_WITHOUT_CAPTURE,
                detail="a CallStarted intent (the interceptor's before dispatch, or Gym's begin_call) was "
                       "published for this call, but neither its CallCaptured nor a CallIncomplete reached the "
                       "rollout before it was frozen: the call was still in flight, or its tokens were lost",
            ))
    return out


def _shell(header: RolloutHeader, markers: list[CallIncomplete]) -> Snapshot:
    conflicts = sorted({m.model_call_id for m in markers if m.reason == CONFLICTING_PAYLOAD and m.model_call_id})
    return Snapshot(
        rollout_id=header.rollout_id,
        snapshot_id=header.snapshot_id,
        version=header.version,
        frozen_at=header.frozen_at,
        calls=[],
        incomplete=bool(markers),
        incomplete_markers=markers,
        conflicting_call_ids=conflicts,
        late_writes=header.late_writes,
        finished=header.finished or RolloutFinished(),
    )


def _splice_calls(shell: Snapshot, header: RolloutHeader, n: int, items: list[bytes | memoryview]) -> bytes:
    encoded = encode_snapshot(shell)
    if not n:
        return encoded
    # Fields before `calls`: rollout_id, snapshot_id, version, schema_version, frozen_at.
    at = 10 + sum(len(x) for x in (
        avro_string(shell.rollout_id), avro_string(shell.snapshot_id), avro_long(shell.version),
        avro_long(shell.schema_version), avro_long(shell.frozen_at),
    ))
    if encoded[at] != 0:  # the empty array's terminator; anything else means the schema moved
        raise ContractError(f"snapshot layout of {header.rollout_id!r} is not the one this processor splices")
    # An Avro array: one block of n items, then the 0 terminator.
    return b"".join((encoded[:at], avro_long(n), *items, b"\x00", encoded[at + 1 :]))


def _too_large(header: RolloutHeader, markers: list[CallIncomplete], size: int, limit: int) -> bytes:
    marker = CallIncomplete(
        reason=SNAPSHOT_TOO_LARGE,
        detail=(f"the snapshot of {header.n_calls} calls is {size} bytes, over the {limit}-byte limit of the "
                "snapshots topic; its calls are left out (usually full, unresolved prompts); replay "
                "rollout-events to inspect them"),
    )
    return encode_snapshot(_shell(header, [*markers, marker]))
