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
import json
import sys
from array import array
from collections.abc import Mapping
from enum import StrEnum
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any, Generic, TypeVar, cast

import fastavro
from fastavro.schema import fingerprint, load_schema, parse_schema, to_parsing_canonical_form

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


class _Packed:
    """A list of numbers carried as Avro ``bytes``: little-endian, fixed width (see the .avsc docs)."""

    def __init__(self, typecode: str) -> None:
        self.typecode = typecode

    def pack(self, values: Any) -> bytes:
        try:
            packed = array(self.typecode, values)
        except (OverflowError, TypeError) as exc:
            kind = "token ids must be integers in [0, 2**32)" if self.typecode == "I" else "log-probs must be floats"
            raise CodecError(f"cannot pack values: {kind} ({exc})") from exc
        if _BIG_ENDIAN:
            packed.byteswap()
        return packed.tobytes()

    def unpack(self, data: bytes) -> list[Any]:
        values = array(self.typecode)
        values.frombytes(data)
        if _BIG_ENDIAN:
            values.byteswap()
        return values.tolist()


class _LogProbs(_Packed):
    """A call's log-probs on the wire: float32 when every value survives the round trip, else float64.

    vLLM computes log-probs in float32 and returns them as the doubles those floats are, so its
    values always narrow losslessly (4 bytes per generated token instead of 8); any other value
    (a float64 engine, a rescaled log-prob) keeps all 64 bits. The record holds the same doubles
    either way. Two Avro ``bytes`` fields carry them, the wide one under the record's field name
    and the narrow one under ``narrow_field``; at most one is non-empty. A reader that predates the
    narrow field sees no log-probs for a call's tokens and refuses the record (the contract's
    one-log-prob-per-token check): it fails closed, never misreads float32 as float64.
    """

    narrow_typecode = "f"

    def __init__(self, narrow_field: str) -> None:
        super().__init__("d")
        self.narrow_field = narrow_field

    def pack_pair(self, values: Any) -> tuple[bytes, bytes]:
        """``(wide, narrow)``: the float64 bytes or the float32 bytes of ``values``, the other empty."""
        try:
            narrow = array("f", values)
        except TypeError as exc:
            raise CodecError(f"cannot pack values: log-probs must be floats ({exc})") from exc
        # Exact equality, value by value (a NaN never equals itself, so it stays wide; -0.0 narrows to -0.0).
        if narrow.tolist() == (values if type(values) is list else list(values)):
            if _BIG_ENDIAN:
                narrow.byteswap()
            return b"", narrow.tobytes()
        return self.pack(values), b""

    def unpack_pair(self, wide: bytes, narrow: bytes) -> list[float]:
        if narrow and wide:
            raise CodecError(
                f"log-probs carried twice ({len(wide)} bytes as float64 and {len(narrow)} as float32 in "
                f"{self.narrow_field}): a writer sets exactly one; re-encode the record with schemas.codec")
        if not narrow:
            return self.unpack(wide)
        values = array("f")
        try:
            values.frombytes(narrow)
        except ValueError as exc:
            raise CodecError(f"{self.narrow_field} holds {len(narrow)} bytes, not a whole number of float32 "
                             "values; re-encode the record with schemas.codec") from exc
        if _BIG_ENDIAN:
            values.byteswap()
        return values.tolist()


class HashBytes:
    """A hash carried as Avro ``bytes``: its raw bytes on the wire, lowercase hex in the record.

    A SHA-256 digest takes 33 bytes instead of 65 (issue 24: the fixed per-call facts). The record
    keeps the hex string every process compares, logs and hashes, so nothing but the codec sees the
    change. Only lowercase hex is accepted: it is what ``.hex()`` gives back, so a record decodes to
    exactly what was encoded (an upper-case or odd-length value is refused, never rewritten).
    Writers that predate the binary form wrote these fields as Avro strings; their records are read
    with a reader schema that keeps the string (``_reader_for``), and the string is the value.
    ``many``: an array of hashes.
    """

    def __init__(self, *, many: bool = False) -> None:
        self.many = many
        self.item = HashBytes() if many else None  # how each element of an array of hashes converts

    def pack(self, value: Any, cls: type, name: str) -> Any:
        try:
            if self.many:
                many = [bytes.fromhex(v) for v in value]
                if [r.hex() for r in many] == value:
                    return many
            else:
                one = bytes.fromhex(value)
                if one.hex() == value:
                    return one
        except (TypeError, ValueError):
            pass
        raise CodecError(f"{cls.__name__}.{name} must be a hash as lowercase hex (even length, 0-9a-f) or empty, "
                         f"got {value!r:.80}: compute it with schemas.hashing")

    def unpack(self, value: Any) -> Any:
        if self.many:
            return [v if type(v) is str else v.hex() for v in value]
        return value if type(value) is str else value.hex()


_BIG_ENDIAN = sys.byteorder == "big"
_U32 = _Packed("I")
_F64 = _Packed("d")
_LOG_PROBS = _LogProbs("generation_log_probs_f32")
_HEX = HashBytes()
_HEXES = HashBytes(many=True)
assert array("I").itemsize == 4 and array("d").itemsize == 8 and array("f").itemsize == 4

Nested = Mapping[type, Mapping[str, Any]]

# Read-only: a module defining its own records passes ``with_nested(...)`` to its codecs instead.
_NESTED: Nested = MappingProxyType({
    CallFacts: {"dialect": Dialect, "version_spans": [VersionSpan], "tool_schema_digest": _HEX,
                "system_prompt_digest": _HEX, "opening_text_digests": _HEXES},
    CallCaptured: {"facts": CallFacts, "parent_resolution": ParentResolution, "prompt_token_ids": _U32,
                   "generation_token_ids": _U32, "generation_log_probs": _LOG_PROBS, "digest": _HEX,
                   "parent_digest": _HEX, "request_fingerprint": _HEX, "continuation_fingerprint": _HEX,
                   "continuation_context_digest": _HEX},
    RolloutEvent: {"body": _BODY},
    SnapshotCall: {"call": CallCaptured},
    Snapshot: {"calls": [SnapshotCall], "incomplete_markers": [CallIncomplete], "finished": RolloutFinished},
    CallSpan: {"version_spans": [VersionSpan]},
    Trajectory: {"spans": [CallSpan], "token_ids": _U32, "log_probs": _F64},
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


def packed_log_probs(values: Any) -> bytes:
    """The bytes a call's log-probs take on the wire (float32 when lossless, else float64; see ``_LogProbs``)."""
    wide, narrow = _LOG_PROBS.pack_pair(values)
    return wide or narrow


def wire_field_names(cls: type, table: Nested = _NESTED) -> list[str]:
    """The Avro field names of a record class: its fields, plus the wire-only fields of its packed
    log-probs (``generation_log_probs_f32``)."""
    narrow = [kind.narrow_field for kind in table.get(cls, {}).values() if isinstance(kind, _LogProbs)]
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
        elif isinstance(kind, _LogProbs):
            out[name], out[kind.narrow_field] = kind.pack_pair(value)
        elif isinstance(kind, _Packed):
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
            elif isinstance(kind, _LogProbs):
                datum[name] = kind.unpack_pair(value, datum.pop(kind.narrow_field, b""))
            elif isinstance(kind, _Packed):
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


def _schema_dir() -> Any:
    return resources.files("schemas") / "avro"


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
        with resources.as_file(_schema_dir() / f"tokentrail.{schema_name}.avsc") as path:
            # A record's schema file parses to a dict.
            self.schema = cast(dict[str, Any], load_schema(str(path)))
        self.fingerprint = _fingerprint_of(self.schema)
        self._writers: dict[bytes, Any] = {self.fingerprint: self.schema}
        for old in _history(schema_name):
            self._writers.setdefault(_fingerprint_of(old), old)
        # The reader schema each writer's records resolve to: none for the current writer; an archived
        # writer's is built on its first record (``_reader_for``), so a process that only encodes (the
        # interceptor) never builds one.
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
            reader = self._readers[fp] = _reader_for(writer, self.schema, self.nested)
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


_UNBUILT = object()


def _reader_for(writer: Any, current: Any, table: Nested) -> Any:
    """The reader schema for records of an archived ``writer``: ``current``, except that a hash field
    (``HashBytes``) the writer wrote as an Avro string is read as one.

    Avro would promote such a string to ``bytes``, and the 64 ASCII bytes of a hex digest are not
    its 32 raw bytes: reading them as a string gives the value the record holds, unchanged.
    """
    hexed = {cls.__name__: {name for name, kind in kinds.items() if isinstance(kind, HashBytes)}
             for cls, kinds in table.items()}
    written = _record_fields(writer)
    changed = False

    def copy(node: Any) -> Any:
        nonlocal changed
        if isinstance(node, list):
            return [copy(n) for n in node]
        if not isinstance(node, dict):
            return node
        out = {k: copy(v) for k, v in node.items() if not k.startswith("__")}  # fastavro's parse marks
        if out.get("type") == "record":
            short = out["name"].rsplit(".", 1)[-1]
            for f in out["fields"]:
                old = written.get(short, {}).get(f["name"]) if f["name"] in hexed.get(short, ()) else None
                if old == "string" or (isinstance(old, dict) and old.get("items") == "string"):
                    f["type"], changed = old, True
        return out

    reader = copy(current)
    return parse_schema(reader) if changed else current


def _record_fields(schema: Any) -> dict[str, dict[str, Any]]:
    """Every record defined in ``schema``: {short name: {field name: its Avro type}}."""
    found: dict[str, dict[str, Any]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for n in node:
                walk(n)
        elif isinstance(node, dict):
            kind = node.get("type")
            if kind == "record":
                found.setdefault(node["name"].rsplit(".", 1)[-1], {f["name"]: f["type"] for f in node["fields"]})
                for f in node["fields"]:
                    walk(f["type"])
            elif kind == "array":
                walk(node["items"])
            elif kind == "map":
                walk(node["values"])
            elif isinstance(kind, (dict, list)):
                walk(kind)

    walk(schema)
    return found


def _history(schema_name: str) -> list[Any]:
    """Every archived writer schema of ``schema_name`` (schemas/avro/history/<name>.*.json)."""
    out = []
    for entry in (_schema_dir() / "history").iterdir():
        if entry.name.startswith(f"{schema_name}.") and entry.name.endswith(".json"):
            out.append(parse_schema(json.loads(entry.read_text())))
    return out


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


# Avro primitives by hand, for hot paths that splice or peek at encoded bytes.

def avro_long(n: int) -> bytes:
    """Avro int/long: zig-zag varint."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def avro_string(s: str) -> bytes:
    raw = s.encode()
    return avro_long(len(raw)) + raw


def read_long(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """One zig-zag varint at ``pos``: (value, next position)."""
    shift = result = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def read_string(data: bytes | memoryview, pos: int) -> tuple[str, int]:
    length, pos = read_long(data, pos)
    return bytes(data[pos : pos + length]).decode(), pos + length


def decode_event_with_body(data: bytes) -> tuple[RolloutEvent, bytes]:
    """The decoded event and its body bytes (``event_body_bytes``), from one strict decode.

    ``decode_event`` refuses a record whose Avro body is not consumed exactly,
    so the bytes returned are exactly one encoded body (a ``CallCaptured``, ...)
    of the current writer schema and nothing else: safe to store and to splice
    as they are (the fold stores a call's body bytes; the snapshot splices them).
    """
    return decode_event(data), event_body_bytes(data)


def event_body_bytes(data: bytes) -> bytes:
    """The Avro bytes of an encoded event's body (its payload without the envelope).

    Two events carrying the same call have equal body bytes whatever their event
    ids, so the fold hashes these to tell a duplicate from a conflicting payload.
    For events from an archived (older) writer schema the body is re-encoded.
    It reads the envelope only and returns the rest of ``data``: only for bytes
    ``decode_event`` accepted (``decode_event_with_body`` does both), since bytes
    after the body, which ``decode_event`` refuses, would be returned with it.
    """
    c = event_codec()
    if bytes(data[2:_HEADER_LEN]) != c.fingerprint:
        ev = decode_event(data)
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, c.schema, to_avro(ev))
        return event_body_bytes(c._header + buf.getvalue())
    pos = _HEADER_LEN
    for _ in range(2):  # event_id, rollout_id
        length, pos = read_long(data, pos)
        pos += length
    _, pos = read_long(data, pos)  # emitted_at
    length, pos = read_long(data, pos)  # source
    pos += length
    _, pos = read_long(data, pos)  # schema_version
    _, pos = read_long(data, pos)  # union branch
    return bytes(data[pos:])


def event_id_of(data: bytes) -> str:
    """The event id of an encoded event, read from the envelope without decoding the body."""
    if bytes(data[2:_HEADER_LEN]) != event_codec().fingerprint:
        return decode_event(data).event_id
    length, pos = read_long(data, _HEADER_LEN)
    return bytes(data[pos : pos + length]).decode()


@cache
def policy_version_codec() -> RecordCodec[PolicyVersion]:
    """The codec of the policy-versions topic's records (``schemas.policy_versions.PolicyVersion``)."""
    return RecordCodec(PolicyVersion, "PolicyVersion", 1)
