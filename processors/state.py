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
call's cum_len, digest and continuation fingerprint), written and read by hand
in ``processors.stored_call``; the header, which every event reads and writes,
by hand below. Both are exactly what the codecs write (tests pin the byte
equality), so the state stays plain Avro.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cache
from operator import attrgetter

from processors.avro_bytes import long_bytes, str_bytes
from schemas.codec import MAGIC, RecordCodec, with_nested
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
_ALL_FIELDS = attrgetter(*_HEADER_FIELDS)
_FIELD_AT = {name: i for i, name in enumerate(_HEADER_FIELDS)}
# The slots' own descriptors: they set a field of a new (not yet shared) header despite frozen=True.
_SLOT_SETTERS = tuple(RolloutHeader.__dict__[name].__set__ for name in _HEADER_FIELDS)
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
        tail = b"".join((b"\x02", long_bytes(finished.attempt), str_bytes(finished.result_json),
                         _optional_string(finished.final_response_id), _optional_string(finished.final_text)))
    raw = b"".join((
        MAGIC, header_codec().fingerprint, str_bytes(header.rollout_id), long_bytes(header.schema_version),
        long_bytes(header.version), long_bytes(header.n_calls), long_bytes(header.n_incomplete),
        _strings(header.incomplete_event_ids), long_bytes(header.late_writes), b"\x01" if header.frozen else b"\x00",
        long_bytes(header.frozen_version), str_bytes(header.snapshot_id), long_bytes(header.frozen_at),
        _strings(header.finish_event_ids), tail, b"\x01" if header.retired else b"\x00",
        long_bytes(header.writes_after_retire), _strings(header.incomplete_digests), long_bytes(header.applied_partition),
        long_bytes(header.applied_offset), long_bytes(header.n_started),
    ))
    _remember(raw, header)
    return raw


def replace_header(header: RolloutHeader, **changes: object) -> RolloutHeader:
    """``dataclasses.replace(header, **changes)`` for the hot path (the same fields, no generic machinery)."""
    values = list(_ALL_FIELDS(header))
    for name, value in changes.items():
        at = _FIELD_AT.get(name)
        if at is None:
            raise TypeError(f"RolloutHeader has no field(s) {sorted(set(changes) - set(_FIELD_AT))}")
        values[at] = value
    new = object.__new__(RolloutHeader)
    for set_slot, value in zip(_SLOT_SETTERS, values):
        set_slot(new, value)
    return new


def set_applied(header: RolloutHeader, partition: int, offset: int) -> None:
    """Record the position that changed the rollout on a header the fold has just built (nothing holds it yet:
    ``replace_header`` or the constructor made it in this fold); one write where a copy would cost 19."""
    _SLOT_SETTERS[_FIELD_AT["applied_partition"]](header, partition)
    _SLOT_SETTERS[_FIELD_AT["applied_offset"]](header, offset)


def _remember(raw: bytes, header: RolloutHeader) -> None:
    if len(_memo) >= _MEMO_LIMIT:
        _memo.clear()  # bounded; the next event of each rollout decodes once more
    _memo[raw] = header


def _strings(values: list[str]) -> bytes:
    # An Avro array as fastavro writes it: one block of all the items, then the empty block.
    if not values:
        return b"\x00"
    return b"".join((long_bytes(len(values)), *map(str_bytes, values), b"\x00"))


def _optional_string(value: str | None) -> bytes:
    return b"\x00" if value is None else b"\x02" + str_bytes(value)
