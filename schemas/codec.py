"""Avro single-object encoding of the contract records, with fastavro only.

Wire form: ``C3 01`` + the 8-byte little-endian CRC-64-AVRO fingerprint of the
writer schema's parsing canonical form + the Avro binary body (Avro 1.12
specification, "Single object encoding"). The ``.avsc`` files in
``schemas/avro`` are the source of truth; ``schemas/avro/history`` keeps every
writer schema ever released, and a reader accepts all of them (resolving old
writers to the current reader schema). A record from an unknown writer schema,
or with a ``schema_version`` newer than this reader supports, is refused with a
message that says to upgrade the reader.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Mapping
from enum import StrEnum
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any, Generic, TypeVar, cast

import fastavro
from fastavro.schema import fingerprint, load_schema, to_parsing_canonical_form

from schemas.errors import CodecError, SchemaVersionError
from schemas.policy_versions import PolicyVersion
from schemas.records import (
    EVENT_SCHEMA_VERSION,
    REBUILT_SCHEMA_VERSION,
    SNAPSHOT_SCHEMA_VERSION,
    CallCaptured,
    CallFacts,
    CallIncomplete,
    CallSpan,
    CallStarted,
    CaptureMetrics,
    Dialect,
    MaskReason,
    ParentResolution,
    RebuiltRollout,
    RetireRequested,
    RolloutEvent,
    RolloutFinished,
    Snapshot,
    SnapshotCall,
    TerminalAttribution,
    Trace,
    TraceAttachment,
    Trajectory,
    VersionSpan,
)
from schemas.wire_kinds import F64, HEX, HEXES, LOG_PROBS, U32, HashBytes, LogProbs, Packed
from schemas.writer_history import archived_writers, reader_for, schema_dir

MAGIC = b"\xc3\x01"
_HEADER_LEN = 10

T = TypeVar("T")

# How nested fields convert: a record class, [record class] for arrays of
# records, an enum class, or the event-body union.
_BODY_NAMES: dict[type, str] = {
    CallCaptured: "tokentrail.CallCaptured",
    CallIncomplete: "tokentrail.CallIncomplete",
    RolloutFinished: "tokentrail.RolloutFinished",
    RetireRequested: "tokentrail.RetireRequested",
    CallStarted: "tokentrail.CallStarted",
}
_BODY_TYPES = {name: cls for cls, name in _BODY_NAMES.items()}
_BODY = object()
_UNBUILT = object()  # a reader schema not built yet (RecordCodec._readers)



Nested = Mapping[type, Mapping[str, Any]]

# Read-only: a module defining its own records passes ``with_nested(...)`` to its codecs instead.
_NESTED: Nested = MappingProxyType({
    CallFacts: {"dialect": Dialect, "version_spans": [VersionSpan], "tool_schema_digest": HEX,
                "system_prompt_digest": HEX, "opening_text_digests": HEXES},
    CallCaptured: {"facts": CallFacts, "parent_resolution": ParentResolution, "prompt_token_ids": U32,
                   "generation_token_ids": U32, "generation_log_probs": LOG_PROBS, "digest": HEX,
                   "parent_digest": HEX, "request_fingerprint": HEX, "continuation_fingerprint": HEX,
                   "continuation_context_digest": HEX},
    RolloutEvent: {"body": _BODY},
    SnapshotCall: {"call": CallCaptured},
    Snapshot: {"calls": [SnapshotCall], "incomplete_markers": [CallIncomplete], "finished": RolloutFinished},
    CallSpan: {"version_spans": [VersionSpan]},
    Trajectory: {"spans": [CallSpan], "token_ids": U32, "log_probs": F64},
    CaptureMetrics: {"terminal_attribution": TerminalAttribution},
    Trace: {"attachment": TraceAttachment, "trajectory": Trajectory, "mask_reasons": [MaskReason]},
    RebuiltRollout: {"mask_reasons": [MaskReason], "trajectory": Trajectory, "metrics": CaptureMetrics,
                     "traces": [Trace]},
})


def with_nested(extra: Nested) -> Nested:
    """The contract's conversion table plus ``extra`` (record types defined outside schemas, e.g. the
    processor's state records), as a new table: nothing global changes, so importing a module that
    defines records cannot alter how any other record converts."""
    return MappingProxyType({**_NESTED, **extra})


def wire_field_names(cls: type, table: Nested = _NESTED) -> list[str]:
    """The Avro field names of a record class: its fields, plus the wire-only fields of its packed
    log-probs (``generation_log_probs_f32``)."""
    narrow = [kind.narrow_field for kind in table.get(cls, {}).values() if isinstance(kind, LogProbs)]
    return [*_field_names(cls), *narrow]


@cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def to_avro(obj: Any, table: Nested = _NESTED) -> dict[str, Any]:
    """Plain Avro datum (dicts, lists, str) of a record; enums become their symbol.

    ``table`` says how nested fields convert (the contract's by default; see ``with_nested``).
    """
    cls: type = type(obj)
    nested = table.get(cls, {})
    out: dict[str, Any] = {}
    for name in _field_names(cls):
        value = getattr(obj, name)
        kind = nested.get(name)
        if kind is None or value is None:
            out[name] = value
        elif type(kind) is HashBytes:  # eight per call: tested first
            out[name] = kind.pack(value, cls, name)
        elif kind is _BODY:
            out[name] = (_BODY_NAMES[type(value)], to_avro(value, table))
        elif isinstance(kind, LogProbs):
            out[name], out[kind.narrow_field] = kind.pack_pair(value)
        elif isinstance(kind, Packed):
            out[name] = kind.pack(value)
        elif isinstance(kind, list):
            out[name] = [to_avro(v, table) for v in value]
        elif isinstance(kind, type) and issubclass(kind, StrEnum):
            out[name] = str(value)
        else:
            out[name] = to_avro(value, table)
    return out


def from_avro(cls: type[T], datum: dict[str, Any], table: Nested = _NESTED) -> T:
    """Record of type ``cls`` from a decoded Avro datum (the inverse of ``to_avro``)."""
    nested = table.get(cls)
    if nested:
        datum = dict(datum)
        for name, kind in nested.items():
            value = datum.get(name)
            if value is None:
                continue
            if kind is _BODY:
                type_name, body = value
                datum[name] = from_avro(_BODY_TYPES[type_name], body, table)
            elif isinstance(kind, LogProbs):
                datum[name] = kind.unpack_pair(value, datum.pop(kind.narrow_field, b""))
            elif isinstance(kind, Packed):
                datum[name] = kind.unpack(value)
            elif isinstance(kind, HashBytes):
                datum[name] = kind.unpack(value)
            elif isinstance(kind, list):
                datum[name] = [from_avro(kind[0], v, table) for v in value]
            elif isinstance(kind, type) and issubclass(kind, StrEnum):
                datum[name] = kind(value)
            else:
                datum[name] = from_avro(kind, value, table)
    return cls(**datum)


def _fingerprint_of(parsed: Any) -> bytes:
    # fastavro's CRC-64-AVRO hex is already in wire (little-endian) byte order.
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))


class RecordCodec(Generic[T]):
    """Encoder/decoder of one top-level record type (event, snapshot, rebuilt).

    ``nested`` is the conversion table of its nested fields: the contract's by default; a record
    type defined outside schemas passes ``with_nested({...})`` (explicit, never registered globally).
    """

    def __init__(self, cls: type[T], schema_name: str, supported_version: int, *, nested: Nested = _NESTED) -> None:
        self.cls = cls
        self.nested = nested
        self.schema_name = schema_name
        self.supported_version = supported_version
        with resources.as_file(schema_dir() / f"tokentrail.{schema_name}.avsc") as path:
            # A record's schema file parses to a dict.
            self.schema = cast(dict[str, Any], load_schema(str(path)))
        self.fingerprint = _fingerprint_of(self.schema)
        self._writers: dict[bytes, Any] = {self.fingerprint: self.schema}
        for old in archived_writers(schema_name):
            self._writers.setdefault(_fingerprint_of(old), old)
        # The reader schema each writer's records resolve to: none for the current writer; an archived
        # writer's is built on its first record (``schemas.writer_history.reader_for``), so a process
        # that only encodes (the interceptor) never builds one.
        self._readers: dict[bytes, Any] = {self.fingerprint: None}
        self._header = MAGIC + self.fingerprint

    def encode(self, record: T) -> bytes:
        buf = io.BytesIO()
        buf.write(self._header)
        try:
            fastavro.schemaless_writer(buf, self.schema, to_avro(record, self.nested))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CodecError(f"cannot encode {self.schema_name}: {exc}") from exc
        return buf.getvalue()

    def decode_datum(self, data: bytes) -> dict[str, Any]:
        """Decoded Avro datum, after the magic, fingerprint and version checks."""
        if not isinstance(data, (bytes, bytearray, memoryview)) or bytes(data[:2]) != MAGIC:
            head = bytes(data[:12]).hex() if isinstance(data, (bytes, bytearray, memoryview)) else type(data).__name__
            raise CodecError(
                f"not an Avro single-object encoded {self.schema_name}: expected the marker c301, got {head!r}"
            )
        fp = bytes(data[2:_HEADER_LEN])
        writer = self._writers.get(fp)
        if writer is None:
            raise SchemaVersionError(
                f"{self.schema_name} written with unknown schema fingerprint {fp.hex()}: it was probably "
                "written by a newer tokentrail; upgrade the reader (pip install -U tokentrail)"
            )
        reader = self._readers.get(fp, _UNBUILT)
        if reader is _UNBUILT:
            reader = self._readers[fp] = reader_for(writer, self.schema, self.nested)
        body = io.BytesIO(bytes(data[_HEADER_LEN:]))
        try:
            # A record schema decodes to a dict.
            datum = cast(dict[str, Any], fastavro.schemaless_reader(
                body,
                writer,
                reader,
                return_record_name=True,
                return_record_name_override=True,
            ))
        except Exception as exc:  # fastavro raises many types on truncated/corrupt input
            raise CodecError(f"corrupt {self.schema_name} body ({type(exc).__name__}: {exc})") from exc
        # The body must be consumed exactly: bytes after it would be carried along wherever encoded
        # bytes are copied as is (the fold stores an event's body bytes and splices them into the
        # snapshot), producing a record no reader can decode. The position check costs nothing.
        trailing = len(data) - _HEADER_LEN - body.tell()
        if trailing:
            raise CodecError(
                f"{self.schema_name}{_identity(datum)} has {trailing} byte(s) after its Avro body: a single-object "
                "encoded record holds exactly one record (C3 01, fingerprint, body) and nothing after it; the "
                "writer appended data or concatenated records: publish each record alone, as "
                "schemas.codec's encoders write it"
            )
        version = datum.get("schema_version")
        if isinstance(version, int) and version > self.supported_version:
            raise SchemaVersionError(
                f"{self.schema_name} has schema_version {version}, newer than the {self.supported_version} this "
                "reader supports; upgrade the reader (pip install -U tokentrail) before consuming it"
            )
        return datum

    def decode(self, data: bytes) -> T:
        datum = self.decode_datum(data)
        try:
            return from_avro(self.cls, datum, self.nested)
        except (TypeError, ValueError) as exc:
            raise CodecError(f"{self.schema_name} violates the contract: {exc}") from exc


def _identity(datum: Any) -> str:
    """`` <field> <value>`` naming a decoded record in an error (its event, snapshot or rollout id), or ``""``."""
    if isinstance(datum, dict):
        for name in ("event_id", "snapshot_id", "rollout_id"):
            value = datum.get(name)
            if isinstance(value, str):
                return f" {name} {value[:80]!r}"
    return ""


@cache
def event_codec() -> RecordCodec[RolloutEvent]:
    return RecordCodec(RolloutEvent, "RolloutEvent", EVENT_SCHEMA_VERSION)


@cache
def snapshot_codec() -> RecordCodec[Snapshot]:
    return RecordCodec(Snapshot, "Snapshot", SNAPSHOT_SCHEMA_VERSION)


@cache
def rebuilt_codec() -> RecordCodec[RebuiltRollout]:
    return RecordCodec(RebuiltRollout, "RebuiltRollout", REBUILT_SCHEMA_VERSION)


def encode_event(event: RolloutEvent) -> bytes:
    return event_codec().encode(event)


def decode_event(data: bytes) -> RolloutEvent:
    return event_codec().decode(data)


def encode_snapshot(snapshot: Snapshot) -> bytes:
    return snapshot_codec().encode(snapshot)


def decode_snapshot(data: bytes) -> Snapshot:
    return snapshot_codec().decode(data)


def encode_rebuilt(rollout: RebuiltRollout) -> bytes:
    return rebuilt_codec().encode(rollout)


def decode_rebuilt(data: bytes) -> RebuiltRollout:
    return rebuilt_codec().decode(data)


@cache
def policy_version_codec() -> RecordCodec[PolicyVersion]:
    """The codec of the policy-versions topic's records (``schemas.policy_versions.PolicyVersion``)."""
    return RecordCodec(PolicyVersion, "PolicyVersion", 1)
