"""Processor state: the key layout and the value records (pure; no framework).

A rollout's state is spread over small keys so that folding one event costs
O(size of that event), never O(size of the rollout):

    h\\0<rollout>               RolloutHeader   counters, lifecycle, finish payload
    c\\0<rollout>\\0<call_id>    StoredCall      one call body, stored once, delta-encoded
    s\\0<rollout>\\0<seq>        call id         enumeration order for the snapshot
    f\\0<rollout>\\0<fp>         FingerprintIndex  calls a child request can continue
    i\\0<rollout>\\0<seq>        StoredIncomplete  incomplete markers

Values are Avro single-object encoded, so the changelog is readable by any
Avro implementation and refuses values from a newer processor. Rollout ids
cannot contain NUL (schemas.ids), so keys of different rollouts never collide.

Crash consistency: the fold writes bodies before the header; the header is the
commit point. A body whose seq is not below the header's ``n_calls`` was
written by an event whose header write never happened, and is redone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from schemas.codec import RecordCodec, register_nested
from schemas.records import CallCaptured, CallIncomplete, RolloutFinished

STATE_SCHEMA_VERSION = 1


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


register_nested(RolloutHeader, {"finished": RolloutFinished})
register_nested(StoredCall, {"call": CallCaptured})
register_nested(FingerprintIndex, {"entries": [FingerprintEntry]})
register_nested(StoredIncomplete, {"marker": CallIncomplete})


@cache
def header_codec() -> RecordCodec[RolloutHeader]:
    return RecordCodec(RolloutHeader, "RolloutHeader", STATE_SCHEMA_VERSION)


@cache
def call_codec() -> RecordCodec[StoredCall]:
    return RecordCodec(StoredCall, "StoredCall", STATE_SCHEMA_VERSION)


@cache
def index_codec() -> RecordCodec[FingerprintIndex]:
    return RecordCodec(FingerprintIndex, "FingerprintIndex", STATE_SCHEMA_VERSION)


@cache
def incomplete_codec() -> RecordCodec[StoredIncomplete]:
    return RecordCodec(StoredIncomplete, "StoredIncomplete", STATE_SCHEMA_VERSION)


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


def rollout_of_key(key: bytes) -> str:
    """The rollout id a state key belongs to."""
    return key[2:].split(b"\x00", 1)[0].decode()
