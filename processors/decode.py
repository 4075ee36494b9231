"""Decoding a rollout event for the fold: ``decode_event_with_body``, without its costly parts (pure).

The fold decodes every event it folds. ``schemas.event_bytes.decode_event_with_body``
reads the envelope twice (once to decode, once to find the body bytes), has
fastavro build a dict of every field and then ``from_avro`` build the records
from it through keyword arguments, unpacking each token array into a list of
ints. Most of that the fold never reads: a capture is stored as the body bytes
it arrived as, and its token arrays are read for their lengths (and a full
prompt's prefix, when the fold resolves its parent).

``decode_for_fold(value)`` returns what ``decode_event_with_body(value)``
returns for the one event that is most of a rollout, a ``CallCaptured`` of the
current writer schema, at a fraction of the cost: the envelope is read by
hand, once, which also gives the body's offset; the body is read by a reader
compiled from the CallCaptured schema (``processors.avro_reader``: every field
read and checked, the records built directly, their ``__post_init__`` run),
whose token arrays are read-only views over the event's bytes.

Equivalence: for any bytes, it returns the same event (field for field, token
values included) and the same body bytes as ``decode_event_with_body``, or
raises exactly what that raises: anything but the fast case (another body, an
archived writer schema, a big-endian host, a schema the reader cannot mirror)
and anything the fast path does not accept is handed to
``decode_event_with_body`` itself. A test compares the two over valid,
mutated and truncated events.
"""

from __future__ import annotations

import sys
from functools import cache

from processors.avro_reader import Reader, Unsupported, compile_reader, long_at
from schemas.codec import MAGIC, event_codec
from schemas.event_bytes import decode_event_with_body
from schemas.records import EVENT_SCHEMA_VERSION, CallCaptured, RolloutEvent

_HEADER_LEN = 10  # magic + 8-byte writer schema fingerprint
_ENVELOPE = ("event_id", "rollout_id", "emitted_at", "source", "schema_version", "body")
_EVENT_FIELDS = ("event_id", "rollout_id", "emitted_at", "source", "body", "schema_version")


class _Plan:
    """The current writer schema's fingerprint, CallCaptured's union branch and its compiled reader."""

    def __init__(self, fingerprint: bytes, branch: int, read: Reader) -> None:
        self.fingerprint, self.branch, self.read = fingerprint, branch, read


@cache
def _plan() -> _Plan | None:
    """None where the fast path does not apply: the full decode then serves every event."""
    schema = event_codec().schema
    if sys.byteorder != "little" or tuple(f["name"] for f in schema["fields"]) != _ENVELOPE:
        return None  # packed arrays are little-endian; the envelope is read by hand in this order
    body = schema["fields"][-1]["type"]
    names = [b if isinstance(b, str) else b["name"] for b in body]
    if "tokentrail.CallCaptured" not in names:
        return None
    try:
        read = compile_reader("tokentrail.CallCaptured", schema["__named_schemas"], CallCaptured)
    except Unsupported:
        return None  # the schema and the records disagree (a contract change in progress)
    return _Plan(event_codec().fingerprint, names.index("tokentrail.CallCaptured"), read)


def decode_for_fold(value: bytes) -> tuple[RolloutEvent, bytes]:
    """``decode_event_with_body(value)``, faster for a current CallCaptured event (see the module docstring)."""
    fast = _fast(value) if type(value) is bytes else None
    return fast if fast is not None else decode_event_with_body(value)


def _fast(value: bytes) -> tuple[RolloutEvent, bytes] | None:
    plan = _plan()
    if plan is None or value[:2] != MAGIC or value[2:_HEADER_LEN] != plan.fingerprint:
        return None
    view = memoryview(value)
    size = len(value)
    try:
        # The envelope: event_id, rollout_id (strings), emitted_at (long), source (string),
        # schema_version (int), the body's union branch (int); strings of at most 63 bytes inline.
        strings: list[str] = []
        pos = _HEADER_LEN
        for _ in range(2):
            n = value[pos]
            if n < 128 and not n & 1:
                n, pos = n >> 1, pos + 1
            else:
                n, pos = _varint(value, pos)
            end = pos + n
            if n < 0 or end > size:
                return None
            strings.append(str(view[pos:end], "utf-8"))
            pos = end
        emitted_at, pos = _varint(value, pos)
        source, pos = _string(value, view, pos)
        schema_version, pos = _varint(value, pos)
        branch, pos = _varint(value, pos)
        if branch != plan.branch or schema_version > EVENT_SCHEMA_VERSION:
            return None
        start = pos
        call, pos = plan.read(value, view, pos)
    except Exception:  # Unsupported, or bytes the reader cannot read: the full decode decides and says why
        return None
    if pos != size:
        return None  # bytes after the body: the full decode refuses them
    event = object.__new__(RolloutEvent)
    for name, field_value in zip(_EVENT_FIELDS, (strings[0], strings[1], emitted_at, source, call, schema_version)):
        object.__setattr__(event, name, field_value)
    return event, value[start:]


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    byte = data[pos]
    if byte < 128:
        return (byte >> 1) ^ -(byte & 1), pos + 1
    return long_at(data, pos)


def _string(data: bytes, view: memoryview, pos: int) -> tuple[str, int]:
    length, pos = _varint(data, pos)
    end = pos + length
    if length < 0 or end > len(data):
        raise Unsupported("truncated string")
    return str(view[pos:end], "utf-8"), end
