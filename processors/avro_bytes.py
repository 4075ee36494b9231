"""Avro primitives by hand for the fold's hot path: what ``schemas.codec``'s ``avro_long``/``avro_string``/
``read_long``/``read_string`` do, faster for the small values a fold writes and reads (pure).

Every event writes a header and a stored-call prefix (a dozen small longs and a few 64-character hex
digests) and reads one or two prefixes back. ``long_bytes`` returns the encoding of a long from a
table for -64..8191 (one or two bytes: counters, sequence numbers, lengths of ids and digests) and
``schemas.event_bytes.avro_long`` above it; ``read_long``/``read_str`` inline the one- and two-byte cases.
The same bytes and values as ``schemas.codec`` (a test compares them over the whole table and
beyond it), so the state stays plain Avro.
"""

from __future__ import annotations

from schemas.event_bytes import avro_long
from schemas.event_bytes import read_long as _read_long_any

_LOW, _HIGH = -64, 8192
_TABLE = tuple(avro_long(n) for n in range(_LOW, _HIGH))


def long_bytes(n: int) -> bytes:
    """``schemas.event_bytes.avro_long(n)``."""
    if _LOW <= n < _HIGH:
        return _TABLE[n - _LOW]
    return avro_long(n)


def str_bytes(s: str) -> bytes:
    """``schemas.event_bytes.avro_string(s)``."""
    raw = s.encode()
    n = len(raw)
    return (_TABLE[n - _LOW] if n < _HIGH else avro_long(n)) + raw


def read_long(data: bytes, pos: int) -> tuple[int, int]:
    """``schemas.event_bytes.read_long(data, pos)``: (value, next position)."""
    byte = data[pos]
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), pos + 1
    second = data[pos + 1]
    if second < 0x80:
        n = (byte & 0x7F) | (second << 7)
        return (n >> 1) ^ -(n & 1), pos + 2
    return _read_long_any(data, pos)


def read_str(data: bytes, pos: int) -> tuple[str, int]:
    """``schemas.event_bytes.read_string(data, pos)``: (value, next position)."""
    length, pos = read_long(data, pos)
    end = pos + length
    return data[pos:end].decode(), end
