"""Processor state: the key layout and the value records (pure; no framework).

A rollout's state is spread over small keys so that folding one event costs
O(size of that event), never O(size of the rollout):

    h\\0<rollout>               RolloutHeader   counters, lifecycle, finish payload, applied position
    c\\0<rollout>\\0<call_id>    StoredCall      one call body, stored once, delta-encoded
    s\\0<rollout>\\0<seq>        call id         enumeration order for the snapshot
    f\\0<rollout>\\0<fp>         FingerprintIndex  calls a child request can continue
    i\\0<rollout>\\0<seq>        StoredIncomplete  incomplete markers
    t\\0<rollout>\\0<seq>        call id         CallStarted intents, in order
    b\\0<rollout>\\0<call_id>    seq (4 bytes)   the call's intent, if any (duplicate check)

Values are Avro single-object encoded, so the changelog is readable by any
Avro implementation and refuses values from a newer processor. Rollout ids
cannot contain NUL (schemas.ids), so keys of different rollouts never collide.

Crash consistency: the fold writes bodies before the header; the header is the
commit point. A body whose seq is not below the header's ``n_calls`` was
written by an event whose header write never happened, and is redone. The
exception is retirement, which deletes: its tombstone header goes first (with
the counts kept), and its deletes are redone when it is redelivered.

Hot path: a ``StoredCall`` is the published ``CallCaptured`` body bytes behind
a small prefix (seq, payload digest, late flag, lineage note, and copies of the
call's cum_len, digest and continuation fingerprint).
``encode_stored_call`` writes that prefix by hand and appends the body bytes
unchanged, and ``read_stored_call_head`` reads the prefix without decoding the
token arrays; both produce and accept exactly what ``call_codec()`` does (a
test pins the byte equality), so the state stays plain Avro.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any

import fastavro

from schemas.codec import (
    MAGIC,
    RecordCodec,
    avro_long,
    avro_string,
    read_long,
    read_string,
    to_avro,
    with_nested,
)
from schemas.records import CallCaptured, CallIncomplete, RolloutFinished

STATE_SCHEMA_VERSION = 1
_HEADER_LEN = 10  # magic + 8-byte schema fingerprint


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutHeader:
    rollout_id: str
    version: int = 0
    n_calls: int = 0
    n_incomplete: int = 0
    incomplete_event_ids: list[str] = field(default_factory=list)
    late_writes: int = 0
    frozen: bool = False
    frozen_version: int = -1
    snapshot_id: str = ""
    frozen_at: int = 0
    finish_event_ids: list[str] = field(default_factory=list)
    finished: RolloutFinished | None = None
    retired: bool = False
    writes_after_retire: int = 0
    incomplete_digests: list[str] = field(default_factory=list)
    applied_partition: int = -1
    applied_offset: int = -1
    n_started: int = 0
    schema_version: int = STATE_SCHEMA_VERSION

    @property
    def changed_since_freeze(self) -> bool:
        return self.version != self.frozen_version


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredCall:
    seq: int
    payload_digest: str
    call: CallCaptured
    late: bool = False
    lineage_note: str = ""
    cum_len: int = 0
    digest: str = ""
    continuation_fingerprint: str = ""


@dataclass(frozen=True, slots=True)
class StoredCallHead:
    """The prefix of a stored call, read without decoding its token arrays."""

    seq: int
    payload_digest: str
    late: bool
    lineage_note: str
    cum_len: int
    digest: str
    continuation_fingerprint: str
    body: memoryview  # the CallCaptured Avro body bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class FingerprintEntry:
    call_id: str
    cum_len: int
    digest: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FingerprintIndex:
    entries: list[FingerprintEntry]


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredIncomplete:
    event_id: str
    marker: CallIncomplete
    late: bool = False


# How the state records' nested fields convert, handed to their codecs explicitly: the contract's
# table (schemas.codec) is never mutated, so importing this module changes no other codec.
STATE_NESTED = with_nested({
    RolloutHeader: {"finished": RolloutFinished},
    StoredCall: {"call": CallCaptured},
    FingerprintIndex: {"entries": [FingerprintEntry]},
    StoredIncomplete: {"marker": CallIncomplete},
})


@cache
def header_codec() -> RecordCodec[RolloutHeader]:
    return RecordCodec(RolloutHeader, "RolloutHeader", STATE_SCHEMA_VERSION, nested=STATE_NESTED)


@cache
def call_codec() -> RecordCodec[StoredCall]:
    return RecordCodec(StoredCall, "StoredCall", STATE_SCHEMA_VERSION, nested=STATE_NESTED)


@cache
def index_codec() -> RecordCodec[FingerprintIndex]:
    return RecordCodec(FingerprintIndex, "FingerprintIndex", STATE_SCHEMA_VERSION, nested=STATE_NESTED)


@cache
def incomplete_codec() -> RecordCodec[StoredIncomplete]:
    return RecordCodec(StoredIncomplete, "StoredIncomplete", STATE_SCHEMA_VERSION, nested=STATE_NESTED)


def header_key(rollout_id: str) -> bytes:
    return b"h\x00" + rollout_id.encode()


def call_key(rollout_id: str, call_id: str) -> bytes:
    return b"c\x00" + rollout_id.encode() + b"\x00" + call_id.encode()


def seq_key(rollout_id: str, seq: int) -> bytes:
    return b"s\x00" + rollout_id.encode() + b"\x00" + seq.to_bytes(4, "big")


def fingerprint_key(rollout_id: str, fingerprint: str) -> bytes:
    return b"f\x00" + rollout_id.encode() + b"\x00" + fingerprint.encode()


def incomplete_key(rollout_id: str, seq: int) -> bytes:
    return b"i\x00" + rollout_id.encode() + b"\x00" + seq.to_bytes(4, "big")


def intent_key(rollout_id: str, seq: int) -> bytes:
    return b"t\x00" + rollout_id.encode() + b"\x00" + seq.to_bytes(4, "big")


def intent_call_key(rollout_id: str, call_id: str) -> bytes:
    return b"b\x00" + rollout_id.encode() + b"\x00" + call_id.encode()


def is_rollout_key(key: bytes, rollout_id: str) -> bool:
    """Whether a state key belongs to ``rollout_id`` (its header, or any key under it)."""
    rid = rollout_id.encode()
    # Ids hold no NUL (schemas.ids), so the NUL after the id separates "r1" from "r10".
    return key[2:] == rid or key[2:].startswith(rid + b"\x00")


# ---------------------------------------------------------------- Avro by hand (hot path)

@cache
def _call_schema() -> dict[str, Any]:
    # The CallCaptured schema as StoredCall (and Snapshot) embed it: one parse, one source of truth.
    for f in call_codec().schema["fields"]:
        if f["name"] == "call":
            schema: dict[str, Any] = f["type"]
            return schema
    raise AssertionError("StoredCall.avsc has no call field")


def encode_call_body(call: CallCaptured) -> bytes:
    """The Avro body bytes of a call (what an event carries after its union branch)."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, _call_schema(), to_avro(call))
    return buf.getvalue()


def encode_stored_call(
    *, seq: int, payload_digest: str, late: bool, lineage_note: str, call: CallCaptured, body: bytes
) -> bytes:
    """``call_codec().encode(StoredCall(...))`` without re-encoding ``call``: its ``body`` bytes are appended."""
    return b"".join((
        MAGIC, call_codec().fingerprint, avro_long(seq), avro_string(payload_digest), b"\x01" if late else b"\x00",
        avro_string(lineage_note), avro_long(call.cum_len), avro_string(call.digest),
        avro_string(call.continuation_fingerprint), body,
    ))


def read_stored_call_head(data: bytes) -> StoredCallHead:
    """The prefix of a stored call; values from an older writer schema are decoded and re-encoded."""
    if data[2:_HEADER_LEN] != call_codec().fingerprint:
        old = call_codec().decode(data)
        data = encode_stored_call(seq=old.seq, payload_digest=old.payload_digest, late=old.late,
                                  lineage_note=old.lineage_note, call=old.call, body=encode_call_body(old.call))
    view = memoryview(data)
    seq, pos = read_long(view, _HEADER_LEN)
    payload_digest, pos = read_string(view, pos)
    late = view[pos] == 1
    note, pos = read_string(view, pos + 1)
    cum_len, pos = read_long(view, pos)
    digest, pos = read_string(view, pos)
    fingerprint, pos = read_string(view, pos)
    return StoredCallHead(seq, payload_digest, late, note, cum_len, digest, fingerprint, view[pos:])


# ---------------------------------------------------------------- the header by hand (hot path)
#
# Every event reads, changes and writes its rollout's header. ``encode_header`` writes what
# ``header_codec().encode`` writes, field by field in the schema's order (a test pins the byte
# equality and the field list); ``decode_header`` remembers the header each encoded bytes came
# from, so the next event of the rollout, which reads those bytes back, skips the decode.
# Headers are immutable: frozen, and the fold builds new lists rather than changing one.

_HEADER_SCHEMA_FIELDS = (
    "rollout_id", "schema_version", "version", "n_calls", "n_incomplete", "incomplete_event_ids", "late_writes",
    "frozen", "frozen_version", "snapshot_id", "frozen_at", "finish_event_ids", "finished", "retired",
    "writes_after_retire", "incomplete_digests", "applied_partition", "applied_offset", "n_started",
)
_HEADER_FIELDS = tuple(f.name for f in fields(RolloutHeader))
_MEMO_LIMIT = 4096  # headers remembered; the rollouts in flight on a worker, give or take
_memo: dict[bytes, RolloutHeader] = {}


def decode_header(raw: bytes) -> RolloutHeader:
    """``header_codec().decode(raw)``; the header itself when these bytes came from ``encode_header``."""
    if type(raw) is not bytes:
        return header_codec().decode(raw)
    header = _memo.get(raw)
    if header is None:
        header = header_codec().decode(raw)
        _remember(raw, header)
    return header


def encode_header(header: RolloutHeader) -> bytes:
    """Exactly ``header_codec().encode(header)``, without the generic datum and writer."""
    finished = header.finished
    if finished is None:
        tail = b"\x00"
    else:
        tail = b"".join((b"\x02", avro_long(finished.attempt), avro_string(finished.result_json),
                         _optional_string(finished.final_response_id), _optional_string(finished.final_text)))
    raw = b"".join((
        MAGIC, header_codec().fingerprint, avro_string(header.rollout_id), avro_long(header.schema_version),
        avro_long(header.version), avro_long(header.n_calls), avro_long(header.n_incomplete),
        _strings(header.incomplete_event_ids), avro_long(header.late_writes), b"\x01" if header.frozen else b"\x00",
        avro_long(header.frozen_version), avro_string(header.snapshot_id), avro_long(header.frozen_at),
        _strings(header.finish_event_ids), tail, b"\x01" if header.retired else b"\x00",
        avro_long(header.writes_after_retire), _strings(header.incomplete_digests), avro_long(header.applied_partition),
        avro_long(header.applied_offset), avro_long(header.n_started),
    ))
    _remember(raw, header)
    return raw


def replace_header(header: RolloutHeader, **changes: object) -> RolloutHeader:
    """``dataclasses.replace(header, **changes)`` for the hot path (the same fields, no generic machinery)."""
    new = object.__new__(RolloutHeader)
    for name in _HEADER_FIELDS:
        object.__setattr__(new, name, changes.pop(name) if name in changes else getattr(header, name))
    if changes:
        raise TypeError(f"RolloutHeader has no field(s) {sorted(changes)}")
    return new


def _remember(raw: bytes, header: RolloutHeader) -> None:
    if len(_memo) >= _MEMO_LIMIT:
        _memo.clear()  # bounded; the next event of each rollout decodes once more
    _memo[raw] = header


def _strings(values: list[str]) -> bytes:
    # An Avro array as fastavro writes it: one block of all the items, then the empty block.
    if not values:
        return b"\x00"
    return b"".join((avro_long(len(values)), *map(avro_string, values), b"\x00"))


def _optional_string(value: str | None) -> bytes:
    return b"\x00" if value is None else b"\x02" + avro_string(value)
