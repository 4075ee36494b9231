"""Encoded events read and written by hand: Avro varints and strings, an event's body bytes and id (pure).

For hot paths that splice or peek at encoded bytes instead of decoding them (the fold stores a
call's body bytes as they arrived and splices them into the snapshot; the spool and replay read an
event's id from its envelope). Every function here reads or writes exactly what ``schemas.codec``'s
fastavro encoding does; the codec is the reference, these are its shortcuts.
"""

from __future__ import annotations

import io

import fastavro

from schemas.codec import MAGIC, decode_event, event_codec, to_avro
from schemas.records import RolloutEvent

__all__ = ["HEADER_LEN", "avro_long", "avro_string", "decode_event_with_body", "event_body_bytes", "event_id_of",
           "read_long", "read_string"]

HEADER_LEN = len(MAGIC) + 8  # the single-object marker and the writer schema's fingerprint


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
    if bytes(data[2:HEADER_LEN]) != c.fingerprint:
        ev = decode_event(data)
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, c.schema, to_avro(ev))
        return event_body_bytes(MAGIC + c.fingerprint + buf.getvalue())
    pos = HEADER_LEN
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
    if bytes(data[2:HEADER_LEN]) != event_codec().fingerprint:
        return decode_event(data).event_id
    length, pos = read_long(data, HEADER_LEN)
    return bytes(data[pos : pos + length]).decode()
